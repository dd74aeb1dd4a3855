"""Between the HTTP side and the step loop: the bounded queue, the live request table, the counters.

A request is admitted only while fewer than `max_running + max_queue` are outstanding; past that it
is answered 429 at once (never left hanging). The table feeds the app's Server panel; the counters
feed GET /metrics. Job callbacks (`job_*`) arrive on the engine thread; the rest on any thread.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from engine.events import StepEvent
from engine.serve import DEFAULT_MAX_QUEUE, DEFAULT_MAX_RUNNING
from engine.serve.errors import RATE_LIMIT, UNAVAILABLE, APIError
from engine.serve.jobs import Job
from engine.serve.loop import StepLoop
from engine.serve.metrics import ServerMetrics
from engine.serve.model import ServedModel

KEEP_RECENT = 64


@dataclass
class RequestRow:
    """One line of the Server panel's request list."""

    id: str
    kind: str
    state: str
    prompt_tokens: int
    completion_tokens: int
    steps: int
    drafted: int
    accepted: int
    seconds: float
    finish_reason: str | None

    @property
    def tokens_per_step(self) -> float:
        return self.completion_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class Bridge:
    def __init__(self, loop: StepLoop, max_queue: int = DEFAULT_MAX_QUEUE,
                 max_running: int = DEFAULT_MAX_RUNNING) -> None:
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue}: use 0 or more waiting requests.")
        self.loop = loop
        self.max_queue = max_queue
        self.max_running = max_running
        self._lock = threading.Lock()
        self._outstanding: dict[str, Job] = {}
        self._recent: deque[Job] = deque(maxlen=KEEP_RECENT)
        self.closing = False
        self.metrics = ServerMetrics(self.running_count, self.waiting_count)

    # -- any thread ------------------------------------------------------------------------------
    def model(self) -> ServedModel | None:
        return self.loop.model()

    def submit(self, job: Job) -> None:
        """Queue the job, or raise 503 (closing) / 429 (the queue is full) at once."""
        with self._lock:
            if self.closing:
                raise APIError(503, "The server is shutting down: try again later.", UNAVAILABLE)
            if len(self._outstanding) >= self.max_running + self.max_queue:
                self.metrics.requests.labels("rejected").inc()
                raise APIError(429, f"The server is busy: {self.max_running} requests are running and "
                                    f"{self.max_queue} waiting. Retry later (or raise --max-queue).", RATE_LIMIT,
                               None, "queue_full")
            job.tracker = self
            self._outstanding[job.id] = job
        try:
            self.loop.submit(job)
        except APIError:
            with self._lock:
                self._outstanding.pop(job.id, None)
            raise

    def cancel(self, job: Job) -> None:
        if not job.ended:
            job.cancel()
            self.loop.wake()

    def close(self) -> None:
        with self._lock:
            self.closing = True

    @property
    def outstanding(self) -> int:
        with self._lock:
            return len(self._outstanding)

    def running_count(self) -> int:
        with self._lock:
            admitted = sum(1 for j in self._outstanding.values() if j.state != "queued")
        return min(admitted, self.max_running)

    def waiting_count(self) -> int:
        return self.outstanding - self.running_count()

    def rows(self) -> list[RequestRow]:
        """Live requests first (oldest first), then the recent finished ones (newest first)."""
        now = time.perf_counter()
        with self._lock:
            jobs = sorted(self._outstanding.values(), key=lambda j: j.serial) + list(reversed(self._recent))
        return [RequestRow(j.id, j.kind, j.state, j.prompt_tokens, j.completion_tokens, j.steps, j.drafted,
                           j.accepted, (j.t_end or now) - j.t_submit, j.finish_reason) for j in jobs]

    # -- Tracker (the engine thread) -------------------------------------------------------------
    def job_started(self, job: Job) -> None:
        self.metrics.prompt_tokens.inc(job.prompt_tokens)

    def job_stepped(self, job: Job, events: list[StepEvent]) -> None:
        m = self.metrics
        m.generation_tokens.inc(sum(len(e.tokens) for e in events))
        for e in events:
            if e.window_drafted is not None:
                m.draft_tokens.inc(len(e.window_drafted))
                m.accepted_tokens.inc(e.window_accepted)
        if job.t_first is not None and job.completion_tokens == sum(len(e.tokens) for e in events):
            m.ttft_seconds.observe(job.t_first - job.t_submit)

    def job_ended(self, job: Job) -> None:
        with self._lock:
            self._outstanding.pop(job.id, None)
            self._recent.append(job)
        outcome = job.finish_reason if job.state == "done" else ("error" if job.state == "failed" else job.state)
        self.metrics.requests.labels(outcome or "unknown").inc()

    def observe_step(self, seconds: float) -> None:
        self.metrics.step_seconds.observe(seconds)
