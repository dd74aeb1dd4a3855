"""engine.serve's step loop on the app's engine worker: client requests run in the same steps as the chats.

Each server job goes to the worker as a GenerateRequest with a sink; the worker admits it between
two steps and feeds it its events on its own thread (app/worker.py). A model switch in the app is a
load the worker runs after the requests sent before it: running requests finish on the old model,
later ones are admitted on the new one (a client naming the old model then gets a clear 404).
"""
from __future__ import annotations

import threading

from app.worker import EngineController, EngineInfo, GenerateRequest
from engine.api import Engine
from engine.metrics import RequestMetrics
from engine.serve.errors import APIError
from engine.serve.jobs import Job
from engine.serve.model import ServedModel, served_model


def model_for(info: EngineInfo | None) -> ServedModel | None:
    """The served model of the app's loaded engine (EngineInfo), or None before a load."""
    if info is None:
        return None
    return served_model(str(info.target_dir), info.draft_name)


class _Sink:
    """What the worker calls for one job (on the worker thread)."""

    def __init__(self, loop: "WorkerLoop", tag: str, job: Job) -> None:
        self.loop, self.tag, self.job = loop, tag, job

    def admit(self, pipe: Engine, info: EngineInfo | None) -> int | None:
        try:
            return self.job.admit(pipe, model_for(info))
        except APIError as err:
            self._end(lambda: self.job.on_failed(err))
        except Exception as exc:  # noqa: BLE001 - one bad request never stops the worker
            self._end(lambda: self.job.on_failed(APIError(500, f"{type(exc).__name__}: {exc}", "server_error")))
        return None

    def events(self, events: list) -> None:
        self.job.on_events(events)

    def finished(self, reason: str, metrics: RequestMetrics | None) -> None:
        self._end(lambda: self.job.on_finished(reason, metrics))

    def failed(self, message: str) -> None:
        self._end(lambda: self.job.on_failed(APIError(500, message, "server_error")))

    def _end(self, tell) -> None:
        self.loop.forget(self.tag)
        tell()


class WorkerLoop:
    """engine.serve.loop.StepLoop over the app's EngineController."""

    def __init__(self, controller: EngineController) -> None:
        self.controller = controller
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}

    def model(self) -> ServedModel | None:
        return model_for(self.controller.info)

    def submit(self, job: Job) -> None:
        tag = f"serve:{job.id}"
        with self._lock:
            self._jobs[tag] = job
        self.controller.submit_external(GenerateRequest(tag, None, None, sink=_Sink(self, tag, job)))

    def wake(self) -> None:
        """Pass the cancels of jobs whose clients went away to the worker (it acts before its next step)."""
        with self._lock:
            gone = [tag for tag, job in self._jobs.items() if job.cancel_requested]
        for tag in gone:
            self.controller.cancel(tag)

    def cancel_all(self) -> None:
        with self._lock:
            jobs = list(self._jobs.items())
        for tag, job in jobs:
            job.cancel()
            self.controller.cancel(tag)

    def forget(self, tag: str) -> None:
        with self._lock:
            self._jobs.pop(tag, None)

    @property
    def outstanding(self) -> int:
        with self._lock:
            return len(self._jobs)
