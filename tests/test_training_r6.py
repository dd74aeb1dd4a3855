"""Sixth data round (issue 8): the task-primed sampler's plan, its filter and the round file, on CPU."""
from __future__ import annotations

from collections import Counter

from engine.training import corpus, corpus_r5, corpus_r6


def test_opener_plan_shares_and_seed() -> None:
    plan = corpus_r6.opener_plan(1000, seed=1)
    assert len(plan) == 1000
    counts = Counter(kind for kind, _ in plan)
    assert counts == {kind: round(1000 * share) for kind, share, _ in corpus_r6.OPENERS}
    allowed = {kind: set(ops) for kind, _, ops in corpus_r6.OPENERS}
    assert all(op in allowed[kind] for kind, op in plan)
    assert len({op for _, op in plan}) > 50  # the openers of every type are drawn, not a few
    assert max(len(op.split()) for ops in allowed.values() for op in ops) < 8  # no benchmark 8-gram can come from one
    assert corpus_r6.opener_plan(1000, seed=1) == plan and corpus_r6.opener_plan(1000, seed=2) != plan
    assert [k for k, _ in plan[:50]] != sorted(k for k, _ in plan[:50])  # types interleaved, not in blocks


def test_primed_rows_keep_the_opener_and_filter_the_whole_turn() -> None:
    eos = 2
    dec = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    opener_ids = {"Write a": [100, 101], "Act as": [200]}
    plan = [("writing", "Write a"), ("roleplay", "Act as"), ("writing", "Write a"), ("roleplay", "Act as"),
            ("writing", "Write a")]
    samples = [list(range(10, 20)) + [eos],  # kept: "Write a" + 10 tokens
               list(range(30, 40)) + [eos],  # kept: "Act as" + 10 tokens
               list(range(50, 60)),  # never ended
               list(range(60, 72)) + [eos],  # a benchmark 8-gram that spans the opener
               None]  # not sampled (time budget)
    bench = corpus_r5.ngram_hashes(dec([200] + list(range(60, 67))))
    rows, stats = corpus_r6.primed_rows(plan, samples, opener_ids, eos, dec, bench)
    assert [r.prompt for r in rows] == [dec([100, 101] + list(range(10, 20))), dec([200] + list(range(30, 40)))]
    assert [r.source for r in rows] == ["primed:writing", "primed:roleplay"]
    assert all(r.kind == "primed" for r in rows) and len({r.id for r in rows}) == 2
    assert (stats["unended"], stats["bench"], stats["kept"]) == (2, 1, 2)
    assert stats["by_type"] == {"writing": 1, "roleplay": 1, "ask": 0}


def test_round_file_keeps_held_and_extra_rows_and_puts_older_rows_last() -> None:
    R = lambda i, k: corpus.PromptRow(f"{k}{i}", k, "", "", [i])  # noqa: E731
    held = [R(i, "code") for i in range(3)]
    # the earlier rounds' cache: held-out rows, then older chat/code and round 5's magpie/func rows mixed
    old = held + [R(0, "magpie"), R(3, "code"), R(1, "magpie"), R(0, "func"), R(2, "magpie"), R(1, "func"),
                  R(0, "chat"), R(2, "func")]
    new = [R(i, "primed") for i in range(4)]
    merged, counts = corpus_r6.round_file(old, new, 3, ["magpie", "func"], 2, seed=0)
    ids = [r.id for r in merged]
    assert ids[:3] == ["code0", "code1", "code2"]
    assert ids[3:9] == ["magpie0", "magpie1", "func0", "func1", "primed0", "primed1"]
    assert sorted(ids[9:13]) == ["func2", "magpie2", "primed2", "primed3"]
    assert ids[13:] == ["code3", "chat0"]
    assert counts == {"held": 3, "recent": {"magpie": 3, "func": 3}, "older": 2, "new": 4}
