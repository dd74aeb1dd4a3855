"""The live plots mark, per step, the candidates drafted, verified and accepted, and read acceptance by position
from the engine's one counter (engine.metrics.PositionCounts), not a count of their own."""
from __future__ import annotations

import numpy as np

from app.plots.live import LivePlots
from engine.events import StepEvent
from engine.metrics import RequestMetrics


def _events() -> list[StepEvent]:
    """A prefill, then windows of 8 drafted candidates that the draft policy verified 3, 0 (none: the target's
    own token only) and 5 of, the last one split over two steps by the token budget."""
    return [
        StepEvent(0, 0, tokens=[1], produced=1),
        StepEvent(0, 1, drafted=[5, 6, 7], accepted=2, tokens=[5, 6, 9], produced=3, window_drafted=[5, 6, 7],
                  window_accepted=2, window_proposed=8),
        StepEvent(0, 2, drafted=[], accepted=0, tokens=[4], produced=1, window_drafted=[], window_proposed=8),
        StepEvent(0, 3, drafted=[2, 3], accepted=2, tokens=[2, 3], produced=2, window_proposed=8),
        StepEvent(0, 4, drafted=[8, 9, 1], accepted=3, tokens=[8, 9, 1, 7], produced=4,
                  window_drafted=[2, 3, 8, 9, 1], window_accepted=5, window_proposed=8),
    ]


def test_per_step_marks_and_the_one_position_counter(qtbot) -> None:
    plots = LivePlots()
    qtbot.addWidget(plots)
    events = _events()
    plots.add_events(events)
    plots.stop()  # one last draw
    assert list(plots.steps.view()) == [1, 2, 3, 4]  # the prefill is not a verification step
    assert list(plots.proposed.view()) == [8, 8, 8, 8]
    assert list(plots.verified.view()) == [3, 0, 2, 3]
    assert list(plots.accepted.view()) == [2, 0, 2, 3]
    ref = RequestMetrics()
    for e in events:
        ref.record(e)
    assert plots.metrics.positions == ref.positions  # the engine's own counter, fed the same events
    # windows closed: [5 6 7] accepting 2, one verified not at all, [2 3 8 9 1] accepting all 5
    assert ref.positions.verified == [2, 2, 2, 1, 1] and ref.positions.accepted == [2, 2, 1, 1, 1]
    assert np.allclose(plots.acceptance_percent(), [100, 100, 50, 100, 100])
    assert ref.drafted_total == 24 and ref.verified_total == 8 and ref.windows == 3
    assert "verified 2.7 of 8.0 drafted per window" in plots.summary.text()
    plots.reset()
    assert plots.proposed.n == 0 and not len(plots.acceptance_percent())
