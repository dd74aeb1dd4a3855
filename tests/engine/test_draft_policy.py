"""The adaptive draft policy (engine/draft_policy.py): its cost table, its calibration and its choice, without models."""
from __future__ import annotations

import copy
import random

import pytest

from engine.config import GenerationConfig
from engine.draft_policy import (ADAPTIVE, ALWAYS, REGIME_MIN_STEPS, Calibration, CostTable, DraftPolicy, Offer,
                                 default_count, make_policy, survivals)
from engine.metrics import PositionCounts
from engine.scheduler import SchedulerConfig


def test_cost_table_fits_the_nearest_sizes_and_shrugs_off_slow_calls() -> None:
    t = CostTable(keep=4, near=3)
    assert not t.seen and t.estimate(4) == 0.0
    t.observe(8, 20.0)
    assert t.estimate(8) == pytest.approx(20.0) and t.estimate(16) == pytest.approx(30.0)  # one size: half fixed
    for ms in (20.0, 21.0, 19.0):
        t.observe(8, ms)
    for ms in (36.0, 37.0, 35.0, 36.0):
        t.observe(24, ms)
    t.observe(16, 300.0)  # once, and slow (a first run at a new shape): left out while others were seen twice
    assert t.estimate(16) == pytest.approx(27.75)  # lower quartiles 19.75 at 8, 35.75 at 24: the line between
    t.observe(24, 400.0)  # one slow call among the last four at 24 (35, 36, 37, 400): the lower quartile holds
    assert t.estimate(24) == pytest.approx(35.75)
    for ms in (150.0, 151.0):  # long prompt chunks cost less per row: the fit near 8..24 is not dragged
        t.observe(200, ms)
    assert t.estimate(12) == pytest.approx(24.0, abs=2.0)
    t.observe(0, 5.0)
    t.observe(3, -1.0)
    assert 0 not in t.samples and 3 not in t.samples  # nonsense sizes and times are not kept


def _noisy(rng: random.Random, ms: float) -> float:
    """A CPU's call: a little jitter, and now and then another process's work on top (never faster)."""
    return ms + rng.uniform(0.0, 0.6) + (rng.uniform(4.0, 12.0) if rng.random() < 0.1 else 0.0)


def test_a_size_not_in_use_is_priced_at_the_machines_speed_now() -> None:
    """The machine slows by a quarter while only 3 rows run: 4 rows, last measured before, must still cost more
    than 3 (at its old price it looked cheaper, and the regime kept the wrong count: docs/benchmarks.md, issue 25)."""
    true = lambda r: 25.0 + 1.5 * r
    rng = random.Random(3)
    t = CostTable()
    for size in (4, 3):
        for _ in range(40):
            t.observe(size, _noisy(rng, true(size)))
    for _ in range(40):
        t.observe(3, _noisy(rng, 1.25 * true(3)))
    assert t.estimate(3) == pytest.approx(1.25 * true(3), rel=0.03)
    assert t.estimate(4) > t.estimate(3)
    assert t.estimate(4) / t.estimate(3) == pytest.approx(true(4) / true(3), rel=0.02)


def test_a_probe_that_ran_beside_other_work_does_not_price_its_size_dear() -> None:
    """Five of the last eight calls of 4 rows ran while another process took the CPU (+10 ms): its price stays the
    clean one, within a millisecond (the median of those eight said 10 ms more, and the regime left 4 rows for good)."""
    true = lambda r: 25.0 + 1.5 * r
    rng = random.Random(5)
    t = CostTable()
    for _ in range(40):
        t.observe(3, _noisy(rng, true(3)))
        t.observe(4, _noisy(rng, true(4)))
    for k in range(8):
        t.observe(4, true(4) + (10.0 if k in (0, 2, 4, 6, 7) else 0.0) + rng.uniform(0.0, 0.6))
    assert t.estimate(4) == pytest.approx(true(4), abs=1.0)
    assert t.estimate(4) > t.estimate(3)


def test_only_calls_at_a_kept_row_count_price_a_size_by_itself() -> None:
    """Sizes visited for one step, right after a change of row count, are priced from a call or two, and one lucky
    call steered the choice (4 rows from one call cheaper than a row: docs/benchmarks.md, issue 25). They borrow
    the line through the sizes the pipeline kept, and the choice matches the one on the true costs."""
    true = lambda r: 29.0 + 2.0 * r  # one request on a CPU: 1 row 31 ms, 8 rows 45 ms
    rng = random.Random(4)
    p = DraftPolicy(explore_every=0)
    p.observe_step(8, true(8), 0.5)
    for step in range(200):  # the full window kept, with a visit to a shorter one now and then
        rows = 8
        if step % 40 == 39:  # each of 3..7 rows once
            rows = 3 + (step // 40) % 5
        p.observe_step(rows, true(rows) + rng.uniform(-1.0, 1.0) + (3.0 if rows != p.last_rows else 0.0), 0.5)
    for _ in range(2):  # and twice more 4 rows, lucky calls: 10 ms under its price
        p.observe_step(4, true(4) - 10.0 + 3.0, 0.5)
        p.observe_step(8, true(8) + 3.0, 0.5)
    assert p.target.counts[8] > 150 and p.target.counts.get(4, 0) == 0  # every call at 4 rows came after a change
    assert p.target.estimate(8) == pytest.approx(true(8), abs=1.0)
    for rows in range(1, 8):
        assert p.target.estimate(rows) == pytest.approx(true(rows), abs=4.0), rows
    humaneval = [0.85, 0.8, 0.75, 0.7, 0.7, 0.65, 0.6]  # 2.04 tokens expected from 3 candidates, 2.90 from 7
    truth = DraftPolicy(explore_every=0)
    for _ in range(4):
        for rows in range(1, 9):
            truth.target.observe(rows, true(rows))
    truth.last_rows, truth.switch_cost = p.last_rows, p.switch_cost
    assert p.choose([Offer(0, humaneval, sampled=False)], 0, 0.0, 8.0) == \
        truth.choose([Offer(0, humaneval, sampled=False)], 0, 0.0, 8.0)


def test_the_survival_scale_corrects_chances_that_compound_high() -> None:
    """Chances a little high per position make a window's survival far too high a few positions on: the scale
    learned from closed windows brings the survivals to what was accepted, and the policy verifies less."""
    rng = random.Random(6)
    said, true = [0.85] * 7, [0.6] * 7  # the calibration says 0.85 where the target accepts 0.6
    p = _policy(lambda r: 30.0 + 2.0 * r)
    before = p.choose([Offer(0, said, sampled=False)], 0, 0.0, 6.0)[0]
    for _ in range(3000):
        accepted = next((j for j in range(7) if rng.random() >= true[j]), 7)
        p.observe_window(False, 7, accepted, None, said)
    scaled = survivals(p.survival[False](said))
    for j, a in enumerate(scaled[:5]):
        assert a == pytest.approx(0.6 ** (j + 1), rel=0.12), j
    after = p.choose([Offer(0, said, sampled=False)], 0, 0.0, 6.0)[0]
    assert after < before
    assert p.survival[False](said)[0] == pytest.approx(0.6, abs=0.03)
    assert True not in p.survival  # sampled requests keep their own


def test_position_counts_are_one_counter_for_shares_and_chances() -> None:
    c = PositionCounts()
    c.add(3, 1)  # accepted the first, rejected the second, the third verified but never reached
    c.add(2, 2)  # both accepted
    c.add(0, 0)  # nothing verified: not a window
    assert c.verified == [2, 2, 1] and c.reached == [2, 2, 0] and c.accepted == [2, 1, 0]
    assert c.acceptance == [1.0, 0.5, 0.0]
    assert c.conditional(1, prior=0.5, weight=2.0) == pytest.approx((1 + 1) / (2 + 2))
    assert c.conditional(5, prior=0.3, weight=2.0) == 0.3  # never verified that far: the prior


def _window(cal: Calibration, confidences: list[float], rng: random.Random, truth) -> None:
    """One window whose candidate j is accepted with chance truth(j, c_j), in order."""
    accepted = 0
    for j, c in enumerate(confidences):
        if rng.random() >= truth(j, c):
            break
        accepted += 1
    cal.observe(confidences, accepted)


def test_calibration_is_the_identity_without_data_and_learns_an_overconfident_head() -> None:
    cal = Calibration()
    for c in (0.05, 0.3, 0.55, 0.95):
        assert cal(0, c) == pytest.approx(c, abs=0.06)  # the bins' centres: the identity, roughly
    rng = random.Random(1)
    for _ in range(20000):  # a head that says c where the target accepts c / 2
        _window(cal, [rng.random() for _ in range(4)], rng, lambda j, c: c / 2)
    for j in range(3):
        for c in (0.3, 0.6, 0.9):
            assert cal(j, c) == pytest.approx(c / 2, abs=0.07), (j, c, cal(j, c))
    xs = [i / 20 for i in range(21)]
    assert all(cal(1, a) <= cal(1, b) + 1e-12 for a, b in zip(xs, xs[1:]))  # isotonic
    # a position seen rarely leans on the others: position 3 was reached far less often than position 0
    assert sum(cal.reached[3]) < sum(cal.reached[0]) / 4
    assert cal(3, 0.8) == pytest.approx(0.4, abs=0.1)
    rel = cal.reliability()
    assert sum(map(sum, rel["reached"])) == sum(map(sum, cal.reached)) and len(rel["map"]) == cal.positions


def test_calibration_tells_positions_apart() -> None:
    cal = Calibration()
    rng = random.Random(2)
    for _ in range(6000):  # the first position is accepted more often than its confidence says, later ones less
        _window(cal, [rng.random() for _ in range(3)], rng, lambda j, c: min(1.0, c + 0.3) if j == 0 else c * 0.6)
    assert cal(0, 0.5) == pytest.approx(0.8, abs=0.08)
    assert cal(1, 0.5) == pytest.approx(0.3, abs=0.08)


def _policy(target_ms) -> DraftPolicy:
    p = DraftPolicy(explore_every=0)
    for rows in range(1, 80):
        for _ in range(1 + p.target.trust):  # a change of row count, then kept calls: each size trusted
            p.observe_step(rows, target_ms(rows), 0.5)
    return p


def test_cheap_rows_verify_everything_dear_rows_and_low_confidence_verify_few() -> None:
    confident = [0.95] * 8
    doubtful = [0.3] * 8
    flat = _policy(lambda r: 10.0 + 0.01 * r)  # one request's CPU: rows nearly free
    assert flat.choose([Offer(0, [0.6] * 8)], 0, 0.0, 3.0) == [8]
    assert flat.choose([Offer(0, doubtful)], 0, 0.0, 3.0)[0] < 8  # 0.3^8: not worth even a cheap row
    dear = _policy(lambda r: 2.5 * r)  # many requests' CPU: a row costs what a step does
    assert dear.choose([Offer(i, doubtful) for i in range(8)], 0, 0.0, 3.0) == [0] * 8
    mid = _policy(lambda r: 10.0 + 1.0 * r)
    low, high = mid.choose([Offer(0, doubtful)], 0, 0.0, 3.0), mid.choose([Offer(0, confident)], 0, 0.0, 3.0)
    assert 0 < low[0] < high[0]
    # in one step, the confident request gets the rows
    both = mid.choose([Offer(0, doubtful), Offer(1, confident)], 0, 0.0, 3.0)
    assert both[1] > both[0]
    # the more the step costs besides the target (a slow draft call), the more rows are worth their cost
    assert mid.choose([Offer(0, doubtful)], 0, 0.0, 40.0)[0] >= low[0]


def test_a_change_of_row_count_is_charged_its_whole_measured_extra() -> None:
    """A new row count rarely lasts the steps a share of the charge assumes, and every change pays the CPU plugin's
    extra for a new shape: the choice charges all of it (SWITCH_HORIZON = 1), so a window keeps the last call's count
    unless another pays more than the change costs."""
    p = _policy(lambda r: 10.0 + 1.0 * r)
    offer = [Offer(0, [0.9, 0.9, 0.3, 0.3, 0.3], sampled=False)]
    assert p.choose(offer, 0, 0.0, 3.0) == [3]  # no switch cost measured: the best rate, 4 rows
    p.switch_cost, p.last_rows = 1.0, 3
    assert p.choose(offer, 0, 0.0, 3.0) == [2]  # 4 rows would gain 0.004 tokens/ms: less than a 1 ms change
    p.last_rows = 4
    assert p.choose(offer, 0, 0.0, 3.0) == [3]
    p.switch_cost, p.last_rows = 0.2, 3
    assert p.choose(offer, 0, 0.0, 3.0) == [3]  # a cheap change is worth it


def test_where_a_change_costs_more_than_a_row_the_count_is_a_regime_chosen_from_earlier_steps() -> None:
    """A change of row count dearer than a row (a CPU): the per-step choice charged all of it stays wherever it
    started; the regime moves to the count that pays over REGIME_HORIZON steps, and stays there while this step's
    own chances say otherwise."""
    doubtful = [0.55, 0.45, 0.4, 0.3, 0.3, 0.3, 0.3]  # MT-Bench-like: a row past the third buys little
    p = _policy(lambda r: 20.0 + 1.0 * r)
    p.switch_cost, p.last_rows = 6.0, 8  # started with the full window (8 rows), as a new pipeline does
    picks = []
    for _ in range(REGIME_MIN_STEPS + 4):
        picks.append(p.choose([Offer(0, doubtful, sampled=False)], 0, 0.0, 3.0)[0])
        p.last_rows = 1 + picks[-1]
    assert picks[0] == 7  # no history yet: step by step, and a change of the 8 rows does not pay in one step
    assert picks[-1] < 4 and len(set(picks[REGIME_MIN_STEPS + 1:])) == 1  # the regime left it, then kept its count
    kept = picks[-1]
    assert p.choose([Offer(0, [0.99] * 7, sampled=False)], 0, 0.0, 3.0) == [kept]  # one sure window: no change
    assert p.choose([Offer(0, [0.99] * 7, sampled=False), Offer(1, [0.1] * 7, sampled=False)], 0, 1.0, 3.0)[1] == 0
    for _ in range(64):  # the text turns predictable: over the horizon the longer window pays the change
        p.choose([Offer(0, [0.97] * 7, sampled=False)], 0, 0.0, 3.0)
    assert p.choose([Offer(0, [0.97] * 7, sampled=False)], 0, 0.0, 3.0) == [7]
    rng = random.Random(2)
    for _ in range(100):  # past the history's 64 steps: the running sums forget what the history dropped
        p.choose([Offer(0, [rng.random() for _ in range(rng.randint(1, 7))], sampled=False)], 0, 0.0, 3.0)
    for k in range(7):
        seen = [h[k] for h in p.history.entries if len(h) > k]
        assert p.history.count[k] == len(seen) and p.history.total[k] == pytest.approx(sum(seen))
    cheap = _policy(lambda r: 20.0 + 1.0 * r)
    cheap.switch_cost = 0.5  # a change cheaper than a row: step by step, as before
    for _ in range(REGIME_MIN_STEPS + 2):
        cheap.choose([Offer(0, doubtful, sampled=False)], 0, 0.0, 3.0)
    assert cheap.regime_count([Offer(0, doubtful)], 0, 0.0, 3.0) is None


def test_under_the_regime_a_candidate_is_verified_independently_of_the_ones_after_it() -> None:
    """The exactness property of the per-step test below, with history: the count comes from earlier steps and the
    allocation takes the largest survivals, so redrawing what follows a window's first unverified candidate changes
    nothing."""
    rng = random.Random(5)
    for trial in range(200):
        policy = _policy(lambda r, s=rng.uniform(0.5, 3.0), f=rng.uniform(5.0, 20.0): f + s * r)
        policy.switch_cost = rng.uniform(4.0, 10.0)
        for _ in range(REGIME_MIN_STEPS):
            policy.choose([Offer(0, [rng.random() for _ in range(rng.randint(1, 8))])], 0, 0.0, 3.0)
        policy.last_rows = rng.randint(1, 12)
        offers = [Offer(i, [rng.random() for _ in range(rng.randint(1, 8))]) for i in range(rng.randint(1, 4))]
        fixed = (rng.randint(0, 4), rng.random(), rng.uniform(0.0, 10.0))
        assert policy.regime_count(offers, *fixed) is not None
        verify = copy.deepcopy(policy).choose(offers, *fixed)
        for i, o in enumerate(offers):
            m = verify[i]
            for _ in range(4):
                later = o.chances[: m + 1] + [rng.random() for _ in o.chances[m + 1:]]
                changed = [Offer(x.request_id, later if x is o else x.chances) for x in offers]
                assert copy.deepcopy(policy).choose(changed, *fixed)[i] == m, (trial, i)  # the same earlier steps


def test_unknown_costs_verify_everything_and_exploration_measures_the_larger_windows() -> None:
    assert DraftPolicy().choose([Offer(0, [0.1] * 5), Offer(1, [0.1] * 3)], 0, 0.0, 1.0) == [5, 3]
    assert DraftPolicy().choose([], 4, 1.0, 1.0) == []
    p = _policy(lambda r: 2.5 * r)
    p.explore_every, p.explore_hold = 8, 3  # the full count for three choices in a row: two of them at a kept count
    picks = [p.choose([Offer(0, [0.2] * 3)], 0, 0.0, 1.0)[0] for _ in range(16)]
    assert picks == ([0] * 5 + [3] * 3) * 2


def test_the_drafted_count_follows_the_verified_lengths_and_explores() -> None:
    p = DraftPolicy(explore_draft_every=4)
    assert p.draft_cap() is None  # too few choices seen: every request drafts its full count
    for _ in range(40):
        p.observe_choice(2, 8, capped=False)
    p.observe_choice(6, 8, capped=False)  # one long window among many short: the 90th percentile is 2
    caps = [p.draft_cap() for _ in range(8)]
    assert caps == [3, 3, 3, None, 3, 3, 3, None]  # one more than it verifies; every 4th draft step the full count
    for _ in range(64):
        p.observe_choice(3, 3, capped=True)  # capped windows verified whole ask for one more
    assert p.draft_cap() == 5
    assert DraftPolicy.choose_reproducible([0.95] * 6) == 6 and DraftPolicy.choose_reproducible([0.02] * 6) == 0
    assert DraftPolicy.choose_reproducible([0.95, 0.95, 0.02, 0.95]) == 2  # stops at the first doubtful one


def test_whether_a_candidate_is_verified_never_depends_on_the_ones_after_it() -> None:
    """What keeps sampled output exact: candidate j's verification may depend on the chances up to j (they read
    the tokens drafted before j) and on other requests, never on chance j+1 onwards (which read candidate j)."""
    rng = random.Random(3)
    for trial in range(300):
        policy = _policy(lambda r, s=rng.uniform(0.1, 3.0), f=rng.uniform(0.0, 20.0): f + s * r)
        for _ in range(rng.randint(0, 30)):  # a survival scale learned from earlier windows, or none
            policy.observe_window(True, 6, rng.randint(0, 6), None, [rng.random() for _ in range(6)])
        offers = [Offer(i, [rng.random() for _ in range(rng.randint(1, 8))]) for i in range(rng.randint(1, 6))]
        fixed = (rng.randint(0, 20), rng.random() * 3, rng.uniform(0.0, 10.0))
        verify = policy.choose(offers, *fixed)
        for i, o in enumerate(offers):
            m = verify[i]
            for _ in range(5):  # redraw everything after the first candidate left unverified
                later = o.chances[: m + 1] + [rng.random() for _ in o.chances[m + 1:]]
                changed = [Offer(x.request_id, later if x is o else x.chances) for x in offers]
                assert policy.choose(changed, *fixed)[i] == m, (trial, i)


def test_chances_come_from_the_confidence_else_from_the_requests_history() -> None:
    p = DraftPolicy(prior_accept=0.6, prior_weight=4.0)
    assert p.chances(3, False, [0.9, 0.5, 0.1], PositionCounts()) == pytest.approx([0.9, 0.5, 0.1], abs=0.06)
    history = PositionCounts()
    for _ in range(40):
        history.add(3, 3)  # this request's windows: every candidate accepted
    got = p.chances(3, False, None, history)
    assert all(g > 0.95 for g in got)
    assert p.chances(2, False, None, PositionCounts()) == pytest.approx([0.6, 0.6])  # nothing known: the prior
    for _ in range(50):
        p.observe_window(False, 2, 0, None)  # the pool: every first candidate rejected
    assert p.chances(1, False, None, PositionCounts())[0] < 0.1
    assert p.chances(1, True, None, PositionCounts()) == pytest.approx([0.6])  # sampled requests count apart
    assert survivals([0.5, 0.5, 1.0]) == pytest.approx([0.5, 0.25, 0.25])


def test_the_cut_verifies_the_tuned_count_or_the_whole_block_whichever_pays() -> None:
    """One greedy window alone in its step, drafted long (8), tuned count 3: cheap rows verify the block, dear rows
    and low confidence the tuned count; a confident window pays for dear rows; a change of row count is charged."""
    confident, doubtful = [0.95] * 8, [0.9, 0.9, 0.9] + [0.3] * 5
    flat = _policy(lambda r: 10.0 + 0.01 * r)
    assert flat.choose_cut(doubtful, 3, 3.0) == 8  # rows nearly free: even 0.3s are worth them
    dear = _policy(lambda r: 10.0 + 2.0 * r)
    assert dear.choose_cut(doubtful, 3, 3.0) == 3
    assert dear.choose_cut(confident, 3, 3.0) == 8
    assert dear.choose_cut([0.95] * 3, 3, 3.0) == 3  # nothing past the tuned count drafted: nothing to cut
    mid = _policy(lambda r: 10.0 + 1.0 * r)  # 0.9^3 then 0.7s: the block pays a little more per ms...
    leaning = [0.9, 0.9, 0.9] + [0.7] * 5
    mid.last_rows = 4
    assert mid.choose_cut(leaning, 3, 3.0) == 8
    mid.switch_cost, mid.last_rows = 3.0, 4  # ...but not a 3 ms change from the tuned count's calls
    assert mid.choose_cut(leaning, 3, 3.0) == 3
    mid.last_rows = 9
    assert mid.choose_cut(leaning, 3, 3.0) == 8
    mid.last_rows, mid.own_models = 4, frozenset({9})  # the long window on a compiled model of its own
    assert mid.choose_cut(leaning, 3, 3.0) == 8  # no change of shape to pay for
    mid.switch_cost, mid.last_rows, mid.main_rows = 30.0, 40, 40  # a prompt chunk left the main model at 40 rows
    assert mid.choose_cut(doubtful, 3, 3.0) == 3  # the main model pays that change once, whichever step makes it
    mid.own_models, mid.last_rows, mid.main_rows = frozenset(), 9, 9  # one compiled model: every change reshapes it
    assert mid.choose_cut(doubtful, 3, 3.0) == 8


def test_a_call_on_a_window_model_of_its_own_never_changes_shape() -> None:
    """The main compiled model changes shape only between its own calls: calls of 4 and 9 rows on window models
    between two main calls of 12 rows do not make the second a change, nor are they changes themselves."""
    p = DraftPolicy(own_models=frozenset({4, 9}))
    for rows, ms in ((12, 20.0), (12, 20.0), (4, 12.0), (9, 17.0), (4, 12.0), (12, 20.0), (9, 17.0)):
        p.observe_step(rows, ms, 0.5)
    assert not p.changed and sorted(p.kept) == [4, 9, 12] and p.switch_cost == 0.0
    assert not p.changes(12) and p.changes(16) and not p.changes(4)
    p.observe_step(16, 30.0, 0.5)
    assert list(p.changed) == [16] and p.changes(12) and not p.changes(9)


def test_the_cut_prices_each_count_by_the_targets_recent_calls_of_its_size() -> None:
    """The cost table says the block pays; the target's calls of the block's size in cut steps (kept row count)
    say they cost more: from the third such call the cut follows them. A step's draft and host time, whatever
    the window, is not the block's price (a draft call after a long accepted window reads more rows)."""
    p = _policy(lambda r: 10.0 + 1.0 * r)
    p.own_models = frozenset({4, 9})  # each size on a window model: alternating keeps both shapes
    leaning = [0.9, 0.9, 0.9] + [0.7] * 5
    assert p.choose_cut(leaning, 3, 3.0) == 8
    for _ in range(3):
        assert p.cut_rows == 9  # the choice tells the next step what it priced
        p.observe_step(9, 27.0, 40.0, 30.0)  # a slow host and draft call: not the window's price
        p.cut_rows = 4
        p.observe_step(4, 14.0, 0.5, 3.0)
        p.choose_cut(leaning, 3, 3.0)
    p.cut_rows = 0
    assert sorted(p.cut_steps) == [4, 9] and list(p.cut_steps[9]) == [27.0] * 3
    assert p.choose_cut(leaning, 3, 3.0) == 3
    assert p.cut_rows == 4


def test_the_cut_drafts_the_block_only_after_a_window_that_accepted_the_tuned_count_and_where_it_pays() -> None:
    """The gate before the draft call: the tuned count after a window rejected before it; the block after one that
    accepted it (or before any) while the cut's long choices save more ms than the long draft costs over the
    short one, and not once they save less, but every `explore_gate_every`-th time still (to measure again)."""
    p = _policy(lambda r: 10.0 + 1.0 * r)
    assert p.drafts_block(-1, 3, 8) and p.drafts_block(3, 3, 8) and p.drafts_block(8, 3, 8)
    assert not p.drafts_block(2, 3, 8) and not p.drafts_block(0, 3, 8)
    for _ in range(4):  # the draft stage by drafted count: the block 4 ms dearer than the tuned count
        p.observe_step(4, 14.0, 0.5, 3.0, drafted=3)
        p.observe_step(9, 19.0, 0.5, 7.0, drafted=8)
    assert p.fixed_ms(0.0, 8) == pytest.approx(7.5) and p.fixed_ms(0.0, 3) == pytest.approx(3.5)
    confident, doubtful = [0.95] * 8, [0.9, 0.9, 0.9] + [0.3] * 5
    for _ in range(8):
        assert p.choose_cut(doubtful, 3, p.fixed_ms(0.0, 8)) == 3  # the long draft's extra rows bought nothing
    assert set(p.cut_gains) == {0.0}
    gates = [p.drafts_block(3, 3, 8) for _ in range(16)]
    assert gates.count(True) == 16 // p.explore_gate_every and not any(gates[: p.explore_gate_every - 1])
    for _ in range(32):
        assert p.choose_cut(confident, 3, p.fixed_ms(0.0, 8)) == 8
    assert min(p.cut_gains) > 4.0  # each long window saved more than the long draft's extra 4 ms
    assert all(p.drafts_block(3, 3, 8) for _ in range(16)) and not p.drafts_block(1, 3, 8)


def test_an_adaptive_request_that_does_not_say_drafts_the_block_and_always_the_tuned_count() -> None:
    assert default_count(ADAPTIVE, 3, 8) == 8 and default_count(ALWAYS, 3, 8) == 3


def test_the_policy_is_a_setting_of_the_scheduler_and_of_each_request() -> None:
    assert SchedulerConfig().draft_policy == ADAPTIVE  # the default: at least as fast as `always` at every load
    assert isinstance(make_policy(ALWAYS), DraftPolicy) and isinstance(make_policy(ADAPTIVE), DraftPolicy)
    SchedulerConfig(draft_policy=ALWAYS).validate()
    GenerationConfig(draft_policy=ALWAYS).validate()
    with pytest.raises(ValueError, match="draft_policy='sometimes'.*adaptive, always"):
        SchedulerConfig(draft_policy="sometimes").validate()
    with pytest.raises(ValueError, match="draft_policy='all'"):
        GenerationConfig(draft_policy="all").validate()


def _history(p: DraftPolicy, offers: list[Offer], steps: int = 2 * REGIME_MIN_STEPS + 4) -> None:
    for _ in range(steps):
        p.choose(offers, 0, 0.0, 3.0)


def test_a_step_drafts_only_where_its_draft_call_pays_and_measures_again_after_a_spell() -> None:
    """Eight requests on text the draft seldom gets right, a draft call dearer than the rows it saves: the step runs
    as the target alone for a spell, then drafts `skip_probe` steps to measure, and a spell chosen again lasts twice
    as long. With one request and a draft it gets right, every step drafts."""
    many = _policy(lambda r: 16.0 + 1.5 * r)
    many.drafting.extend([15.0] * 8)  # the draft stage of eight requests
    _history(many, [Offer(i, [0.4, 0.3, 0.3], sampled=False) for i in range(8)])
    trial = [many.draft_pays(8, 8.0) for _ in range(many.skip_spell // 4 + many.skip_probe)]
    assert trial == [False] * (many.skip_spell // 4) + [True] * many.skip_probe  # steps of decodes alone unmeasured
    for _ in range(4):  # what that short spell measured: eight one-row decodes cost 28 ms
        many.observe_step(8, 28.0, 0.5, plain=True)
    assert list(many.plain[8]) == [28.0] * 3  # the first came right after a change of row count
    many.skip_streak, many.skipped_steps = 0, 0
    decisions = [many.draft_pays(8, 8.0) for _ in range(many.skip_spell + many.skip_probe + 2 * many.skip_spell)]
    assert decisions[: many.skip_spell] == [False] * many.skip_spell
    assert decisions[many.skip_spell: many.skip_spell + many.skip_probe] == [True] * many.skip_probe
    assert not any(decisions[many.skip_spell + many.skip_probe:])  # the next spell: twice the first
    assert many.skipped_steps == 3 * many.skip_spell
    dear = _policy(lambda r: 16.0 + 1.5 * r)  # the cost table prices 8 rows cheap, but 8 one-row decodes are dear
    dear.drafting.extend([15.0] * 8)
    _history(dear, [Offer(i, [0.4, 0.3, 0.3], sampled=False) for i in range(8)])
    for _ in range(4):
        dear.observe_step(8, 80.0, 0.5, plain=True)
    assert all(dear.draft_pays(8, 8.0) for _ in range(40)) and dear.skipped_steps == 0
    one = _policy(lambda r: 16.0 + 1.5 * r)
    one.drafting.extend([3.5] * 8)
    _history(one, [Offer(0, [0.9] * 7, sampled=False)])
    assert all(one.draft_pays(1, 1.0) for _ in range(100)) and one.skipped_steps == 0
    never = _policy(lambda r: 16.0 + 1.5 * r)
    never.skip_spell = 0  # the setting that always drafts
    never.drafting.extend([15.0] * 8)
    _history(never, [Offer(i, [0.4, 0.3, 0.3], sampled=False) for i in range(8)])
    assert never.draft_pays(8, 8.0)


def test_without_history_or_costs_a_step_drafts() -> None:
    p = DraftPolicy()
    assert p.draft_pays(8, 8.0)  # nothing measured yet
    q = _policy(lambda r: 16.0 + 1.5 * r)
    assert q.draft_pays(8, 8.0)  # costs, but no draft call measured nor windows seen
