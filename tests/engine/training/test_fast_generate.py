"""The static-cache generator (engine.training.fast_generate) against HF generate on the tiny Llama, Qwen3
(q/k norms) and Qwen2 (q/k/v biases) targets."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.training import data as training_data
from engine.training.fast_generate import generate_answers_static


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen2"])
def test_static_generation_matches_hf_generate_in_float32(kind: str, request: pytest.FixtureRequest) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf_dir = request.getfixturevalue(f"tiny_{kind}_hf")
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(20, vocab, (int(n),), generator=g).tolist() for n in (3, 9, 14, 5, 22, 7, 11, 30, 2, 16)]
    eos = int(torch.randint(20, vocab, (1,), generator=g))
    for batch in (4, 10):  # left padding across lengths; compaction once rows finish
        ref = training_data.generate_answers_hf(model, prompts, 24, batch, eos, 0, log=lambda s: None)
        got = generate_answers_static(model, prompts, 24, batch, eos, 0, log=lambda s: None, dtype=torch.float32)
        assert got == ref
    # an EOS that the model actually emits: answers stop there (and compaction drops those rows)
    first = training_data.generate_answers_hf(model, prompts, 6, 10, -1, 0, log=lambda s: None)
    eos = first[0][2]
    ref = training_data.generate_answers_hf(model, prompts, 24, 10, eos, 0, log=lambda s: None)
    got = generate_answers_static(model, prompts, 24, 10, eos, 0, log=lambda s: None, dtype=torch.float32)
    assert got == ref and any(a[-1] == eos and len(a) < 24 for a in got)


def test_static_generation_bf16_runs_and_mostly_agrees(tiny_llama_hf: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_hf, torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(20, model.config.vocab_size, (int(n),), generator=g).tolist() for n in (4, 12, 8)]
    got = generate_answers_static(model, prompts, 12, 3, -1, 0, log=lambda s: None)
    assert [len(a) for a in got] == [12, 12, 12]
