"""The adaptive draft policy (engine/draft_policy.py): its cost estimates and its choice, without models."""
from __future__ import annotations

import pytest

from engine.draft_policy import ADAPTIVE, ALWAYS, CostTable, DraftPolicy, expected_tokens, make_policy
from engine.scheduler import SchedulerConfig


def test_cost_table_averages_what_it_saw_and_bounds_what_it_did_not() -> None:
    t = CostTable(decay=0.5)
    assert not t.seen and t.estimate(4) == 0.0
    t.observe(4, 12.0)
    t.observe(4, 16.0)
    assert t.estimate(4) == pytest.approx(14.0)  # a moving average, not the last value
    t.observe(32, 64.0)
    assert t.estimate(8) == pytest.approx(16.0)  # 14 (4 rows, cost never falls) < 64 * 8/32 (fixed part >= 0)
    assert t.estimate(2) == pytest.approx(7.0)  # only sizes above: the largest proportional bound (14 * 2/4)
    assert t.estimate(40) == pytest.approx(64.0)  # only sizes below: the largest of them
    t.observe(0, 5.0)
    t.observe(3, -1.0)
    assert set(t.ms) == {4, 32}  # nonsense sizes and times are not kept


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 7) == 8.0


def _policy(target_ms, draft_ms: float) -> DraftPolicy:
    p = DraftPolicy()
    for rows in range(1, 65):
        p.observe_target(rows, target_ms(rows))
    for n in range(1, 17):
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


def test_scheduler_setting_picks_the_policy() -> None:
    assert SchedulerConfig().draft_policy == ALWAYS and make_policy(ALWAYS) is None
    assert isinstance(make_policy(ADAPTIVE), DraftPolicy)
    SchedulerConfig(draft_policy=ADAPTIVE).validate()
    with pytest.raises(ValueError, match="draft_policy='sometimes'.*always, adaptive"):
        SchedulerConfig(draft_policy="sometimes").validate()
