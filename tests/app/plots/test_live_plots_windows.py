"""The live plots mark, per step, the candidates drafted, verified and accepted, and read acceptance by position
from the engine's one counter (engine.metrics.PositionCounts), not a count of their own."""
from __future__ import annotations

import numpy as np

from app.plots.live import LivePlots
from engine.events import StepEvent
from engine.metrics import PositionCounts, RequestMetrics


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


def test_split_windows_under_concurrency_land_on_the_engines_positions(qtbot, tiny_qwen3_target,
                                                                       tiny_qwen3_drafts) -> None:
    """Three requests in one engine under a 3-token budget: windows are validated over several steps, with
    other requests' rows between their parts. Each request's plot, fed only its own events, shows the
    acceptance by position of the engine's metrics(): a split window counts once, at the positions of its
    whole window (a per-step count would put a second part's candidates at positions 1, 2, ...)."""
    from engine.config import GenerationConfig
    from engine.draft_policy import ALWAYS
    from engine.pipeline import SpeculativePipeline
    from engine.scheduler import SchedulerConfig
    from fixtures.tiny_drafts import TRAIN_PROMPTS

    pipe = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32",
                                    scheduler=SchedulerConfig(max_num_batched_tokens=3))
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, draft_policy=ALWAYS)
    plots = {pipe.add_request(p, cfg.copy(), chat=False): LivePlots() for p in TRAIN_PROMPTS[:3]}
    for p in plots.values():
        qtbot.addWidget(p)
    by_step = {rid: PositionCounts() for rid in plots}  # what counting each step as a window would give
    while pipe.has_unfinished():
        for ev in pipe.step():
            plots[ev.request_id].add_events([ev])
            if ev.step:
                by_step[ev.request_id].add(len(ev.drafted), ev.accepted)
    split = 0
    for rid, p in plots.items():
        m = pipe.metrics(rid)
        split += m.split_windows
        assert p.metrics.positions == m.positions and m.windows > 0
        assert np.allclose(p.acceptance_percent(), 100.0 * np.asarray(m.acceptance_by_position))
    assert split > 0, "no window was split: the budget did not exercise what this test is about"
    assert any(by_step[rid] != pipe.metrics(rid).positions for rid in plots), \
        "split windows that a per-step count places right: the test cannot tell the two apart"
