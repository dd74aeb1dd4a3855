"""Exact speculative sampling (Leviathan et al. 2023): the emitted tokens follow the target's p.

For each drafted x_k drawn from q_k: accept with probability min(1, p_k(x)/q_k(x)); on the first
rejection emit a draw from norm(max(0, p_k - q_k)) and drop the later candidates; if all pass,
emit a bonus draw from p_{n+1}. P(emit v) = min(p, q)(v) + max(0, p(v) - q(v)) = p(v).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from engine.sampling.distribution import Dist

PRow = Callable[[int], Dist]  # p of verification row k, computed only when row k is examined


def residual(p: Dist, q: Dist, vocab: int) -> Dist:
    """norm(max(0, p - q)); when p <= q everywhere (p == q), p itself.

    max(0, p - q) is zero outside p's support, so only p's support is visited.
    """
    ids = np.arange(vocab) if p.ids is None else p.ids
    r = np.maximum(p.probs - q.probs_at(ids), 0.0)
    total = r.sum()
    if total <= 0.0:
        return p
    keep = np.flatnonzero(r)
    return Dist(r[keep] / total, ids[keep])


def verify(p_row: PRow, drafted: list[int], proposals: list[Dist], rng: np.random.Generator,
           vocab: int, bonus: bool = True) -> tuple[int, int | None]:
    """(number of drafted tokens accepted, the token emitted after them).

    bonus=False validates part of a split window: when all pass, no token follows yet (None); the
    draws happen in the same order as for the whole window, so a split changes nothing."""
    for k, x in enumerate(drafted):
        p = p_row(k)
        px = p.prob(x)
        qx = proposals[k].prob(x)
        u = rng.random()  # float64 in [0, 1)
        if qx > 0.0 and u < min(1.0, px / qx):
            continue
        return k, residual(p, proposals[k], vocab).sample(rng.random())
    return len(drafted), p_row(len(drafted)).sample(rng.random()) if bonus else None


def verify_window(drafted: list[int], bonus: bool = True, argmax: Sequence[int] | None = None,
                  p_row: PRow | None = None, proposals: list[Dist] | None = None,
                  rng: np.random.Generator | None = None, vocab: int = 0) -> tuple[int, int | None]:
    """(drafted tokens accepted, the token emitted after them) for one window's rows: the one entry for
    greedy and sampled windows.

    Greedy (no `proposals`): accept while a candidate equals the target's choice at its row, the
    argmax of its processed distribution (`p_row`, requests with logit processors) or else the
    in-graph argmax ids (`argmax`). Sampled: exact rejection sampling against the draft's
    `proposals` (`verify`). bonus=False validates part of a split window (no token follows yet
    when every candidate passes)."""
    if proposals is not None:
        return verify(p_row, drafted, proposals, rng, vocab, bonus)
    choice = (lambda k: int(argmax[k])) if p_row is None else (lambda k: p_row(k).argmax())
    for k, x in enumerate(drafted):
        best = choice(k)
        if best != x:
            return k, best
    return len(drafted), choice(len(drafted)) if bonus else None
