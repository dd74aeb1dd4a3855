"""The DSpark / DFlash v2 fixtures: every kind is there in the folder contract, and the trained ones
are accepted often on their training prompts (torch reference decode, no engine involved)."""
from __future__ import annotations

from pathlib import Path

import openvino as ov
import pytest

torch = pytest.importorskip("torch")

from fixtures.tiny_variant_drafts import VARIANT_SPECS, load_torch_draft, single_thread  # noqa: E402

HEAD_FILES = {"openvino_markov_head_model.xml", "openvino_markov_head_dense_model.xml"}


def test_every_kind_is_exported(tiny_variant_drafts: dict[str, Path]) -> None:
    assert sorted(tiny_variant_drafts) == sorted(s.name for s in VARIANT_SPECS)
    for spec in VARIANT_SPECS:
        folder = tiny_variant_drafts[spec.name]
        files = {p.name for p in folder.iterdir()}
        rt = ov.Core().read_model(str(folder / "openvino_model.xml")).get_rt_info()
        variant = rt["dflash"]["variant"].value
        if spec.kind == "dspark":
            assert variant == "dspark"
            assert (files & HEAD_FILES) == (HEAD_FILES if spec.rank else set())
        else:
            assert variant == "dflash_v2"
            assert files & HEAD_FILES == {"openvino_markov_head_model.xml"}
        assert load_torch_draft(folder).cfg.block_size == spec.block_size


@pytest.mark.parametrize("name,modes,floor", [
    ("dspark_trained", ("none", "topk", "dense"), 2.0),
    ("dflash2_trained", ("none", "topk"), 3.0),
])
def test_trained_drafts_are_accepted(tiny_variant_drafts, tiny_qwen3_hf: Path, name: str, modes, floor: float) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.training.evaluate import simulate_acceptance
    from fixtures.tiny_drafts import prompt_ids

    tok = AutoTokenizer.from_pretrained(tiny_qwen3_hf)
    target = AutoModelForCausalLM.from_pretrained(tiny_qwen3_hf, dtype=torch.float32).eval()
    draft = load_torch_draft(tiny_variant_drafts[name])
    taus = {}
    with single_thread():
        for mode in modes:
            taus[mode] = simulate_acceptance(target, draft, prompt_ids(tok)[:4], 40, mode).tokens_per_round
    assert min(taus.values()) > 1.5, taus
    assert max(taus.values()) > floor, taus
