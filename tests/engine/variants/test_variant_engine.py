"""The engine drafts every DFlash-family variant and mode exactly as the torch references do, and
greedy speculative output stays the target's own (f32) with each of them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from engine.config import GenerationConfig
from engine.drafting.draft_batch import DraftCall
from engine.drafting.factory import make_draft_batch
from engine.drafting.selector import DraftJob, draft_candidates
from engine.models.draft import DraftModel, draft_compile_properties, read_draft_info
from engine.models.properties import compile_properties
from engine.models.paged_target import PagedTarget, SeqChunk
from engine.pipeline import SpeculativePipeline
from fixtures.distribution_check import assert_follows_target
from fixtures.tiny_variant_drafts import load_torch_draft

PROMPTS = ["def parse(text):\n    ", "import os\nclass Walker:\n", "for i in range(10):"]
# (draft, mode, K): "none" = argmax rows, "topk" = the Top-K candidate scorer, "dense" = the dense walk
MODES = [
    ("dspark_nohead", "none", 0),
    ("dspark_vanilla", "topk", 4), ("dspark_vanilla", "topk", 1), ("dspark_vanilla", "dense", 0),
    ("dspark_gated", "topk", 3), ("dspark_gated", "dense", 0),
    ("dflash2", "topk", 4), ("dflash2", "topk", 16),
    ("dspark_trained", "topk", 8), ("dspark_trained", "dense", 0), ("dflash2_trained", "topk", 8),
]


@pytest.fixture(scope="module")
def target_weights(tiny_qwen3_hf: Path) -> tuple[np.ndarray, np.ndarray]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_hf)
    return (model.get_input_embeddings().weight.detach().numpy(),
            model.get_output_embeddings().weight.detach().numpy())


def _reference(draft_dir: Path, weights, anchor: int, context: np.ndarray, n: int, mode: str, k: int) -> list[int]:
    import torch

    torch_draft = load_torch_draft(draft_dir)
    if "dflash2" in draft_dir.name:
        from engine.drafts.dflash2 import reference_walk
    else:
        from engine.drafts.dspark import reference_walk
    embed, head = (torch.from_numpy(w) for w in weights)
    with torch.no_grad():
        out = reference_walk(torch_draft, embed, head, anchor, torch.from_numpy(context), n, mode, k or None)
    return [int(t) for t in np.asarray(out).reshape(-1)]


@pytest.mark.parametrize("name,mode,k", MODES, ids=[f"{n}-{m}-{k}" for n, m, k in MODES])
def test_engine_candidates_equal_the_torch_reference(tiny_qwen3_target, tiny_variant_drafts, target_weights,
                                                     name: str, mode: str, k: int) -> None:
    core = ov.Core()
    props = compile_properties("CPU", "f32")
    info = read_draft_info(tiny_variant_drafts[name], core)
    target = PagedTarget(tiny_qwen3_target, core, "CPU", props, info.target_layer_ids, num_blocks=4)
    model = DraftModel(info, tiny_qwen3_target, core, "CPU", props)
    ids = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32").encode_prompt(PROMPTS[1], chat=False)
    target.blocks.grow(0, len(ids))
    out = target.infer([SeqChunk(0, ids, 0, 1)])
    anchor, context = int(out.next_ids[0][-1]), out.hidden[0].copy()
    n = min(5, info.max_candidates)
    (drafted,), _ = draft_candidates(make_draft_batch(model), [DraftJob(DraftCall(0, anchor, n, context), k)])
    got = drafted.tokens
    assert got == _reference(tiny_variant_drafts[name], target_weights, anchor, context, n, mode, k)


@pytest.mark.parametrize("name,mode,k", MODES, ids=[f"{n}-{m}-{k}" for n, m, k in MODES])
def test_greedy_speculative_equals_target_alone(tiny_qwen3_target, tiny_variant_drafts, name, mode, k) -> None:
    alone = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_variant_drafts[name], precision="f32")
    cfg = GenerationConfig(max_new_tokens=40, ignore_eos=True, markov_head_top_k=k if mode != "none" else None)
    for prompt in PROMPTS:  # requests one after another in one pipeline
        out = spec.generate(prompt, cfg, chat=False)
        assert out.token_ids == alone.generate(prompt, cfg, chat=False).token_ids
    if "trained" in name:
        assert out.metrics.tokens_per_step > 1.3, out.metrics.as_dict()
    if mode != "none":
        head_ms = out.metrics.markov_head_ms  # one entry per step; the last step drafts nothing
        assert head_ms and all(t > 0 for t in head_ms[:-1])


def test_trained_heads_beat_no_head(tiny_qwen3_target, tiny_variant_drafts) -> None:
    """The Markov walk conditions each candidate on the one before: more tokens per step than argmax rows."""
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_variant_drafts["dspark_trained"], precision="f32")
    per = {}
    for k in (8, 0):
        cfg = GenerationConfig(max_new_tokens=60, ignore_eos=True, markov_head_top_k=k)
        per[k] = np.mean([spec.generate(p, cfg, chat=False).metrics.tokens_per_step for p in PROMPTS])
    assert per[8] > 1.5 and per[0] > 1.5, per


@pytest.mark.parametrize("name,k", [("dspark_trained", 8), ("dspark_trained", 0), ("dflash2_trained", 8)])
def test_sampled_head_walks_keep_the_target_distribution(tiny_qwen3_target, tiny_variant_drafts, name, k) -> None:
    """Top-K scorer proposals (sparse over K) and dense-walk proposals verify exactly (see distribution_check)."""
    cfg = GenerationConfig(max_new_tokens=3, num_assistant_tokens=2, do_sample=True, ignore_eos=True,
                           temperature=0.7, markov_head_top_k=k)
    assert_follows_target(tiny_qwen3_target, tiny_variant_drafts[name], cfg)


def test_bad_head_settings_and_files_are_refused(tmp_path, tiny_qwen3_target, tiny_variant_drafts) -> None:
    import shutil

    from engine.errors import ModelFolderError

    v2 = SpeculativePipeline.load(tiny_qwen3_target, tiny_variant_drafts["dflash2"], precision="f32")
    with pytest.raises(ValueError, match="markov_head_top_k=0"):
        v2.add_request("x", GenerationConfig(markov_head_top_k=0))
    with pytest.raises(ValueError, match="markov_head_top_k"):
        v2.add_request("x", GenerationConfig(markov_head_top_k=10**7))
    broken = tmp_path / "no-head"
    shutil.copytree(tiny_variant_drafts["dspark_vanilla"], broken)
    for f in broken.glob("openvino_markov_head_model.*"):
        f.unlink()
    with pytest.raises(ModelFolderError, match="openvino_markov_head_model.xml"):
        SpeculativePipeline.load(tiny_qwen3_target, broken, precision="f32")


def test_dflash2_on_gpu_compiles_with_its_activations_scale_factor(tiny_variant_drafts) -> None:
    info = read_draft_info(tiny_variant_drafts["dflash2"])
    assert info.variant == "dflash_v2" and info.activations_scale_factor == 32.0
    gpu = draft_compile_properties(info, "GPU.0", {"ACTIVATIONS_SCALE_FACTOR": "8"})
    assert float(gpu["ACTIVATIONS_SCALE_FACTOR"]) == 32.0
    assert float(draft_compile_properties(info, "GPU", {"ACTIVATIONS_SCALE_FACTOR": "64"})["ACTIVATIONS_SCALE_FACTOR"]) == 64
    assert "ACTIVATIONS_SCALE_FACTOR" not in draft_compile_properties(info, "CPU", {})


@pytest.mark.parametrize("k", [8, 0])
def test_markov_walks_inside_a_tiny_sub_vocabulary(tmp_path, tiny_qwen3_target, tiny_variant_drafts, k) -> None:
    """A sub-vocabulary smaller than K (the Top-K is clamped to it) and the dense walk over -inf rows:
    candidates stay inside it and greedy output is still the target's own."""
    import json
    import shutil

    from engine.models.draft_vocab import VOCAB_FILE

    draft = tmp_path / "tiny-vocab"
    shutil.copytree(tiny_variant_drafts["dspark_trained"], draft)
    allowed = [3, 40, 41, 42]  # fewer ids than K = 8
    (draft / VOCAB_FILE).write_text(json.dumps({"ids": allowed}), encoding="utf-8")
    alone = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")
    spec = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    assert spec.draft.vocabulary is not None and len(spec.draft.vocabulary) == 4
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, markov_head_top_k=k)
    rid = spec.add_request(PROMPTS[0], cfg, chat=False)
    drafted = []
    while spec.has_unfinished():
        for ev in spec.step():
            drafted += ev.drafted
    assert drafted and set(drafted) <= set(allowed)
    assert spec.result(rid).token_ids == alone.generate(PROMPTS[0], cfg, chat=False).token_ids
