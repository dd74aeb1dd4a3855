"""Sixth data round (issue 8): task-primed user turns for the chat shortfall, written by the target.

Round 5's Magpie turns (the target writes a user turn from an empty user slot) are mostly questions
and advice requests. The bench's chat set is MT-Bench's first twenty turns: writing tasks (posts,
emails, stories, edits) and role-play ("pretend to be...", "act as..."), where the target's answers
are its creative prose, the kind of text the draft knows least (replay τ 1.89 there against 2.68 on
held-out Magpie rows). This round primes the same sampler with the first words of a generic
instruction of those task types (``OPENERS``: common instruction verbs and persona openers of at
most six words; some, such as "Act as" or "Draft a", are also how MT-Bench turns begin: they name
the task types, and no benchmark 8-gram can come from them), so that the target writes user turns
of those kinds; the target's greedy answers to them are the new training rows (kind ``primed``).

The benchmark rule holds as in round 5: no prompt shares a word 8-gram with a HumanEval prompt or an
MT-Bench turn (hashes only travel, ``corpus_r5 bench-hashes``).

    python -m engine.training.corpus_r6 primed --target G --tokenizer DIR --n 20480 --base FILE ...   # GPU
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

from engine.training import corpus
from engine.training.corpus import PromptRow
from engine.training.corpus_r5 import (_answers_rows, add_sampler_args, filter_magpie, load_hashes, load_sampler,
                                        merge_round_file, sample_turns)

# (task type, share of the samples, openers). An opener is the start of the user's turn; the target writes the
# rest. Generic instruction openings (the verbs of self-instruct style task lists and common persona requests).
OPENERS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("writing", 0.50, (
        "Write a", "Write an", "Write a short story", "Write a poem", "Write a letter", "Write an email",
        "Write a blog post", "Write a speech", "Write a product description", "Write a review of",
        "Write a dialogue", "Write a paragraph", "Write an essay", "Write a cover letter", "Write a toast",
        "Compose a", "Draft a", "Draft an email", "Create a", "Create a story", "Craft a", "Describe",
        "Describe a day", "Rewrite this", "Rewrite the following sentence", "Edit my", "Proofread this",
        "Summarize", "Help me write", "Can you write", "Could you write", "I need a", "Give me a",
        "Generate a", "Come up with", "Outline", "Tell me a story", "Turn this")),
    ("roleplay", 0.40, (
        "Pretend you are", "Pretend to be", "Act as", "Act like", "Imagine you are", "Imagine that you",
        "You are a", "You are an", "Take on the role of", "Play the role of", "Let's play a game where",
        "Let's role-play", "Roleplay as", "From now on, you are", "Assume the role of", "I want you to act as",
        "Speak like", "Respond as if you were", "As a", "Be my", "Become", "Stay in character as",
        "You're a", "Channel your inner")),
    ("ask", 0.10, (
        "Explain", "How can I", "What are some", "Why do", "Give me tips", "Suggest", "Compare",
        "Plan", "What would happen if", "Teach me")),
)


def opener_plan(n: int, seed: int = 6, shares: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """n (task type, opener) pairs: each type gets its share of n (``OPENERS``' own unless `shares`
    names other ones), its openers drawn uniformly."""
    rng = random.Random(seed)
    share_of = {kind: (shares or {}).get(kind, share) for kind, share, _ in OPENERS}
    total = sum(share_of.values())
    plan: list[tuple[str, str]] = []
    for kind, _, openers in OPENERS:
        plan += [(kind, rng.choice(openers)) for _ in range(round(n * share_of[kind] / total))]
    rng.shuffle(plan)
    return plan[:n]


def primed_rows(plan: Sequence[tuple[str, str]], samples: Sequence[Sequence[int] | None],
                opener_ids: dict[str, list[int]], eos_id: int, decode: Any, bench: set[int], min_tokens: int = 8,
                max_tokens: int = 200, id_prefix: str = "pr") -> tuple[list[PromptRow], dict]:
    """Sampled continuations -> prompt rows (text = opener + continuation; ids PREFIX-i), filtered like
    round 5's Magpie turns (ended, length, no special-token text, dedupe, no benchmark 8-gram) on the
    whole turn."""
    full = [None if s is None else opener_ids[op] + list(s) for (_, op), s in zip(plan, samples)]
    texts, stats = filter_magpie(full, eos_id, decode, bench, min_tokens, max_tokens)
    by_text = {}
    for (kind, _), f in zip(plan, full):  # the task type of each kept text
        if f and f[-1] == eos_id:
            by_text.setdefault(decode(f[:-1]).strip(), kind)
    rows = [PromptRow(f"{id_prefix}-{i}", "primed", f"primed:{by_text.get(t, 'writing')}", t)
            for i, t in enumerate(texts)]
    stats["by_type"] = {k: sum(r.source == f"primed:{k}" for r in rows) for k, _, _ in OPENERS}
    return rows, stats


def split_base(old: Sequence[PromptRow], heldout: int,
               recent_kinds: Sequence[str]) -> tuple[list[PromptRow], list[list[PromptRow]], list[PromptRow]]:
    """An earlier rounds' answers cache, in its order: (the held-out rows, the rows of each recent kind,
    the older rows)."""
    rest = old[heldout:]
    return (list(old[:heldout]), [[r for r in rest if r.kind == k] for k in recent_kinds],
            [r for r in rest if r.kind not in recent_kinds])


def round_file(old: Sequence[PromptRow], new: Sequence[PromptRow], heldout: int, recent_kinds: Sequence[str],
               extra_per_kind: int, seed: int) -> tuple[list[PromptRow], dict]:
    """The round's ordered prompt file: the earlier rounds' held-out rows first (unchanged), then the
    extra held-out rows (the first `extra_per_kind` of each recent kind, in the base's order, so round
    5's extra rows stay the same; then of the new rows), then the recent and new training rows
    shuffled together, then the older rows (the feature cap trims those first)."""
    held, recent, older = split_base(old, heldout, recent_kinds)
    merged = merge_round_file(held, recent + [list(new)], extra_per_kind, older, seed)
    return merged, {"held": len(held), "recent": {k: len(b) for k, b in zip(recent_kinds, recent)},
                    "older": len(older), "new": len(new)}


def sample_primed(args: argparse.Namespace, shares: dict[str, float] | None = None,
                  id_prefix: str = "pr") -> tuple[list[PromptRow], dict]:
    """(GPU) The target's task-primed user turns: the opener plan sampled, filtered and tokenized
    (round 6's `primed`, and each of round 7's samplers with its own shares and row ids)."""
    t0 = time.time()
    tok, target, info, prefix, eos = load_sampler(args)
    plan = opener_plan(args.n, args.seed, shares)
    opener_ids = {op: list(tok(op, add_special_tokens=False)["input_ids"]) for _, _, ops in OPENERS for op in ops}
    samples = sample_turns(args, target, info, [prefix + opener_ids[op] for _, op in plan], eos, t0)
    t_gen = time.time() - t0
    bench = load_hashes(Path(args.bench_hashes)) if args.bench_hashes else set()
    rows, stats = primed_rows(plan, samples, opener_ids, eos, lambda ids: tok.decode(ids, skip_special_tokens=False),
                              bench, args.min_tokens, args.max_tokens, id_prefix)
    rows = corpus.tokenize_rows(tok, rows, args.max_prompt_tokens)
    stats.update(kept_after_prompt_length=len(rows), seconds_sampling=round(t_gen, 1),
                 prompt_tokens_mean=round(sum(len(r.ids) for r in rows) / max(1, len(rows)), 1))
    return rows, stats


def primed_main(args: argparse.Namespace) -> int:
    t0 = time.time()
    rows, stats = sample_primed(args)
    recent_kinds = [k for k in args.recent_kinds.split(",") if k]
    merged, counts = round_file(_answers_rows(Path(args.base)), rows, args.heldout, recent_kinds, args.extra_heldout,
                                args.seed)
    corpus.write_rows(merged, Path(args.out), with_text=False)
    if args.texts_out:
        corpus.write_rows(rows, Path(args.texts_out), with_text=True)
    stats.update(counts, merged=len(merged), seconds=round(time.time() - t0, 1))
    print(json.dumps({"primed": stats}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("primed", help="(GPU) sample task-primed user turns from the target, write the round's file")
    add_sampler_args(m, n=20480, max_new=200)
    m.add_argument("--base", required=True, help="answers cache of the earlier rounds (its first --heldout rows "
                                                 "stay first)")
    m.add_argument("--heldout", type=int, default=256)
    m.add_argument("--recent-kinds", default="magpie,func",
                   help="kinds of the base that go with the new rows (their first --extra-heldout rows stay the "
                        "extra held-out set), ahead of the older rows")
    m.add_argument("--extra-heldout", type=int, default=64)
    m.add_argument("--out", required=True)
    m.add_argument("--texts-out", default="")
    m.add_argument("--seed", type=int, default=6)
    args = ap.parse_args(argv)
    return primed_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
