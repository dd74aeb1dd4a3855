"""The tiny fixtures must behave like usable targets: varied greedy text, IR == HF."""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import tiny_models

PROMPT = "def fibonacci(n):"


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_greedy_text_is_varied(kind: str, request: pytest.FixtureRequest) -> None:
    tokens, margins = tiny_models.greedy_hf(request.getfixturevalue(f"tiny_{kind}_hf"), PROMPT, 48)
    assert len(set(tokens)) >= 24, tokens
    assert max(tokens.count(t) for t in set(tokens)) <= 8, tokens
    assert min(margins) > 1e-3, "near-tie: f32 noise could flip a greedy choice"


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_ir_greedy_matches_hf(kind: str, request: pytest.FixtureRequest) -> None:
    import openvino_genai

    hf_dir: Path = request.getfixturevalue(f"tiny_{kind}_hf")
    ir_dir: Path = request.getfixturevalue(f"tiny_{kind}_target")
    want, _ = tiny_models.greedy_hf(hf_dir, PROMPT, 32)
    pipe = openvino_genai.LLMPipeline(
        str(ir_dir), "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32"
    )
    cfg = openvino_genai.GenerationConfig(max_new_tokens=32, ignore_eos=True, do_sample=False)
    tok = openvino_genai.Tokenizer(str(ir_dir))
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    got = pipe.generate(ids, cfg).tokens[0]
    assert list(got) == want
