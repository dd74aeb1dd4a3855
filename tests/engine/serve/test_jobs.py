"""engine/serve/jobs.py without a server: a job counts its events as the engine does (RequestMetrics), so the
Server panel's row and the speculative object agree with the engine's figures."""
from __future__ import annotations

from engine.events import StepEvent
from engine.metrics import RequestMetrics
from engine.serve.jobs import Job, speculative_stats
from engine.serve.schemas import CompletionRequest


def _events() -> list[StepEvent]:
    """A prefill, a window of 4 validated over two steps (2 then 2, accepting 3), one of 2 accepting both."""
    return [StepEvent(0, 0, tokens=[1], produced=1),
            StepEvent(0, 1, drafted=[5, 6], accepted=2, tokens=[5, 6], produced=2, window_proposed=4),
            StepEvent(0, 2, drafted=[7, 8], accepted=1, tokens=[7, 3], produced=2, window_drafted=[5, 6, 7, 8],
                      window_accepted=3, window_proposed=4),
            StepEvent(0, 3, drafted=[2, 4], accepted=2, tokens=[2, 4, 9], produced=3, window_drafted=[2, 4],
                      window_accepted=2, window_proposed=2, finished=True, finish_reason="length")]


def test_a_job_counts_its_events_as_the_engine_and_makes_no_times_up() -> None:
    sent: list[object] = []
    job = Job("completion", CompletionRequest(model="m", prompt="hi"), sent.append)
    ref = RequestMetrics()
    for ev in _events():
        job.on_events([ev])
        ref.record(ev)
    # the split window counts once: 6 candidates verified in 2 windows, 5 accepted, over 3 target steps
    assert (job.steps, job.drafted, job.accepted) == (3, 6, 5) == (ref.target_steps, ref.verified_total,
                                                                   ref.accepted_total)
    without = speculative_stats(None, job)  # an engine that could not give its metrics
    assert without["acceptance_by_position"] == ref.as_dict()["acceptance_by_position"] == [1.0, 1.0, 1.0, 0.0]
    assert not {"ttft_ms", "tpot_ms", "decode_tok_s"} & set(without)
    ref.ttft_ms = 12.5
    assert speculative_stats(ref, job)["ttft_ms"] == 12.5
