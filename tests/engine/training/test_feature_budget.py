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
