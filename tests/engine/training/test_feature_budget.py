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
