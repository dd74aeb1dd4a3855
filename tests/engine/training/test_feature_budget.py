"""The feature cap keeps every source in proportion (a prefix dropped the oldest sources whole)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.training.data import rows_within_feature_budget


@dataclass
class Row:
    id: str
    ids: list[int]
    kind: str


def _rows(kind: str, n: int) -> list[Row]:
    return [Row(f"{kind}{i}", [1] * 10, kind) for i in range(n)]


def test_a_binding_cap_keeps_every_source_in_proportion_and_the_order() -> None:
    rows = _rows("new", 500) + _rows("old", 500)          # newest sources first, as stage_rows orders them
    answers = {r.id: [2] * 10 for r in rows}
    gib = 400 * 20 / 2**30                                 # room for 400 rows of 20 tokens at 1 byte a token
    kept = rows_within_feature_budget([], rows, answers, gib, 1, log=lambda *_: None, seed=3)
    assert 395 <= len(kept) <= 400
    share_old = sum(r.kind == "old" for r in kept) / len(kept)
    assert 0.4 < share_old < 0.6
    assert [rows.index(r) for r in kept] == sorted(rows.index(r) for r in kept)
    assert kept == rows_within_feature_budget([], rows, answers, gib, 1, log=lambda *_: None, seed=3)


def test_rows_that_fit_are_all_kept() -> None:
    rows = _rows("a", 50)
    answers = {r.id: [2] * 10 for r in rows}
    assert rows_within_feature_budget(rows[:5], rows[5:], answers, 1.0, 1, log=lambda *_: None) == rows[5:]


def test_answering_stops_at_a_uniform_sample_once_the_features_are_full() -> None:
    from engine.training.data import answering_order, features_full

    held, rows = _rows("held", 5), _rows("new", 300) + _rows("old", 300)
    order = answering_order(held, rows, seed=1)
    assert order[:5] == held and sorted(r.id for r in order[5:]) == sorted(r.id for r in rows)
    assert order == answering_order(held, rows, seed=1) and order != answering_order(held, rows, seed=2)
    gib = 200 * 20 / 2**30                                 # room for 200 rows of 20 tokens at 1 byte a token
    answers: dict[str, list[int]] = {}
    answered = 0
    for c0 in range(0, len(order), 50):                    # as the pipeline answers: chunk by chunk
        if features_full(order[:c0], answers, gib, 1):
            break
        answers.update({r.id: [2] * 10 for r in order[c0: c0 + 50]})
        answered = c0 + 50
    assert answered == 250                                 # 205 rows fill it; the chunk that crossed is the last
    share_old = sum(r.kind == "old" for r in order[5:answered]) / (answered - 5)
    assert 0.35 < share_old < 0.65
    assert not features_full(order, {}, gib, 1) and not features_full(order, answers, 0, 1)


def test_online_features_are_the_stored_ones_computed_per_batch(tiny_qwen2_hf) -> None:
    """A stage with `features = "online"` trains on what a stored stage would hold, without the cap."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.training.data import build_flat_data

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_hf, torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(5)
    vocab = model.config.vocab_size
    prompts = [torch.randint(20, vocab, (int(n),), generator=g).tolist() for n in (3, 17, 9, 30, 5, 12, 21, 8)]
    answers = [torch.randint(20, vocab, (int(n),), generator=g).tolist() for n in (6, 2, 14, 9, 20, 1, 11, 4)]
    kinds = ["a", "b"] * 4
    quiet = lambda *_: None  # noqa: E731
    stored, s_stats = build_flat_data(model, prompts, answers, kinds, [0, 1], 64, log=quiet)
    online, o_stats = build_flat_data(model, prompts, answers, kinds, [0, 1], 64, log=quiet, online=True)
    assert online.features is None and o_stats["feature_gib"] == 0 and s_stats["feature_gib"] > 0
    assert o_stats["teacher_forced_agreement"] == s_stats["teacher_forced_agreement"]  # every row checked here
    for idx in (torch.tensor([3, 0, 6]), torch.arange(8)):  # 64 tokens a forward: the 8 rows take several
        t_s, f_s = stored.rows(idx)
        t_o, f_o = online.rows(idx)
        assert torch.equal(t_s, t_o)
        assert f_o.shape == f_s.shape and torch.allclose(f_o, f_s, rtol=1e-4, atol=1e-4)
        lens = torch.tensor([len(prompts[i]) + len(answers[i]) for i in idx.tolist()])
        assert not f_o[torch.arange(f_o.shape[1])[None, :] >= lens[:, None]].any()  # padding stays zero
    half, _ = build_flat_data(model, prompts, answers, kinds, [0, 1], 64, log=quiet, online=True,
                              online_dtype=torch.bfloat16)  # a GPU stage's: the target's forward under bf16 autocast
    _, f_s = stored.rows(torch.arange(8))
    _, f_h = half.rows(torch.arange(8))
    err = ((f_h - f_s).norm() / f_s.norm()).item()
    assert 0 < err < 0.05, err
    _, few = build_flat_data(model, prompts, answers, kinds, [0, 1], 64, log=quiet, online=True, check_positions=10)
    assert 10 <= few["checked_positions"] < s_stats["checked_positions"] == sum(map(len, answers))


def test_a_stage_may_ask_for_online_features_and_nothing_else(tmp_path) -> None:
    import pytest

    from engine.training.recipe import RecipeError, load_recipe

    base = '''name = "t"
variant = "dspark"
[[sources]]
name = "c"
type = "composed_chat"
count = 8
[[stages]]
name = "s"
sources = ["c"]
'''
    ok = tmp_path / "ok.toml"
    ok.write_text(base + 'data = { features = "online" }\n', encoding="utf-8")
    r = load_recipe(ok)
    assert r.stage_data(r.stages[0]).features == "online" and r.data.features == "stored"
    bad = tmp_path / "bad.toml"
    bad.write_text(base + 'data = { features = "disk" }\n', encoding="utf-8")
    with pytest.raises(RecipeError, match="features must be one of stored, online"):
        load_recipe(bad)
