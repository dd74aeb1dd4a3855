"""How many of a window's drafted candidates the target verifies: all of them, or what pays.

Every candidate the target verifies costs a row of the step's one inference; on a CPU a row costs
real time, and a candidate past the first rejection buys nothing. The draft proposes its block in
one call; the adaptive policy (`draft_policy="adaptive"`, the default) then chooses, for every window
that opens in a step, how far the target checks it, from what is known before the verify call:

* each candidate's chance to be accepted given the ones before it were, π: how sure the draft was,
  its peak probability at that position (the largest probability of the distribution the candidate
  was chosen from, engine/drafting/selector.py), mapped through a `Calibration` learned online from
  the windows this pipeline closed; without it, the request's acceptance by position so far
  (engine/metrics.PositionCounts), from a prior of the pipeline's pooled counts. (The peak tells
  accepted from rejected candidates far better than DSpark's confidence head: docs/batching.md.)
  A window's survivals, the products of these, are then scaled per position to what closed windows
  accepted (`SurvivalScale`): a chance a little high per position compounds along a window.
* the step's cost: the target's milliseconds by rows (`CostTable`, priced from calls that kept their row
  count and robust to one slow or lucky call), plus
  what the step pays whatever is verified (the draft call it just made, the host's own work).

It maximises expected tokens per millisecond of the whole step, all requests together: the
candidates (request r, position j) are taken in order of their survival a_rj = π_r1 ··· π_rj, and
admitted while admitting one more raises (tokens) / (ms); with a sampled window in the step, the first
that does not ends the choice (DSpark's scheduler, docs/batching.md), otherwise the best prefix of that
order is taken. Stopping at the first non-improvement is what keeps sampled output exact: whether
candidate j is verified depends only on survivals no smaller than a_rj, so on the candidates before j
(the peak at j is the distribution's, scored after the token drafted before), never on candidate j
itself nor later ones, and the rejection sampler's proof holds position by position. Greedy output
never depends on the choice: every committed token is the target's own.

How many candidates to draft is chosen before the draft call, for the whole step: the drafted
count is capped at one more than the `draft_quantile` of the verified lengths the policy chose
lately (a window it verified whole votes for one more), and every `explore_draft_every`-th draft
step drafts the requests' full count; drafting a candidate costs a row of the draft call for
every request, and at many requests the policy verifies few.

Whether to draft at all is chosen before the draft call too, for a step of decodes only whose every new window
is the policy's (`draft_pays`): with many requests on text the draft seldom gets right the call costs more than
the candidates it would verify give, and the step then runs as the target alone for a spell, with a few drafting
steps between spells to measure again; the choice reads earlier steps only, so output stays exact.

A sampled request with a fixed seed (`rng_seed`) must give the same text whatever runs beside it,
and the rejection sampler draws differently for a window cut elsewhere; so its windows are cut by
the same rule on fixed costs (`REPRODUCIBLE_ROW_COST`: a row's share of a one-request step on a CPU)
and the draft's raw peak probabilities or its own acceptance so far, which depend only on its own tokens,
and it always drafts its full count, at most the draft's tuned count under `adaptive` (a block of another
length drafts other candidates).

A target call whose row count differs from the previous call's on the same compiled model costs more on a CPU
(the plugin prepares every node for the new shape): the policy measures that extra and charges a change of row
count all of it, so a step keeps the last call's row count unless another pays more than the change costs. (A
quarter of it, as if a new count paid back over four steps, under-priced it: a new count rarely lasted four
steps, each change was paid in full, and at one request the policy ran 0.86x (HumanEval) and 0.90x (MT-Bench) of
`always` at the same count while verifying about as many; docs/benchmarks.md, issue 25.) A call size with a
compiled model of its own (`own_models`, the paged target's window models) never changes shape.

Where a change costs more than a row, the step's verified count is not chosen step by step at all: a
per-step choice charged the whole change kept whatever count it started at (a window of 6 rows on MT-Bench,
where 4 paid more; docs/benchmarks.md, issue 25), and one charged a share of it flip-flopped. The policy
instead keeps a *regime*: the number of candidates the step verifies, chosen from the survivals of the last
`history` steps (the mean expected tokens of verifying m, for every m) and the cost table, and changed only
when the new count's rate over `REGIME_HORIZON` steps, the change paid once, beats the current one. Within the
count, the candidates go to the windows by survival, as above. The count depends only on earlier steps, this
step's rows besides its windows and how many candidates were drafted, and the allocation to the m largest
survivals never reaches past a window's first unverified candidate, so sampled output stays exact.

One greedy request alone in its steps is cut differently (`choose_cut`): it drafts its whole block (the
request's count; under `adaptive` a request that does not say drafts the draft's block where the target has
window models, `default_count`) and verifies either the draft's tuned count or all of it, whichever gives more
expected tokens per ms, each priced by what the target's calls of that size cost lately. Whether it drafts the
block at all is chosen before the draft call (`drafts_block`, the cut's gate): only after a window that accepted
at least the tuned count, and only while the cut's recent long choices saved more time than the long draft
costs over the short one; otherwise it drafts the tuned count, which the target verifies whole. Two counts
make two call sizes, and the paged target runs each on a compiled model of its own (engine/models/paged_target.py,
window models, within a memory budget), so a change between them costs about a row where on one compiled model
it costs four; a per-window choice among every count gained little more in a replay of logged windows and
makes many sizes (docs/benchmarks.md, issue 25). It reads this window's chances at positions past the tuned
count to decide whether those are verified, which greedy output allows (every committed token is the target's
own) and the rejection sampler's proof does not: a sampled window keeps the admission above. Where the cut does
not run (several requests, a sampled or seeded one) an adaptive request drafts at most the tuned count: the
longer draft did not pay there (docs/benchmarks.md, issue 25).

`adaptive` is the default; `always` verifies every drafted candidate (the fixed-count behaviour:
`num_assistant_tokens=n`). Greedy text is the same under both: only how far each window is checked changes.
"""
from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import accumulate
from statistics import median, quantiles

from engine.metrics import PositionCounts

ALWAYS = "always"
ADAPTIVE = "adaptive"
POLICIES = (ADAPTIVE, ALWAYS)
DEFAULT_POLICY = ADAPTIVE  # at least as fast as `always` at every load measured (docs/benchmarks.md)
REPRODUCIBLE_ROW_COST = 0.06  # a verify row's cost, as a share of a one-row step (a seeded request's fixed costs)
REPRODUCIBLE_FIXED_COST = 0.3  # the draft call and the host, likewise
SWITCH_HORIZON = 1  # steps over which a change of the target's row count must pay back its one-off cost
REGIME_HORIZON = 4  # steps over which a change of the regime's verified count must pay back the change (a longer
# horizon moved on noise in chat's survivals, and each move back costs a change: docs/benchmarks.md, issue 25)
REGIME_MIN_STEPS = 8  # steps of history before the regime decides (the per-step choice until then)
SKIP_MARGIN = 0.05  # a step skips its draft call only where the target alone's rate beats drafting's by this much


def default_count(policy: str, tuned: int, block: int) -> int:
    """Candidates a request drafts when it does not say: under `adaptive` `block`, the draft's whole block where the
    target has window models for the cut (one greedy request then verifies the tuned count or all of them;
    elsewhere it drafts the tuned count; the caller passes the tuned count as `block` without window models),
    under `always` the draft's tuned count (every drafted candidate costs a verify row there)."""
    return block if policy == ADAPTIVE else tuned


def check_policy(name: object, field_name: str = "draft_policy") -> str:
    """The policy's name, or a ValueError naming the field and the choices."""
    if name not in POLICIES:
        raise ValueError(f"{field_name}={name!r}: use one of {', '.join(POLICIES)} (\"adaptive\" verifies as many "
                         "drafted candidates as pay for their rows, \"always\" verifies every one).")
    return str(name)


@dataclass
class CostTable:
    """Milliseconds by size (rows of a target step), robust to the calls that mislead: one slow call (the
    first run at a new shape, another process taking the CPU) and the few calls of a size the policy visits
    for one step, right after a change of row count, which once priced a short window below a one-row call
    and steered the choice (docs/benchmarks.md, issue 25).

    A size is *trusted* once `trust` of its calls ran at an unchanged row count ("kept" calls): its price is
    their lower quartile over the last `keep` (a CPU's noise only ever slows a call: a spell of other work that
    covered half of a probe's calls once priced the probed size 30 % dear and steered the regime away from it,
    docs/benchmarks.md, issue 25). A size between two trusted ones is priced on the line between them; one
    beside a single trusted size, on the line from it whose slope is the median of the slopes to the `near`
    other sizes closest to the one asked for (each at its price: kept calls where it has any, else the calls
    right after a change, "loose", less the policy's measured switch charge), so one odd size does not tilt it.
    Before any size is trusted, a weighted affine fit, fixed + per-unit cost (both >= 0), over the `near`
    closest sizes. Local, because a CPU prices a row of a long prompt chunk lower than a row of a decode step.

    The machine's speed drifts over minutes, and a size the pipeline stops using keeps the prices of the minutes
    it was used in: compared with a size in use now, it looked dear (or cheap) for that alone, and the regime
    kept the wrong count for hundreds of steps (docs/benchmarks.md, issue 25). So prices are kept relative to the
    machine's `level` when they were measured: each kept call of a trusted size says how fast the machine runs now
    (its ms over the size's relative price), the level is the lower quartile of the last `drift_calls`, every
    call is stored divided by it, and an estimate is the relative price times the level now."""

    keep: int = 32  # a size's calls that price it (at the level of their time: many, so the level, not the price, moves)
    near: int = 4
    trust: int = 3
    drift_calls: int = 8
    level: float = 1.0  # the machine's speed now, relative to the prices kept (1: as when they were measured)
    _speeds: deque[float] = field(default_factory=deque)  # the last `drift_calls` kept calls' ms over their price
    samples: dict[int, deque[float]] = field(default_factory=dict)  # kept calls
    counts: dict[int, int] = field(default_factory=dict)
    loose: dict[int, deque[float]] = field(default_factory=dict)  # calls right after a change, switch charge taken off
    loose_counts: dict[int, int] = field(default_factory=dict)
    _trusted: list[int] = field(default_factory=list)  # sizes with `trust` kept calls, in order
    _sizes: list[int] = field(default_factory=list)  # every size seen, in order
    _cache: dict[int, float] = field(default_factory=dict)

    def observe(self, size: int, ms: float, kept: bool = True) -> None:
        if size <= 0 or ms <= 0:
            return
        if size not in self.samples and size not in self.loose:
            insort(self._sizes, size)
        if kept and self.counts.get(size, 0) >= self.trust:
            self._speeds.append(ms / _low(self.samples[size]))
            if len(self._speeds) > self.drift_calls:
                self._speeds.popleft()
            if 2 * len(self._speeds) >= self.drift_calls:  # a few calls' worth, so one slow call does not move it
                self.level = _low(self._speeds)
        calls, counts = (self.samples, self.counts) if kept else (self.loose, self.loose_counts)
        calls.setdefault(size, deque(maxlen=self.keep)).append(float(ms) / self.level)
        counts[size] = counts.get(size, 0) + 1
        if kept and counts[size] == self.trust:
            insort(self._trusted, size)
        self._cache.clear()

    def _price(self, size: int) -> float:
        return _low(self.samples[size] if size in self.samples else self.loose[size])

    def _near(self, size: int, sizes: list[int]) -> list[int]:
        """The `near` sizes closest to `size` (ties to the smaller)."""
        i = bisect_left(sizes, size)
        lo, hi = i, i
        while hi - lo < min(self.near, len(sizes)):
            if lo > 0 and (hi >= len(sizes) or size - sizes[lo - 1] <= sizes[hi] - size):
                lo -= 1
            else:
                hi += 1
        return sizes[lo:hi]

    def estimate(self, size: int) -> float:
        if size <= 0 or not self._sizes:
            return 0.0
        v = self._cache.get(size)
        if v is None:
            v = self._cache[size] = self._estimate(size)
        return v * self.level

    def _estimate(self, size: int) -> float:
        if self.counts.get(size, 0) >= self.trust:  # its own price (a CPU's cost can jump from one size to the next)
            return _low(self.samples[size])
        trusted = self._trusted
        if not trusted:
            pts = [(s, self._price(s), self.counts.get(s, 0) + self.loose_counts.get(s, 0))
                   for s in self._near(size, self._sizes)]
            a, b = _affine(pts)
            return a + b * size
        i = bisect_left(trusted, size)
        if 0 < i < len(trusted):  # between two trusted sizes: the line between them
            s0, s1 = trusted[i - 1], trusted[i]
            v0, v1 = _low(self.samples[s0]), _low(self.samples[s1])
            return v0 + (v1 - v0) * (size - s0) / (s1 - s0)
        anchor = trusted[0] if i == 0 else trusted[-1]
        v = _low(self.samples[anchor])
        others = [s for s in self._sizes if s != anchor]
        slopes = [(self._price(s) - v) / (s - anchor) for s in self._near(size, others)]
        slope = max(0.0, median(slopes)) if slopes else v / 2 / anchor  # nothing else seen: half of it fixed
        return max(0.0, v + slope * (size - anchor))

    @property
    def seen(self) -> bool:
        return bool(self._sizes)


def _low(values) -> float:
    """The lower quartile (linear between order statistics): a price robust to the calls that ran slow."""
    return quantiles(values, n=4, method="inclusive")[0] if len(values) > 1 else values[0]


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


# ---- calibration of the draft's confidence ---------------------------------------------------------
@dataclass
class Calibration:
    """The draft's confidence for a position -> P(accepted | every candidate before it was), learned online.

    Counts per (position, confidence bin) of the positions the target reached and accepted. A bin's
    estimate leans on the pooled bin of all positions (worth `position_weight` windows), which leans
    on the confidence itself (worth `prior_weight`): with no data the map is the identity, and a
    position with few windows borrows from the others. Per position the bin estimates are made
    non-decreasing (pool-adjacent-violators), then read by linear interpolation between the bins'
    mean confidences: an isotonic map per position.

    `predicted` counts the same outcomes by the calibrated value the policy used (the reliability of
    the map itself, docs/batching.md). The maps are rebuilt after every `refresh_every` windows (a
    lookup is a few list reads: the policy makes one per drafted candidate per step)."""

    bins: int = 16
    log_odds: tuple[float, float] = (-4.0, 8.0)  # bins are even in log(c / (1 - c)) over this range
    positions: int = 16  # positions beyond share the last one's counts
    prior_weight: float = 20.0
    position_weight: float = 20.0
    refresh_every: int = 8
    reached: list[list[int]] = field(default_factory=list)
    accepted: list[list[int]] = field(default_factory=list)
    conf_sum: list[list[float]] = field(default_factory=list)
    predicted_reached: list[int] = field(default_factory=list)
    predicted_accepted: list[int] = field(default_factory=list)
    predicted_sum: list[float] = field(default_factory=list)
    _maps: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)
    _pooled: tuple[list[int], list[int], list[float]] = field(default_factory=lambda: ([], [], []))
    _since: int = 0

    def __post_init__(self) -> None:
        if not self.reached:
            shape = [[0] * self.bins for _ in range(self.positions)]
            self.reached = [r[:] for r in shape]
            self.accepted = [r[:] for r in shape]
            self.conf_sum = [[0.0] * self.bins for _ in range(self.positions)]
            self.predicted_reached = [0] * self.bins
            self.predicted_accepted = [0] * self.bins
            self.predicted_sum = [0.0] * self.bins
        self._pooled = ([sum(r[b] for r in self.reached) for b in range(self.bins)],
                        [sum(a[b] for a in self.accepted) for b in range(self.bins)],
                        [sum(c[b] for c in self.conf_sum) for b in range(self.bins)])

    def _bin(self, c: float) -> int:
        """Bins even in log-odds: a draft is often 95 % or 99.5 % sure, and those accept differently (even bins
        in c would pool them)."""
        lo, hi = self.log_odds
        c = min(max(c, 1e-9), 1.0 - 1e-9)
        return min(self.bins - 1, max(0, int((math.log(c / (1.0 - c)) - lo) / (hi - lo) * self.bins)))

    def _bin_center(self, b: int) -> float:
        lo, hi = self.log_odds
        return 1.0 / (1.0 + math.exp(-(lo + (b + 0.5) * (hi - lo) / self.bins)))

    def _pos(self, j: int) -> int:
        return min(j, self.positions - 1)

    def observe(self, confidence: list[float], accepted: int, predicted: list[float] | None = None) -> None:
        """A closed window: the confidences of the candidates the target verified, how many it accepted
        (in order), and the calibrated values the policy used for them (if any)."""
        pr, pa, ps = self._pooled
        for j, c in enumerate(confidence[: accepted + 1]):  # positions past the first rejection were not reached
            p, b = self._pos(j), self._bin(c)
            self.reached[p][b] += 1
            self.accepted[p][b] += int(j < accepted)
            self.conf_sum[p][b] += c
            pr[b] += 1
            pa[b] += int(j < accepted)
            ps[b] += c
            if predicted is not None and j < len(predicted):
                k = self._bin(predicted[j])
                self.predicted_reached[k] += 1
                self.predicted_accepted[k] += int(j < accepted)
                self.predicted_sum[k] += predicted[j]
        self._since += 1
        if self._since >= self.refresh_every:
            self._since = 0
            self._maps.clear()

    def _center(self, reached: int, conf_sum: float, b: int) -> float:
        return conf_sum / reached if reached else self._bin_center(b)

    def _map(self, p: int) -> tuple[list[float], list[float]]:
        if p in self._maps:
            return self._maps[p]
        xs, ys, ws = [], [], []
        pr, pa, ps = self._pooled
        for b in range(self.bins):
            r_all, a_all = pr[b], pa[b]
            x_all = self._center(r_all, ps[b], b)
            pooled = (a_all + self.prior_weight * x_all) / (r_all + self.prior_weight)
            r, a = self.reached[p][b], self.accepted[p][b]
            xs.append(self._center(r, self.conf_sum[p][b], b) if r else x_all)
            ys.append((a + self.position_weight * pooled) / (r + self.position_weight))
            ws.append(r + self.position_weight)
        ys = _isotonic(ys, ws)
        self._maps[p] = (xs, ys)
        return xs, ys

    def __call__(self, j: int, c: float) -> float:
        """P(candidate at position j (0 = first) accepted | the ones before were), given its confidence c."""
        xs, ys = self._map(self._pos(j))
        if c <= xs[0]:
            v = ys[0]
        elif c >= xs[-1]:
            v = ys[-1]
        else:
            i = bisect_left(xs, c)
            span = xs[i] - xs[i - 1]
            t = (c - xs[i - 1]) / span if span > 0 else 1.0
            v = ys[i - 1] + t * (ys[i] - ys[i - 1])
        return min(max(v, 0.0), 0.999)

    def reliability(self) -> dict[str, object]:
        """The counts behind the map, per position and bin (for the bench's reliability data)."""
        return {"bins": self.bins, "reached": [r[:] for r in self.reached], "accepted": [a[:] for a in self.accepted],
                "confidence_sum": [[round(x, 4) for x in s] for s in self.conf_sum],
                "map": [[round(y, 4) for y in self._map(p)[1]] for p in range(self.positions)],
                "map_x": [[round(x, 4) for x in self._map(p)[0]] for p in range(self.positions)],
                "predicted_reached": self.predicted_reached[:], "predicted_accepted": self.predicted_accepted[:],
                "predicted_sum": [round(x, 4) for x in self.predicted_sum]}


def _isotonic(ys: list[float], ws: list[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for y, w in zip(ys, ws):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out += [v] * int(n)
    return out


# ---- the survival check -------------------------------------------------------------------------
@dataclass
class SurvivalScale:
    """Observed over predicted survival by position, learned online: the calibration maps each candidate's
    chance given the ones before were accepted, and a window's survival a_j is their product, so a small
    over-estimate per position compounds along the window (on Qwen MT-Bench the policy verified long windows where
    short ones paid: docs/benchmarks.md, issue 25). Per position j: the windows verified that far, the sum of
    their predicted a_j and how many accepted j; the factor (accepted + weight) / (predicted + weight) scales a_j
    (no change until windows say otherwise)."""

    weight: float = 10.0
    positions: int = 16
    predicted: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.predicted:
            self.predicted = [0.0] * self.positions
            self.accepted = [0.0] * self.positions

    def observe(self, chances: list[float], verified: int, accepted: int) -> None:
        for j, a in enumerate(survivals(chances[:verified])):
            p = min(j, self.positions - 1)
            self.predicted[p] += a
            self.accepted[p] += float(j < accepted)

    def factor(self, j: int) -> float:
        p = min(j, self.positions - 1)
        return (self.accepted[p] + self.weight) / (self.predicted[p] + self.weight)

    def __call__(self, chances: list[float]) -> list[float]:
        """The chances with each survival scaled: π'_j = π_j · f_j / f_(j-1), so a'_j = a_j · f_j (from earlier
        windows only: whether candidate j is verified still depends on no later candidate)."""
        out, prev = [], 1.0
        for j, c in enumerate(chances):
            f = self.factor(j)
            out.append(min(max(c * f / prev, 0.0), 0.999))
            prev = f
        return out


# ---- the choice ---------------------------------------------------------------------------------
@dataclass
class Offer:
    """One window opening in this step: its drafted candidates' chances π_j (accepted | the ones before).
    `padded`: the target pads a one-row chunk to two rows (row invariance), so its first candidate is free.
    `sampled`: a sampled request, whose verification of candidate j must not depend on candidates j+1 on."""

    request_id: int
    chances: list[float]
    padded: bool = False
    sampled: bool = True


def survivals(chances: list[float]) -> list[float]:
    """a_j = π_1 ··· π_j: the chance that candidate j is accepted (all before it were)."""
    out, a = [], 1.0
    for p in chances:
        a *= p
        out.append(a)
    return out


class RunningSums:
    """The last `size` entries (values by position, of any length) and, per position, the sum and count of the
    entries that reach it, kept as the oldest entry drops out: the mean at a position without a pass over them."""

    def __init__(self, size: int) -> None:
        self.entries: deque[list[float]] = deque(maxlen=size)
        self.total: list[float] = []
        self.count: list[int] = []

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def positions(self) -> int:
        return len(self.count)

    def push(self, values: list[float]) -> None:
        if len(self.entries) == self.entries.maxlen:
            self._add(self.entries[0], -1)
        self.entries.append(values)
        self._add(values, 1)

    def mean(self, k: int) -> float | None:
        """The mean at position k over the entries that reach it (None: none does)."""
        if k >= len(self.count) or self.count[k] <= 0:
            return None
        return self.total[k] / self.count[k]

    def _add(self, values: list[float], sign: int) -> None:
        grow = len(values) - len(self.count)
        if grow > 0:
            self.total += [0.0] * grow
            self.count += [0] * grow
        for k, v in enumerate(values):
            self.total[k] += sign * v
            self.count[k] += sign


@dataclass
class DraftPolicy:
    """The adaptive policy's state, one per pipeline: the target's costs, the calibration of the draft's
    confidence and the pooled acceptance by position (greedy and sampled requests apart: they accept
    differently)."""

    prior_accept: float = 0.6  # P(accept | prefix passed) before any window closed
    prior_weight: float = 8.0  # windows' worth of the pooled rate in each request's estimate
    # every so many choices, verify everything (measures the larger row counts) for `explore_hold` choices in a
    # row: the first pays the change, the others are kept calls. Each probe costs two changes of row count and
    # full rows, so they are rare (docs/benchmarks.md, issue 25).
    explore_every: int = 192
    explore_hold: int = 6  # five kept calls: a short spell of other work on the CPU does not price the probe
    explore_draft_every: int = 16  # every so many draft steps, draft the full count (measures longer windows)
    draft_quantile: float = 0.9
    skip_spell: int = 32  # steps a first spell without draft calls lasts (draft_pays; 0: always draft)
    skip_spell_max: int = 256
    skip_probe: int = 2  # drafting steps after a spell that measure again
    skipping: int = 0
    probing: int = 0
    skip_streak: int = 0  # spells in a row (each doubles the next)
    skipped_steps: int = 0
    plain: dict[int, deque[float]] = field(default_factory=dict)  # target ms of steps of one-row decodes, by rows
    # per window of earlier steps: its expected tokens by verified count (what a step that skips its draft call forgoes,
    # per request: the regime's per-step sums change with how many requests shared a step)
    windows: RunningSums = field(default_factory=lambda: RunningSums(256))
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=64))  # verified lengths the policy chose
    draft_steps: int = 0
    explored: bool = False  # the last choice verified everything to measure costs (not a choice to learn from)
    target: CostTable = field(default_factory=CostTable)
    host: deque[float] = field(default_factory=lambda: deque(maxlen=32))  # a step's host ms outside the inferences
    drafting: deque[float] = field(default_factory=lambda: deque(maxlen=8))  # the draft stage's ms, steps that drafted
    calibration: dict[bool, Calibration] = field(default_factory=dict)
    survival: dict[bool, SurvivalScale] = field(default_factory=dict)  # greedy and sampled apart
    pooled: dict[bool, PositionCounts] = field(default_factory=dict)
    choices: int = 0
    # A target call whose row count differs from the one before on its compiled model costs more (the CPU plugin
    # prepares every node for the new shape): its ms by rows, apart from calls that kept the count, and the extra
    # they show. A call size in `own_models` runs on a compiled model of its own (the paged target's window models),
    # which never changes shape; `main_rows` is the last row count of the main one.
    last_rows: int = 0
    main_rows: int = 0
    own_models: frozenset[int] = frozenset()
    kept: dict[int, deque[float]] = field(default_factory=dict)
    changed: dict[int, deque[float]] = field(default_factory=dict)
    switch_cost: float = 0.0
    # the regime (module docstring): per earlier step, the running sums of its offers' survivals, largest first
    history: RunningSums = field(default_factory=lambda: RunningSums(64))
    # the cut (module docstring): the target's ms in recent cut steps that kept their row count, by rows, and the
    # rows the last cut chose (0: the last choice was not a cut)
    cut_steps: dict[int, deque[float]] = field(default_factory=dict)
    cut_rows: int = 0
    # the cut's gate (`drafts_block`): per recent cut, the ms its choice saved against verifying the tuned count at
    # that count's rate (0 where it chose the tuned count); the draft stage's ms by the step's drafted count
    cut_gains: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    drafts_by_count: dict[int, deque[float]] = field(default_factory=dict)
    explore_gate_every: int = 8
    gate_closed: int = 0

    # ---- what happened ------------------------------------------------------------------------
    def observe_step(self, rows: int, target_ms: float, host_ms: float, draft_ms: float = 0.0,
                     plain: bool = False, drafted: int = 0) -> None:
        """A step's target inference over `rows` rows (as the target runs them), its draft stage (0: it drafted
        nothing) and the most candidates a window drafted in it, and what the step spent besides its inferences.
        `plain`: a step of one-row decodes only (what a step that skips its draft call runs), kept apart by rows: the
        cost table's price of as many rows comes from windows of one request too, whose attention reads one context
        where these read one per request."""
        switched = self.changes(rows)
        if plain and not switched:
            self.plain.setdefault(rows, deque(maxlen=8)).append(target_ms)
        self.last_rows = rows
        if rows not in self.own_models:
            self.main_rows = rows
        (self.changed if switched else self.kept).setdefault(rows, deque(maxlen=16)).append(target_ms)
        if switched:
            gaps = [median(self.changed[r]) - median(self.kept[r]) for r in self.changed
                    if len(self.changed[r]) >= 2 and len(self.kept.get(r, ())) >= 2]
            self.switch_cost = max(0.0, median(gaps)) if gaps else 0.0
        self.target.observe(rows, target_ms - (self.switch_cost if switched else 0.0), kept=not switched)
        if self.cut_rows == rows and not switched:
            self.cut_steps.setdefault(rows, deque(maxlen=16)).append(target_ms)
        self.cut_rows = 0
        if host_ms >= 0:
            self.host.append(host_ms)
        if draft_ms > 0:
            self.drafting.append(draft_ms)
            if drafted > 0:
                self.drafts_by_count.setdefault(drafted, deque(maxlen=16)).append(draft_ms)

    def observe_window(self, sampled: bool, verified: int, accepted: int, peak: list[float] | None,
                       predicted: list[float] | None = None) -> None:
        """A closed window: `accepted` of its `verified` candidates accepted, in order; the draft's peak
        probability at each (None: the draft gave none)."""
        if verified <= 0:
            return
        self.pooled.setdefault(sampled, PositionCounts()).add(verified, accepted)
        if peak:
            self._calibration(sampled).observe(peak[:verified], accepted, predicted)
        if predicted:
            self.survival.setdefault(sampled, SurvivalScale()).observe(predicted, verified, accepted)

    def changes(self, rows: int) -> bool:
        """Whether a target call of `rows` rows changes its compiled model's shape (what the switch charge prices):
        never on a window model of its own, on the main one where its last call had another row count."""
        if rows in self.own_models:
            return False
        main = self.main_rows if self.last_rows in self.own_models else self.last_rows
        return main not in (0, rows)

    # ---- what to expect -----------------------------------------------------------------------
    def chances(self, n: int, sampled: bool, peak: list[float] | None, history: PositionCounts,
                reproducible: bool = False, reach: int | None = None) -> list[float]:
        """π_1..π_n of a drafted window: the draft's calibrated peak probabilities, else the request's
        acceptance by position. `reproducible`: from the request's own figures only (the raw peak
        probabilities; no pooled prior). `reach`: positions past it are read through the calibration of the last
        position every window reaches (the cut's windows: `choose_cut`)."""
        if peak:
            if reproducible:
                return [min(max(float(c), 0.0), 0.999) for c in peak[:n]]
            cal = self._calibration(sampled)
            last = n if reach is None else max(1, reach)
            return [cal(min(j, last - 1), float(c)) for j, c in enumerate(peak[:n])]
        pooled = PositionCounts() if reproducible else self.pooled.get(sampled, PositionCounts())
        out = []
        for j in range(n):
            prior = pooled.conditional(j, self.prior_accept, self.prior_weight)
            out.append(min(history.conditional(j, prior, self.prior_weight), 0.999))
        return out

    def _calibration(self, sampled: bool) -> Calibration:
        cal = self.calibration.get(sampled)
        if cal is None:
            cal = self.calibration[sampled] = Calibration()
        return cal

    def host_ms(self) -> float:
        return median(self.host) if self.host else 0.0

    def fixed_ms(self, draft_ms: float, drafted: int = 0) -> float:
        """What a drafting step costs besides the target: the draft stage (the median of the last ones that drafted
        as many candidates where known, so one slow call does not swing the choice; this step's own before any) and
        the host."""
        same = self.drafts_by_count.get(drafted, ())
        recent = same if len(same) >= 3 else self.drafting
        return (median(recent) if recent else draft_ms) + self.host_ms()

    # ---- the choice ---------------------------------------------------------------------------
    def draft_pays(self, base_rows: int, tokens: float) -> bool:
        """Whether a step of decodes only, whose adaptive windows all open now, should make its draft call at all.

        `base_rows`: the rows the target runs for it without candidates, `tokens` what they give (one a request).
        With the call, the best count k a window verifies gives (tokens + n * gain_k) / (draft + host + target(base +
        n * k)) for n windows, gain_k the mean over earlier windows of their first k survivals' sum (per window: the
        regime's per-step sums change with how many requests shared a step). Without it, tokens / (host +
        plain(base)) over a spell that pays two changes of row count; plain(base) is measured on such steps (until
        it is, the cost table's price, and a spell a quarter as long measures it). Where drafting loses (several
        requests, text the draft seldom gets right) the spell runs as the target alone, then `skip_probe` steps
        draft again to measure; a spell chosen again right after its probe lasts twice as long (up to
        `skip_spell_max`), so the probes' cost stays small. It reads earlier steps only, so output stays exact (a
        step without candidates is the target's own)."""
        if self.skipping > 0:
            self.skipping -= 1
            return False
        if self.probing > 0:
            self.probing -= 1
            return True
        if not self.skip_spell or len(self.history) < 2 * REGIME_MIN_STEPS or not self.drafting or not self.target.seen:
            return True
        plain = self.plain.get(base_rows, ())
        if len(plain) >= 3:
            spell, plain_ms = min(self.skip_spell_max, self.skip_spell * 2 ** self.skip_streak), median(plain)
        else:  # a step of decodes alone at this many rows not measured yet: a short spell measures it first
            spell, plain_ms = max(2, self.skip_spell // 4), self.target.estimate(base_rows)
        host = self.host_ms()
        without = spell * tokens / (spell * (host + plain_ms) + 2 * self.switch_cost)
        draft, windows = median(self.drafting) + host, int(tokens)
        gains = [(k, self.windows.mean(k)) for k in range(self.windows.positions)]
        best = max(((tokens + windows * g) / (draft + self.target.estimate(base_rows + windows * (k + 1)))
                    for k, g in gains if g is not None), default=0.0)
        if without <= best * (1.0 + SKIP_MARGIN):
            self.skip_streak = 0
            return True
        self.skipping, self.probing = spell - 1, self.skip_probe
        self.skip_streak += 1
        self.skipped_steps += spell
        return False

    def draft_cap(self) -> int | None:
        """The most candidates this step's adaptive windows draft (None: each its full count)."""
        if len(self.recent) < 16:
            return None
        self.draft_steps += 1
        if self.explore_draft_every and self.draft_steps % self.explore_draft_every == 0:
            return None
        lengths = sorted(self.recent)
        return 1 + lengths[int(self.draft_quantile * (len(lengths) - 1))]

    def observe_choice(self, verified: int, drafted: int, capped: bool) -> None:
        """A window the policy cut: `verified` of its `drafted` candidates; `capped`: it drafted fewer than its
        request's count (then a window verified whole asks for one more)."""
        self.recent.append(verified + int(capped and verified == drafted))

    @staticmethod
    def choose_reproducible(chances: list[float], padded: bool = False) -> int:
        """A seeded sampled request's verify count: the same admission, alone, on fixed relative costs."""
        return _admit([Offer(0, chances, padded)], 0, 0.0, lambda rows: REPRODUCIBLE_FIXED_COST + 1.0
                      + REPRODUCIBLE_ROW_COST * rows)[0]

    def choose(self, offers: list[Offer], fixed_rows: int, fixed_tokens: float, fixed_ms: float) -> list[int]:
        """Candidates to verify per offer (in order), for the most expected tokens per ms of the step.

        fixed_rows: the step's other rows as the target runs them (prompt chunks, windows still under
        validation or verified whole, a one-row chunk's padding row included);
        fixed_tokens: the tokens they are expected to give; fixed_ms: what the step costs besides the target
        (the draft call, the host). Each offer adds its anchor row and the target's own token. Everything
        while the target's cost is unknown, and on the last `explore_hold` of every `explore_every` choices."""
        if not offers:
            return []
        full = [len(o.chances) for o in offers]
        self.explored = True
        if not self.target.seen:
            return full
        if self._exploring():
            return full
        self.explored = False
        offers = [replace(o, chances=self.survival[o.sampled](o.chances)) if o.sampled in self.survival else o
                  for o in offers]
        m = self.regime_count(offers, fixed_rows, fixed_tokens, fixed_ms)
        self._remember(offers)
        if m is not None:
            return _top(offers, m)
        switch = self.switch_cost / SWITCH_HORIZON
        return _admit(offers, fixed_rows, fixed_tokens, lambda rows: fixed_ms + self.target.estimate(rows)
                      + (switch if self.changes(rows) else 0.0))

    def _exploring(self) -> bool:
        """Count a choice; whether it is one of the last `explore_hold` of every `explore_every`, which verify
        everything to measure the larger row counts."""
        self.choices += 1
        every = self.explore_every
        return bool(every) and (self.choices - 1) % every >= every - min(self.explore_hold, every)

    def drafts_block(self, last_accepted: int, short: int, block: int) -> bool:
        """The cut's gate, chosen before the draft call: whether one greedy request alone drafts its whole `block`
        this step (then `choose_cut` verifies the tuned count or all of it) or only the tuned count `short`. The
        long draft costs its extra rows whatever the cut then verifies, and it pays only where the cut goes long,
        which follows windows that accepted at least the tuned count (acceptances run together). So: the tuned
        count after a window rejected earlier; otherwise the block where the cut's recent long choices were worth
        more than the long draft's extra time (`cut_gains` against the draft stage's ms by drafted count), which on
        a CPU whose rows are dear they are not; the block until both are measured, and every
        `explore_gate_every`-th time it is not (so the gains stay fresh)."""
        if 0 <= last_accepted < short:
            return False
        longs, shorts = self.drafts_by_count.get(block, ()), self.drafts_by_count.get(short, ())
        if len(self.cut_gains) < 8 or len(longs) < 3 or len(shorts) < 3:
            return True
        if sum(self.cut_gains) / len(self.cut_gains) > median(longs) - median(shorts):
            return True
        self.gate_closed += 1
        return bool(self.explore_gate_every) and self.gate_closed % self.explore_gate_every == 0

    def choose_cut(self, chances: list[float], short: int, fixed_ms: float) -> int:
        """How many candidates of one greedy window alone in its step, drafted long, the target verifies: `short` (the
        draft's tuned count) or all of them, whichever gives more expected tokens per ms (module docstring). A
        count's price is `fixed_ms` plus the lower quartile of the target's ms in the last cut steps that
        verified it at an unchanged row count (`cut_steps`; until three did, the cost table's); a change of row
        count is charged the measured switch cost where there is no window model (every change between the two
        counts then reshapes the one compiled model). With one, the long window never reshapes and the short one
        does only after a call of another size (a prompt chunk), a change the main model pays once whichever
        step makes it: charged to one window, it kept a request on the long count after its prompt
        (docs/benchmarks.md, issue 25). Past the tuned count only windows the cut verified whole were seen, a
        sample chosen for being sure (their earlier candidates too), so what was learned there would make every
        window's later candidates look likelier than they are: the caller reads a candidate past the tuned count
        through the calibration of the last position every window reaches (`chances(reach=short)`), and the
        survival scale applies up to the tuned count only. Everything while the target's cost is unknown and on
        the policy's exploring choices (so the long count's price stays fresh where the cut seldom takes it), and a
        window the gate drafted short (`drafts_block`): cut further by the admission, on the main compiled model,
        such windows ran slower than verified whole (docs/benchmarks.md, issue 25)."""
        full = len(chances)
        self.explored = True
        if full <= short:  # the gate drafted the tuned count: verified whole, priced as the cut's short window
            self.cut_rows = full + 1
            return full
        if not self.target.seen:
            return full
        if self._exploring():
            self.cut_rows = full + 1
            return full
        self.explored = False
        scale = self.survival.get(False)
        offer = Offer(0, (scale(chances[:short]) if scale else chances[:short]) + chances[short:], sampled=False)
        self._remember([offer])
        gains = list(accumulate(survivals(offer.chances)))
        tokens, ms = {}, {}
        for m in (short, full):
            rows = m + 1
            steps = self.cut_steps.get(rows, ())
            ms[m] = fixed_ms + (_low(steps) if len(steps) >= 3 else self.target.estimate(rows))
            ms[m] += self.switch_cost if self.changes(rows) and not self.own_models else 0.0
            tokens[m] = 1.0 + gains[m - 1]
        # the ms the long window saves against making its tokens at the tuned count's rate (what the gate weighs)
        saved = tokens[full] * ms[short] / tokens[short] - ms[full]
        self.cut_gains.append(max(0.0, saved))
        best = full if saved > 0 else short
        self.cut_rows = best + 1
        return best

    def _remember(self, offers: list[Offer]) -> None:
        run, out = 0.0, []
        for a, _, _ in _survival_order(offers):
            run += a
            out.append(run)
        self.history.push(out)
        for o in offers:  # each window's own expected gain by verified count, whatever else shared its step
            self.windows.push(list(accumulate(survivals(o.chances))))

    def regime_count(self, offers: list[Offer], fixed_rows: int, fixed_tokens: float, fixed_ms: float) -> int | None:
        """How many candidates this step verifies under the regime (None: choose step by step: too little history,
        or a change of row count costs no more than a row). From earlier steps' survivals, this step's other rows,
        and how many candidates were drafted; never from this step's chances (module docstring)."""
        if len(self.history) < REGIME_MIN_STEPS:
            return None
        base = fixed_rows + sum(2 if o.padded else 1 for o in offers)
        row_ms = self.target.estimate(base + 1) - self.target.estimate(base)
        if self.switch_cost <= max(row_ms, 0.0):
            return None
        drafted = sum(len(o.chances) for o in offers)
        tokens0 = fixed_tokens + len(offers)
        rate: dict[int, tuple[float, float]] = {}
        for m in range(drafted + 1):
            gain = self.history.mean(m - 1) if m else 0.0
            if gain is None:
                break  # no earlier step drafted this many: its worth is unknown
            rate[m] = (tokens0 + gain, fixed_ms + self.target.estimate(base + m))
        best = max(rate, key=lambda m: (rate[m][0] / rate[m][1], -m))
        keep = self.last_rows - base
        if keep == best or keep not in rate or not self.changes(base + best):
            return best
        (tb, cb), (tk, ck) = rate[best], rate[keep]
        h = REGIME_HORIZON
        return best if h * tb / (h * cb + self.switch_cost) > tk / ck else keep


def _survival_order(offers: list[Offer]) -> list[tuple[float, int, int]]:
    """Every drafted candidate as (survival, position, offer), largest survival first; ties to the earlier
    position, then the earlier offer (so each window's candidates come in order)."""
    return sorted(((a, j, i) for i, o in enumerate(offers) for j, a in enumerate(survivals(o.chances))),
                  key=lambda t: (-t[0], t[1], t[2]))


def _admit(offers: list[Offer], fixed_rows: int, fixed_tokens: float, cost) -> list[int]:
    """Admission in order of survival. With a sampled window among the offers it stops at the first candidate
    that does not raise tokens / cost (what keeps sampled output exact: module docstring); greedy windows take
    the best prefix of that order, which can reach past a dear row count to a cheaper one (the last call's)."""
    items = _survival_order(offers)
    stop_early = any(o.sampled for o in offers)
    rows = fixed_rows + sum(2 if o.padded else 1 for o in offers)
    tokens = fixed_tokens + len(offers)
    ms = cost(rows)
    verify = [0] * len(offers)
    best, best_rate = list(verify), (tokens / ms if ms > 0 else 0.0)
    for a, j, i in items:
        if j != verify[i]:  # an earlier position of this window was not admitted (ties only)
            continue
        more = 0 if j == 0 and offers[i].padded else 1
        ms2 = cost(rows + more)
        if ms2 <= 0 or (stop_early and (tokens + a) * ms <= tokens * ms2):  # no gain: stop at the first that does not pay
            break
        verify[i] += 1
        rows, tokens, ms = rows + more, tokens + a, ms2
        if tokens / ms > best_rate:
            best, best_rate = list(verify), tokens / ms
    return verify if stop_early else best


def _top(offers: list[Offer], m: int) -> list[int]:
    """The m candidates of largest survival, as counts per offer (a prefix of each window: survival falls along it)."""
    items = _survival_order(offers)
    verify = [0] * len(offers)
    for _, j, i in items[:m]:
        verify[i] = max(verify[i], j + 1)
    return verify


def make_policy(name: str | None = None) -> DraftPolicy:
    """The policy state a pipeline keeps (costs, calibration), whichever policy its requests use."""
    if name is not None:
        check_policy(name)
    return DraftPolicy()
