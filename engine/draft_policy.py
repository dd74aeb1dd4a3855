"""How many candidates the requests of a batched step draft: always the full count, or adaptively.

With one request in flight a window of 1 + n rows costs the target little more than one row, so
drafting pays (1.8x on HumanEval). With many in flight the CPU's cost grows with the rows: at 8
requests each window's extra rows cost more than its accepted tokens save, and drafting runs at
0.79x of the target alone (docs/benchmarks.md, "Continuous batching"). The adaptive policy picks,
every step, one candidate count k for the windows that open in it, the one with the most expected
tokens per millisecond, from three online estimates:

* the target's milliseconds by rows in the step (`CostTable`, a moving average per row count;
  a row count not yet seen gets a lower bound from the ones seen, so it is tried once and then
  known: the cost does not fall as rows grow, nor grow faster than the rows);
* the draft call's milliseconds by the number of requests it drafts for (the same table);
* each request's chance that a candidate is accepted after the one before it was, α (a geometric
  model: with k candidates a window commits (1 − α^(k+1)) / (1 − α) tokens on average), counted
  over its closed windows from a prior of the pipeline's pooled rate.

Greedy output does not depend on k (every committed token is the target's own), so the policy
changes speed only. engine/ holds it; the scheduler's `draft_policy` setting picks it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ALWAYS = "always"
ADAPTIVE = "adaptive"
POLICIES = (ALWAYS, ADAPTIVE)


@dataclass
class CostTable:
    """Milliseconds by size (rows of a target step, or requests of a draft call)."""

    decay: float = 0.25  # weight of a new observation in the moving average
    ms: dict[int, float] = field(default_factory=dict)

    def observe(self, size: int, ms: float) -> None:
        if size <= 0 or ms <= 0:
            return
        old = self.ms.get(size)
        self.ms[size] = ms if old is None else old + self.decay * (ms - old)

    def estimate(self, size: int) -> float:
        """The average seen at `size`; else the largest lower bound the seen sizes give (0 if none)."""
        if size <= 0:
            return 0.0
        if size in self.ms:
            return self.ms[size]
        below = max((v for s, v in self.ms.items() if s < size), default=0.0)  # cost never falls with size
        above = max((v * size / s for s, v in self.ms.items() if s > size), default=0.0)  # a fixed part >= 0
        return max(below, above)

    @property
    def seen(self) -> bool:
        return bool(self.ms)


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
    target: CostTable = field(default_factory=CostTable)
    draft: CostTable = field(default_factory=CostTable)
    pooled: _Rate = field(default_factory=_Rate)
    rates: dict[int, _Rate] = field(default_factory=dict)

    # ---- what happened ------------------------------------------------------------------------
    def observe_target(self, rows: int, ms: float) -> None:
        self.target.observe(rows, ms)

    def observe_draft(self, requests: int, ms: float) -> None:
        self.draft.observe(requests, ms)

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
        alphas = [(self.alpha(rid), n) for rid, n in opening]
        best_k, best = top, -1.0
        for k in range(top + 1):
            window_rows = sum(1 + min(k, n) for _, n in alphas)
            rows = min(budget, fixed_rows + window_rows + prefill_rows)
            ms = self.target.estimate(rows)
            if k > 0:
                ms += self.draft.estimate(sum(1 for _, n in alphas if n > 0))
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
