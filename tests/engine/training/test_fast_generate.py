"""The static-cache generator (engine.training.fast_generate) against HF generate on the tiny Llama, Qwen3
(q/k norms) and Qwen2 (q/k/v biases) targets."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.training import data as training_data
from engine.training.fast_generate import StaticLlama, generate_answers_static


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


@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen2"])
def test_shape_fixed_decode_step_matches_the_growing_prefix_step(kind: str, request: pytest.FixtureRequest) -> None:
    """The step the GPU captures as a CUDA graph (whole cache, unwritten slots masked, keys written by
    index) computes what the growing-prefix step computes, step after step, rows of any padding."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(f"tiny_{kind}_hf"),
                                                 torch_dtype=torch.float32).eval()
    sm = StaticLlama(model, torch.float32)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(20, model.config.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 14, 5)]
    b, width, steps = len(prompts), max(map(len, prompts)), 12
    total = width + steps
    ids = torch.zeros((b, width), dtype=torch.long)
    ok = torch.zeros((b, total), dtype=torch.bool)
    for j, p in enumerate(prompts):
        ids[j, width - len(p):] = torch.tensor(p)
        ok[j, width - len(p):] = True
    pos = (torch.arange(width)[None] - (width - ok[:, :width].sum(1))[:, None]).clamp(min=0)

    def caches(fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (b, sm.n_kv, total, sm.head_dim)
        return [(torch.full(shape, fill), torch.full(shape, fill)) for _ in sm.layers]

    with torch.no_grad():
        grow, fixed = caches(float("nan")), caches(0.0)  # the growing step never reads an unwritten slot
        sm.forward(ids, pos, fixed, 0, ok)
        logits = sm.forward(ids, pos, grow, 0, ok)
        nxt = pos[:, -1] + 1
        for t in range(steps - 1):
            tok = logits.argmax(-1)
            logits = sm.forward(tok[:, None], nxt[:, None], grow, width + t, ok)
            other = sm.forward(tok[:, None], nxt[:, None], fixed, 0, ok, slot=torch.tensor([width + t]))
            assert torch.isfinite(logits).all()
            assert torch.allclose(logits, other, atol=1e-4, rtol=1e-4)
            assert torch.equal(logits.argmax(-1), other.argmax(-1))
            nxt = nxt + 1
