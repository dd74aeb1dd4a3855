"""The step loop: ONE thread owns the engine and runs every client's request in the same steps.

`StepLoop` is what the server needs from whoever owns the engine: take a job in (thread-safe), let
it be cancelled (thread-safe), and between two engine steps admit jobs, pass cancels on, step once
for all live requests and hand each job its events. `EngineLoop` is the command line's own thread;
the app's worker provides the same through app/server/worker_loop.py, so a chat and client
requests share its steps (continuous batching, docs/batching.md).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol

from engine.api import Engine
from engine.events import StepEvent
from engine.serve.errors import APIError
from engine.serve.jobs import Job
from engine.serve.model import ServedModel


class StepLoop(Protocol):
    def submit(self, job: Job) -> None: ...  # any thread; the loop admits it before its next step

    def wake(self) -> None: ...  # any thread; a job was cancelled

    def model(self) -> ServedModel | None: ...  # what new requests run on now (any thread)


class LiveJobs:
    """Jobs the engine serves, by engine request id, and the routing of one step's events to them.
    Shared by EngineLoop and the app's worker so both treat a job the same way."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}

    def admit(self, job: Job, engine: Engine, model: ServedModel | None) -> None:
        if job.cancel_requested:
            job.on_finished("cancelled", None)
            return
        try:
            rid = job.admit(engine, model)
        except APIError as err:
            job.on_failed(err)
            return
        except Exception as exc:  # noqa: BLE001 - one bad request never stops the loop
            job.on_failed(APIError(500, f"Could not start the request: {type(exc).__name__}: {exc}", "server_error"))
            return
        self.jobs[rid] = job

    def send_cancels(self, engine: Engine) -> None:
        for rid, job in self.jobs.items():
            if job.cancel_requested and job.state == "running":
                job.state = "cancelling"
                engine.cancel(rid)

    def route(self, engine: Engine, events: list[StepEvent]) -> None:
        by_rid: dict[int, list[StepEvent]] = {}
        for ev in events:
            if ev.request_id in self.jobs:
                by_rid.setdefault(ev.request_id, []).append(ev)
        for rid, evs in by_rid.items():
            job = self.jobs[rid]
            job.on_events(evs)
            last = evs[-1]
            if last.finished:
                del self.jobs[rid]
                try:
                    metrics = engine.metrics(rid)
                except KeyError:
                    metrics = None
                job.on_finished(last.finish_reason or "stop", metrics)

    def fail_all(self, engine: Engine, error: APIError) -> None:
        jobs, self.jobs = self.jobs, {}
        for rid, job in jobs.items():
            try:
                engine.cancel(rid)
            except Exception:  # noqa: BLE001 - the engine is already in trouble
                pass
            job.on_failed(error)


class EngineLoop:
    """The command line's step-loop thread over one engine."""

    def __init__(self, engine: Engine, model: ServedModel, on_step: Callable[[float], None] | None = None) -> None:
        self.engine = engine
        self._model = model
        self.on_step = on_step
        self._cond = threading.Condition()
        self._incoming: deque[Job] = deque()
        self._stopping = False
        self.live = LiveJobs()
        self._thread = threading.Thread(target=self._run, name="dflash-serve-engine", daemon=True)

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def model(self) -> ServedModel:
        return self._model

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise APIError(503, "The server is shutting down.", "service_unavailable_error")
            self._incoming.append(job)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Cancel what is still live (the HTTP side has drained by now) and end the thread."""
        with self._cond:
            self._stopping = True
            for job in list(self._incoming) + list(self.live.jobs.values()):
                job.cancel()
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._incoming and not self.live.jobs and not self._stopping:
                    self._cond.wait()
                incoming, self._incoming = list(self._incoming), deque()
                if self._stopping and not incoming and not self.live.jobs:
                    return
            for job in incoming:
                self.live.admit(job, self.engine, self._model)
            self.live.send_cancels(self.engine)
            if not self.live.jobs:
                continue
            t0 = time.perf_counter()
            try:
                events = self.engine.step()
            except Exception as exc:  # noqa: BLE001 - the live requests fail, the server keeps serving
                self.live.fail_all(self.engine, APIError(500, f"The engine failed during a step: "
                                                              f"{type(exc).__name__}: {exc}", "server_error"))
                continue
            if self.on_step is not None:
                self.on_step(time.perf_counter() - t0)
            self.live.route(self.engine, events)
