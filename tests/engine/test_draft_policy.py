"""The adaptive draft policy (engine/draft_policy.py): its cost estimates and its choice, without models."""
from __future__ import annotations

import pytest

from engine.draft_policy import ADAPTIVE, ALWAYS, CostTable, DraftPolicy, expected_tokens, make_policy
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
    assert t.estimate(16) == pytest.approx(28.0)  # 20 at 8, 36 at 24: 4 + 1 per unit
    t.observe(24, 400.0)  # one slow call among the last four at 24: the median barely moves
    assert t.estimate(24) == pytest.approx(36.5)
    for ms in (150.0, 151.0):  # long prompt chunks cost less per row: the fit near 8..24 is not dragged
        t.observe(200, ms)
    assert t.estimate(12) == pytest.approx(24.0, abs=2.0)
    t.observe(0, 5.0)
    t.observe(3, -1.0)
    assert 0 not in t.samples and 3 not in t.samples  # nonsense sizes and times are not kept


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 7) == 8.0


def _policy(target_ms, draft_ms: float) -> DraftPolicy:
    p = DraftPolicy(explore_every=0)
    for rows in range(1, 65):
        p.observe_target(rows, target_ms(rows))
    for n in range(1, 65):
        p.observe_draft(n, draft_ms)
    return p


def test_cheap_rows_draft_the_full_window_dear_rows_draft_none() -> None:
    opening = [(i, 7) for i in range(8)]
    fixed_cost = _policy(lambda r: 10.0 + 0.01 * r, 3.0)  # one request's CPU: rows nearly free
    assert fixed_cost.choose(opening, 0, 0, 256) == 7
    per_row = _policy(lambda r: 2.5 * r, 3.0)  # many requests' CPU: every row costs the same
    assert per_row.choose(opening, 0, 0, 256) == 0
    # in between, the acceptance rate decides: the better the draft, the more candidates
    mid = _policy(lambda r: 8.0 + 0.5 * r, 3.0)
    low = mid.choose(opening, 0, 0, 256)
    for rid, _ in opening:
        for _ in range(50):
            mid.observe_window(rid, 7, 7)  # every candidate accepted
    high = mid.choose(opening, 0, 0, 256)
    assert high > low


def test_the_budget_and_the_prompt_rows_count_in_the_cost() -> None:
    p = _policy(lambda r: 4.0 + 1.0 * r, 1.0)
    opening = [(0, 7)]
    alone = p.choose(opening, 0, 0, 256)
    # 200 prompt rows wait: every window row pushes one of them out of a full 64-row budget, so the step costs
    # the same whatever k is, and drafting is free
    assert p.choose(opening, 0, 200, 64) == 7
    assert alone <= 7


def test_acceptance_is_counted_per_request_from_a_pooled_prior() -> None:
    p = DraftPolicy(prior_alpha=0.6, prior_weight=4.0)
    assert p.alpha(1) == pytest.approx(0.6)
    p.observe_window(1, 4, 1)  # one accepted, then a rejection
    assert p.alpha(1) == pytest.approx((1 + 4 * 0.5) / (2 + 4))  # the pool is now 1 of 2 as well
    p.observe_window(2, 3, 3)  # all accepted: no rejection counted
    assert p.alpha(2) > p.alpha(1)
    p.forget(2)
    assert p.alpha(2) == pytest.approx(4 / 5)  # back to the pooled rate: 4 accepted, 1 rejected


def test_unknown_costs_draft_the_full_count_and_no_opening_window_is_zero() -> None:
    assert DraftPolicy().choose([(0, 5), (1, 3)], 0, 0, 256) == 5
    assert _policy(lambda r: r, 1.0).choose([], 4, 0, 256) == 0


def test_every_so_often_the_next_count_in_turn_is_tried() -> None:
    p = _policy(lambda r: 2.5 * r, 3.0)  # dear rows: the choice is 0
    p.explore_every = 4
    picks = [p.choose([(0, 3), (1, 3)], 0, 0, 256) for _ in range(16)]
    assert picks == [0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0]  # counts 1, 2, 3, 0 measured again


def test_scheduler_setting_picks_the_policy() -> None:
    assert SchedulerConfig().draft_policy == ALWAYS and make_policy(ALWAYS) is None
    assert isinstance(make_policy(ADAPTIVE), DraftPolicy)
    SchedulerConfig(draft_policy=ADAPTIVE).validate()
    with pytest.raises(ValueError, match="draft_policy='sometimes'.*always, adaptive"):
        SchedulerConfig(draft_policy="sometimes").validate()
