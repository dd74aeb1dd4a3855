"""Qwen2.5-Coder-0.5B-Instruct (int8 IR from the split GGUF): the engine's target alone equals
openvino_genai's, the Qwen2 taps are found in the real graph, and drafts keep greedy output exact.

Exact properties pinned (f32 inference, f32 KV cache, no dynamic quantization), as for SmolLM2.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from engine.catalog import QWEN_CODER
from engine.config import GenerationConfig
from engine.pipeline import SpeculativePipeline

pytestmark = pytest.mark.qwen

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
           "def is_palindrome(s: str) -> bool:\n    \"\"\"Return True if s reads the same backwards.\"\"\"\n"]
SHIPPED = QWEN_CODER.shipped_drafts()


@pytest.fixture(scope="module")
def reference(qwen_target: Path) -> dict[str, list[int]]:
    alone = SpeculativePipeline.load(qwen_target, None, precision="f32")
    return {p: alone.generate(p, GenerationConfig(max_new_tokens=32)).token_ids for p in PROMPTS}


def test_target_alone_equals_openvino_genai(qwen_target: Path, reference) -> None:
    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(str(qwen_target), "CPU", INFERENCE_PRECISION_HINT="f32",
                                KV_CACHE_PRECISION="f32", DYNAMIC_QUANTIZATION_GROUP_SIZE="0")
    alone = SpeculativePipeline.load(qwen_target, None, precision="f32")
    for prompt, ours in reference.items():
        ids = alone.encode_prompt(prompt)
        res = pipe.generate(ov.Tensor(np.array([ids], np.int64)), ov_genai.GenerationConfig(max_new_tokens=32))
        eos = alone.tokenizer.eos_token_ids
        assert ours == [int(t) for t in res.tokens[0] if int(t) not in eos][: len(ours)]
    assert "def " in alone.tokenizer.decode(reference[PROMPTS[0]])


def test_qwen2_taps_are_found_in_the_real_graph(qwen_target: Path) -> None:
    """optimum does not annotate Qwen2: the exporter's search wrote it, and a fresh search agrees."""
    from engine.models import hidden_taps

    model = ov.Core().read_model(qwen_target / "openvino_model.xml")
    written = hidden_taps.read_annotation(model)
    assert written is not None and sorted(map(int, written["layers"])) == list(range(24))
    found = hidden_taps.search_decoder_layer_outputs(model, num_layers=24)
    assert hidden_taps.annotation_for(found) == model.get_rt_info(hidden_taps.RT_INFO_KEY).astype(str)
    assert all(out.get_partial_shape()[2].get_length() == 896 for out in found.values())


def test_speculative_with_random_draft_equals_target(qwen_target: Path, qwen_random_draft: Path, reference) -> None:
    spec = SpeculativePipeline.load(qwen_target, qwen_random_draft, precision="f32")
    for prompt, ref in reference.items():
        assert spec.generate(prompt, GenerationConfig(max_new_tokens=32)).token_ids == ref


@pytest.mark.parametrize("shipped", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_draft_is_exact_and_accepted(tmp_path: Path, qwen_target: Path, reference, shipped: Path) -> None:
    from engine.export.draft import export_draft

    draft = export_draft(shipped, tmp_path / "ov")
    spec = SpeculativePipeline.load(qwen_target, draft, precision="f32")
    steps = []
    for prompt, ref in reference.items():
        out = spec.generate(prompt, GenerationConfig(max_new_tokens=32))
        assert out.token_ids == ref
        steps.append(out.metrics.tokens_per_step)
    assert np.mean(steps) > 1.5, steps  # a trained draft must get tokens accepted
