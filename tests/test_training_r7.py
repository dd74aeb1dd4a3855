"""Seventh data round (issue 8): the shares, the dedupe across samplers and rounds, the round file, on CPU."""
from __future__ import annotations

from collections import Counter

from engine.training import corpus, corpus_r6, corpus_r7


def _row(i: int, kind: str, text: str = "") -> corpus.PromptRow:
    return corpus.PromptRow(f"{kind}{i}", kind, "", text, [i])


def test_opener_plan_takes_this_rounds_shares() -> None:
    plan = corpus_r6.opener_plan(1000, seed=71, shares=corpus_r7.SHARES)
    assert Counter(kind for kind, _ in plan) == {"writing": 450, "roleplay": 450, "ask": 100}
    assert corpus_r6.opener_plan(1000, seed=71) != plan  # round 6's own shares (500 / 400 / 100) without it
    assert Counter(k for k, _ in corpus_r6.opener_plan(1000, seed=71)) == {"writing": 500, "roleplay": 400, "ask": 100}
    assert corpus_r6.opener_plan(1000, seed=72, shares=corpus_r7.SHARES) != plan  # one seed per sampler


def test_primed_rows_take_the_samplers_id_prefix() -> None:
    dec = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    rows, _ = corpus_r6.primed_rows([("writing", "Write a")], [list(range(10, 20)) + [2]], {"Write a": [100]}, 2,
                                    dec, set(), id_prefix="p71")
    assert [r.id for r in rows] == ["p71-0"]


def test_dedupe_drops_repeats_of_earlier_rounds_and_of_other_samplers() -> None:
    seen = ["Write a poem about the sea.", "Act as a pirate captain who lost his ship at sea and tell me why"]
    a = [_row(0, "primed", "Write a poem about the sea!"),  # the same words as a seen turn
         _row(1, "primed", "Write a poem about the mountains."),  # new
         _row(2, "primed", "Act as a pirate captain who lost his ship at sea and now sells fish")]  # same 10 words
    b = [_row(3, "primed", "write a poem about the MOUNTAINS"),  # the other sampler's turn again
         _row(4, "primed", "Pretend you are a cat.")]  # new
    kept, stats = corpus_r7.dedupe_rounds([a, b], seen)
    assert [r.id for r in kept] == ["primed1", "primed4"]
    assert stats == {"in": 5, "dup_seen": 1, "dup": 1, "near_dup": 1, "kept": 2}


def test_round_file_keeps_every_extra_held_out_row_and_holds_none_of_the_new() -> None:
    held = [_row(i, "code") for i in range(3)]
    old = held + [_row(0, "magpie"), _row(3, "code"), _row(0, "func"), _row(1, "magpie"), _row(0, "primed"),
                  _row(1, "func"), _row(1, "primed"), _row(0, "chat"), _row(2, "primed")]
    new = [_row(10 + i, "primed") for i in range(4)]
    merged, counts = corpus_r7.round_file(old, new, 3, ["magpie", "func", "primed"], 1, seed=0)
    ids = [r.id for r in merged]
    assert ids[:3] == ["code0", "code1", "code2"]
    assert ids[3:6] == ["magpie0", "func0", "primed0"]  # round 5's and round 6's extra held-out rows, unchanged
    assert sorted(ids[6:14]) == ["func1", "magpie1", "primed1", "primed10", "primed11", "primed12", "primed13",
                                 "primed2"]
    assert ids[6:14] != ["magpie1", "func1", "primed1", "primed2", "primed10", "primed11", "primed12", "primed13"]
    assert ids[14:] == ["code3", "chat0"]
    # the job holds out the first rows of each kind after the held-out rows: round 6's primed row, not a new one
    assert [r.id for r in merged[3:] if r.kind == "primed"][0] == "primed0"
    assert counts == {"held": 3, "extra": 3, "older": 2, "recent": {"magpie": 2, "func": 2, "primed": 3}, "new": 4}
