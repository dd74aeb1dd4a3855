"""How many candidates the requests of a batched step draft: always the full count, or adaptively.

With one request in flight a window of 1 + n rows costs the target little more than one row, so
drafting the full count pays. With many in flight the CPU's cost grows with the rows, and a full
window per request can cost more than its accepted tokens save (docs/benchmarks.md, "Continuous
batching", has the measurements). The adaptive policy picks, every step, one candidate count k for
the windows that open in it, the one with the most expected tokens per millisecond, from three
online estimates:

* the target's milliseconds by rows in the step (`CostTable`: a fixed part plus a cost per row,
  fitted to the median recent times of the nearest row counts this pipeline ran, so one slow step
  does not price a row count out, and row counts not run yet are priced too);
* the draft call's milliseconds by the candidate rows it drafts (the same table);
* each request's chance that a candidate is accepted after the one before it was, α (a geometric
  model: with k candidates a window commits (1 − α^(k+1)) / (1 − α) tokens on average), counted
  over its closed windows from a prior of the pipeline's pooled rate.

Every `explore_every`-th choice tries the next count in turn instead, so the costs of counts the
policy stopped choosing are measured again (a CPU's costs drift with what else runs).

Greedy output does not depend on k (every committed token is the target's own), so the policy
changes speed only. The scheduler's `draft_policy` setting picks it; it is opt-in, because on a
2-core CPU it gains and loses by about as much as the step times wander (docs/batching.md).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

ALWAYS = "always"
ADAPTIVE = "adaptive"
POLICIES = (ALWAYS, ADAPTIVE)


@dataclass
class CostTable:
    """Milliseconds by size (rows of a target step, or candidate rows of a draft call): a local affine fit,
    fixed + per-unit cost (both >= 0), over the `near` sizes closest to the one asked for, each
    priced at the median of its last `keep` times and weighted by how often it was seen; sizes seen
    only once are left out while others were seen twice. Local, because a CPU prices a row of a long
    prompt chunk lower than a row of a small decode step; medians and weights, because one slow
    call (the first run at a new shape, another process taking the CPU) must not price a size out
    for good. Sizes not seen yet are priced by the same fit."""

    keep: int = 8
    near: int = 4
    samples: dict[int, deque[float]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    _cache: dict[int, float] = field(default_factory=dict)

    def observe(self, size: int, ms: float) -> None:
        if size <= 0 or ms <= 0:
            return
        self.samples.setdefault(size, deque(maxlen=self.keep)).append(float(ms))
        self.counts[size] = self.counts.get(size, 0) + 1
        self._cache.clear()

    def estimate(self, size: int) -> float:
        if size <= 0 or not self.samples:
            return 0.0
        if size not in self._cache:
            sizes = [s for s in self.samples if self.counts[s] >= 2]
            if len(sizes) < 2:
                sizes = list(self.samples)
            sizes = sorted(sizes, key=lambda s: (abs(s - size), s))[: self.near]
            a, b = _affine([(s, median(self.samples[s]), self.counts[s]) for s in sizes])
            self._cache[size] = a + b * size
        return self._cache[size]

    @property
    def seen(self) -> bool:
        return bool(self.samples)


def _affine(pts: list[tuple[int, float, int]]) -> tuple[float, float]:
    """(a, b) >= 0 of v ~ a + b * s over (s, v, weight) points."""
    if not pts:
        return 0.0, 0.0
    if len(pts) == 1:  # one size: no slope to see, take half of it as fixed
        s0, v0, _ = pts[0]
        return v0 / 2, v0 / 2 / s0
    w = sum(n for _, _, n in pts)
    ms = sum(n * s for s, _, n in pts) / w
    mv = sum(n * v for _, v, n in pts) / w
    var = sum(n * (s - ms) ** 2 for s, _, n in pts)
    b = sum(n * (s - ms) * (v - mv) for s, v, n in pts) / var if var > 0 else 0.0
    a = mv - b * ms
    if b < 0:  # cost does not fall as size grows
        return mv, 0.0
    if a < 0:  # nor is there a negative fixed part: a line through zero
        return 0.0, sum(n * s * v for s, v, n in pts) / sum(n * s * s for s, _, n in pts)
    return a, b


@dataclass
class _Rate:
    accepted: float = 0.0
    rejected: float = 0.0


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a window of k candidates commits on average: 1 + α + … + α^k."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class DraftPolicy:
    """The adaptive policy's state: cost tables and acceptance counts (one per pipeline)."""

    prior_alpha: float = 0.6  # before any window closed
    prior_weight: float = 4.0  # windows' worth of the pooled rate in each request's estimate
    explore_every: int = 16  # every so many choices, the next count in turn (0: never)
    target: CostTable = field(default_factory=CostTable)
    draft: CostTable = field(default_factory=CostTable)
    pooled: _Rate = field(default_factory=_Rate)
    rates: dict[int, _Rate] = field(default_factory=dict)
    choices: int = 0

    # ---- what happened ------------------------------------------------------------------------
    def observe_target(self, rows: int, ms: float) -> None:
        self.target.observe(rows, ms)

    def observe_draft(self, rows: int, ms: float) -> None:
        """A draft call that drafted `rows` candidates in all."""
        self.draft.observe(rows, ms)

    def observe_window(self, request_id: int, offered: int, accepted: int) -> None:
        """A closed window: `accepted` of its `offered` candidates were accepted, in order."""
        if offered <= 0:
            return
        rejected = 1.0 if accepted < offered else 0.0
        rate = self.rates.setdefault(request_id, _Rate())
        for r in (rate, self.pooled):
            r.accepted += accepted
            r.rejected += rejected

    def forget(self, request_id: int) -> None:
        self.rates.pop(request_id, None)

    def alpha(self, request_id: int) -> float:
        """P(a candidate is accepted | the one before it was), this request's so far."""
        p = self.pooled
        prior = p.accepted / (p.accepted + p.rejected) if p.accepted + p.rejected > 0 else self.prior_alpha
        r = self.rates.get(request_id, _Rate())
        w = self.prior_weight
        return (r.accepted + w * prior) / (r.accepted + r.rejected + w)

    # ---- the choice ---------------------------------------------------------------------------
    def choose(self, opening: list[tuple[int, int]], fixed_rows: int, prefill_rows: int, budget: int) -> int:
        """The candidate count for the windows opening this step.

        opening: (request id, the most candidates it may draft) of every decoding request without a
        window; fixed_rows: rows of windows still under validation; prefill_rows: prompt rows waiting
        (they take what the budget leaves). The full count while the target's cost is unknown."""
        top = max((n for _, n in opening), default=0)
        if top <= 0 or not self.target.seen:
            return top
        self.choices += 1
        if self.explore_every and self.choices % self.explore_every == 0:
            return (self.choices // self.explore_every) % (top + 1)
        alphas = [(self.alpha(rid), n) for rid, n in opening]
        best_k, best = top, -1.0
        for k in range(top + 1):
            window_rows = sum(1 + min(k, n) for _, n in alphas)
            rows = min(budget, fixed_rows + window_rows + prefill_rows)
            ms = self.target.estimate(rows)
            if k > 0:
                ms += self.draft.estimate(sum(min(k, n) for _, n in alphas))
            tokens = sum(expected_tokens(a, min(k, n)) for a, n in alphas) + (1.0 if fixed_rows else 0.0)
            rate = tokens / ms if ms > 0 else float("inf")
            if rate > best:  # an exact tie goes to fewer candidates
                best_k, best = k, rate
        return best_k


def make_policy(name: str) -> DraftPolicy | None:
    """The policy state for the scheduler's `draft_policy` (None: always draft the full count)."""
    if name == ALWAYS:
        return None
    if name == ADAPTIVE:
        return DraftPolicy()
    raise ValueError(f"draft_policy={name!r}: use one of {', '.join(POLICIES)}.")
