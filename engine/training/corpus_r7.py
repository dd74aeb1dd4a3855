"""Seventh data round (issue 8): more task-primed user turns, sampled on every GPU at once.

Round 6's primed turns (writing and role-play tasks written by the target after a generic opener)
lifted held-out primed τ from 2.65 to 3.09 and MT-Bench from 1.88 to 2.18 tokens per step; role-play
had the fewest rows (5,765). This round samples more of them with round 6's sampler and openers,
with new seeds and a larger role-play share (``SHARES``), one sampler per GPU (``sample``), then
joins the samplers' rows, drops every turn that repeats an earlier round's primed turn or another
sampler's (``merge``), and writes the round's ordered prompt file.

The benchmark rule is round 5's, applied by the sampler's filter: no prompt shares a word 8-gram
with a HumanEval prompt or an MT-Bench turn.

    python -m engine.training.corpus_r7 sample --target G --tokenizer DIR --seed 71 --id-prefix p7a ...  # GPU
    python -m engine.training.corpus_r7 merge --base ANSWERS --rows A B --seen R6_TEXTS --out FILE
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Iterable, Sequence

from engine.training import corpus
from engine.training.corpus import PromptRow
from engine.training.corpus_r5 import _answers_rows, add_sampler_args, merge_round_file, words
from engine.training.corpus_r6 import OPENERS, sample_primed, split_base

# Round 7's task-type shares: role-play level with writing (round 6: 0.50 / 0.40 / 0.10).
SHARES: dict[str, float] = {"writing": 0.45, "roleplay": 0.45, "ask": 0.10}


def _keys(text: str) -> tuple[str, str]:
    """The duplicate keys of a turn: its normalised words, and its first ten of them (a near duplicate:
    the same opening, as round 5's first-10-token rule, but comparable across tokenisations)."""
    w = words(text)
    return " ".join(w), " ".join(w[:10])


def dedupe_rounds(blocks: Sequence[Sequence[PromptRow]], seen: Iterable[str]) -> tuple[list[PromptRow], dict]:
    """The rows of `blocks` in order, less those whose text or opening repeats a `seen` text (an
    earlier round's turn) or an earlier kept row (another sampler's, whose seed differs)."""
    texts: set[str] = set()
    heads: set[str] = set()
    for t in seen:
        full, head = _keys(t)
        texts.add(full)
        heads.add(head)
    kept: list[PromptRow] = []
    stats = {"in": 0, "dup_seen": 0, "dup": 0, "near_dup": 0}
    seen_full = set(texts)
    for block in blocks:
        for r in block:
            stats["in"] += 1
            full, head = _keys(r.prompt)
            if full in texts:
                stats["dup_seen" if full in seen_full else "dup"] += 1
                continue
            if head in heads:
                stats["near_dup"] += 1
                continue
            texts.add(full)
            heads.add(head)
            kept.append(r)
    stats["kept"] = len(kept)
    return kept, stats


def round_file(old: Sequence[PromptRow], new: Sequence[PromptRow], heldout: int, recent_kinds: Sequence[str],
               extra_per_kind: int, seed: int) -> tuple[list[PromptRow], dict]:
    """The round's ordered prompt file: the held-out rows first (unchanged), then the extra held-out
    rows, the first `extra_per_kind` of each recent kind in the base's order (so rounds 5 and 6's
    extra rows stay the same and before/after numbers compare), then the other recent rows and the
    new rows shuffled together, then the older rows (the feature cap trims those first). The new rows
    give no extra held-out rows of their own: they share the kind ``primed`` with round 6's."""
    held, recent, older = split_base(old, heldout, recent_kinds)
    merged = merge_round_file(held, recent + [list(new)], [extra_per_kind] * len(recent) + [0], older, seed)
    extra = sum(min(extra_per_kind, len(b)) for b in recent)
    return merged, {"held": len(held), "extra": extra, "older": len(older),
                    "recent": {k: len(b) for k, b in zip(recent_kinds, recent)}, "new": len(new)}


def sample_main(args: argparse.Namespace) -> int:
    """(GPU) One sampler: round 6's primed turns with this round's shares, seed and row ids."""
    t0 = time.time()
    rows, stats = sample_primed(args, SHARES, args.id_prefix)
    stats["seconds"] = round(time.time() - t0, 1)
    corpus.write_rows(rows, Path(args.rows_out), with_text=True)
    print(json.dumps({"sample": args.id_prefix, **stats}))
    return 0


def merge_main(args: argparse.Namespace) -> int:
    """The samplers' rows, deduplicated against each other and the earlier rounds' turns, and the
    round's ordered prompt file (ids only) with the new rows' texts beside it."""
    blocks = [corpus.read_rows(Path(p)) for p in args.rows if Path(p).is_file()]
    seen = [r.prompt for p in args.seen for r in corpus.read_rows(Path(p))]
    new, stats = dedupe_rounds(blocks, seen)
    recent_kinds = [k for k in args.recent_kinds.split(",") if k]
    merged, counts = round_file(_answers_rows(Path(args.base)), new, args.heldout, recent_kinds, args.extra_heldout,
                                args.seed)
    corpus.write_rows(merged, Path(args.out), with_text=False)
    if args.texts_out:
        corpus.write_rows(new, Path(args.texts_out), with_text=True)
    by_type = {k: sum(r.source == f"primed:{k}" for r in new) for k, _, _ in OPENERS}
    print(json.dumps({"merge": {**stats, "files": len(blocks), "seen": len(seen), "by_type": by_type, **counts,
                                "merged": len(merged)}}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="(GPU) sample task-primed user turns from the target, filtered")
    add_sampler_args(s, n=16384, max_new=200)
    s.add_argument("--seed", type=int, default=71)
    s.add_argument("--id-prefix", default="p7", help="row ids are PREFIX-i: distinct per sampler and round")
    s.add_argument("--rows-out", required=True)
    m = sub.add_parser("merge", help="join the samplers' rows, drop repeats, write the round's file")
    m.add_argument("--base", required=True, help="answers cache of the earlier rounds (its first --heldout rows "
                                                 "stay first)")
    m.add_argument("--rows", nargs="+", required=True, help="the samplers' row files (a missing one is skipped)")
    m.add_argument("--seen", nargs="*", default=[], help="row files of earlier rounds' turns (with text)")
    m.add_argument("--heldout", type=int, default=256)
    m.add_argument("--recent-kinds", default="magpie,func,primed")
    m.add_argument("--extra-heldout", type=int, default=64)
    m.add_argument("--out", required=True)
    m.add_argument("--texts-out", default="")
    m.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    return sample_main(args) if args.cmd == "sample" else merge_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
