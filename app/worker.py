"""One QThread over the engine: loads models, runs requests, batches step events, reports errors.

All engine calls happen on the worker thread. The GUI talks to it only through `EngineController`
(queued signals in, queued signals out), a thread-safe queue of generate requests and a thread-safe
cancel set; the worker never touches a widget.

Generation is a pump: the engine serves many requests per step (docs/batching.md), so the worker
keeps every live request in one loop. Between two steps it takes the queued requests in
(`add_request`), sends the cancels the GUI asked for (`pipe.cancel(rid)`), then steps once for all
of them and routes each event to its request's tag by `request_id`. Step events are sent in batches
per tag (at most one signal per tag per `flush_interval_s`, plus one at the end), never one signal
per token. The loop ends when nothing is live; a request that arrives later wakes it again.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QObject, Signal, Slot

from app.qt_tracking import TrackedThread
from engine.config import GenerationConfig
from engine.description import DraftDescription, EngineDescription
from engine.errors import ContextLengthError, DeviceError, DFlashError, DraftMismatchError, ModelFolderError
from engine.metrics import RequestMetrics
from engine.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from engine.api import Engine  # imported for real on the worker thread (it loads openvino_genai)

Loader = Callable[..., Any]


@dataclass
class ErrorInfo:
    title: str
    message: str  # one or two readable sentences
    details: str = ""  # traceback and context, shown behind a "Details" button
    kind: str = ""
    stage: str = ""  # "start": the engine refused the request before any step (a bad setting)

    @classmethod
    def from_exception(cls, exc: BaseException, doing: str) -> "ErrorInfo":
        details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if isinstance(exc, ContextLengthError):  # a refusal like a bad setting: the window gives the text back
            return cls("Does not fit", f"{doing} failed: {exc}", details, "ValueError")
        if isinstance(exc, DFlashError):
            title = {
                ModelFolderError: "Model folder problem",
                DraftMismatchError: "The draft does not fit the target",
                DeviceError: "Device problem",
            }.get(type(exc), "Engine error")
            return cls(title, f"{doing} failed: {exc}", details, type(exc).__name__)
        if isinstance(exc, ValueError):
            return cls("Bad setting", f"{doing} failed: {exc}", details, type(exc).__name__)
        if isinstance(exc, (ImportError, ModuleNotFoundError)):
            return cls("Engine not available", f"{doing} failed: the engine could not be imported ({exc}).",
                       details, type(exc).__name__)
        return cls("Unexpected engine error",
                   f"{doing} failed with an unexpected {type(exc).__name__}: {exc}. "
                   "Your chat history is intact; the details below help a bug report.",
                   details, type(exc).__name__)


@dataclass(frozen=True)
class EngineInfo:
    """What the worker loaded: the folders and device the person asked for, how long the load took, and
    what the engine says it runs (`Engine.describe()`: the device it uses, the draft's declared shape)."""

    target_dir: str
    draft_dir: str | None
    requested_device: str
    load_s: float
    description: EngineDescription

    @property
    def device(self) -> str:
        """The device the engine uses (it may have fallen back from the requested one)."""
        return self.description.device

    @property
    def target_name(self) -> str:
        return self.description.target

    @property
    def draft(self) -> DraftDescription | None:
        return self.description.draft

    @property
    def draft_name(self) -> str | None:
        return self.description.draft_name

    @property
    def has_chat_template(self) -> bool:
        return self.description.has_chat_template


@dataclass
class GenerateRequest:
    tag: str  # the assistant message id the events belong to
    prompt: Any  # str | list[dict] | list[int]
    config: GenerationConfig
    chat: bool | None = None
    # A local-server request (app/server/worker_loop.py): it admits itself (`admit(pipe, info)` -> request
    # id, or None when it refused) and hears its events, end and failure on this thread, not via signals.
    sink: Any = None


@dataclass
class _Live:
    """A request the engine is serving (worker thread only)."""

    req: GenerateRequest
    rid: int
    tokens: int = 0  # tokens its events carried (what the reply shows)
    batch: list[Any] = field(default_factory=list)
    last_flush: float = field(default_factory=time.perf_counter)
    cancel_sent: bool = False
    cancel_this_step: bool = False  # cancel sent before the step now running: its event is due
    done: bool = False
    reason: str = "unknown"
    dropped_turns: int = 0  # oldest chat turns left out so the prompt fits the target's context

    @property
    def tag(self) -> str:
        return self.req.tag


@dataclass
class BenchJob:
    """One comparison run (engine.bench.runner.BenchSpec) for the worker thread."""

    spec: Any
    loader: Loader | None = None  # None: the controller's loader (the same engine as the chat)
    machine: dict[str, str] | None = None  # None: engine.bench.runner.describe_machine
    cancel_event: threading.Event = field(default_factory=threading.Event)


@dataclass
class FinishInfo:
    request_id: int
    reason: str
    stats: dict[str, Any] = field(default_factory=dict)


def default_loader(target_dir, draft_dir=None, device="CPU", precision="default",
                   scheduler: SchedulerConfig | None = None, **kw) -> Engine:
    """The real engine (engine/api.py picks the paged pipeline or the NPU path), loaded on the worker
    thread; the prefix cache on, so a chat's next turn reuses its history."""
    from engine.api import load_engine

    return load_engine(target_dir, draft_dir, device=device, precision=precision,
                       scheduler=scheduler or SchedulerConfig(prefix_caching=True), **kw)


def stats_from_metrics(metrics: RequestMetrics | None, tokens: int, info: EngineInfo | None) -> dict[str, Any]:
    """Per-message stats: the engine's metrics(), and the tokens the reply got. An engine that could not
    give its metrics gets none made up here (source "none")."""
    s: dict[str, Any] = {}
    if metrics is not None:
        s.update(ttft_ms=metrics.ttft_ms, tpot_ms=metrics.tpot_ms, decode_tok_s=metrics.decode_tok_s,
                 tokens_per_step=metrics.tokens_per_step, acceptance_rate=metrics.acceptance_rate,
                 target_steps=metrics.target_steps, cached_tokens=metrics.cached_tokens)
        if metrics.acceptance_by_position:
            s["acceptance_by_position"] = [round(x, 4) for x in metrics.acceptance_by_position]
        if metrics.device:
            s["device"] = metrics.device
        if metrics.draft_name:
            s["draft"] = metrics.draft_name
    s["source"] = "engine" if metrics is not None else "none"
    s["tokens"] = tokens
    if "device" not in s and info is not None:
        s["device"] = info.device
    if "draft" not in s:
        s["draft"] = (info.draft_name if info and info.draft_name else None) or "none"
    return s


def request_stats(config: GenerationConfig, info: EngineInfo | None) -> dict[str, Any]:
    """What a reply was made with: decoding, and the draft's variant and K when it has a draft."""
    s: dict[str, Any] = {}
    if config.do_sample:
        s["decoding"] = f"sampled T={config.temperature:g}" + (
            f" seed {config.rng_seed}" if config.rng_seed is not None else "")
    else:
        s["decoding"] = "greedy"
    draft = info.draft if info is not None else None
    if draft is not None:
        if draft.variant:
            s["variant"] = draft.variant
        if draft.has_head:
            k = config.markov_head_top_k
            s["markov_head_top_k"] = draft.default_top_k if k is None else k
        if config.num_assistant_tokens:
            s["num_assistant_tokens"] = config.num_assistant_tokens
    return s


class EngineWorker(QObject):
    """Lives on the worker thread. Slots are invoked through EngineController's queued signals."""

    loaded = Signal(object)  # EngineInfo
    load_failed = Signal(object)  # ErrorInfo
    started = Signal(object, int)  # tag, request id
    events_ready = Signal(object, object)  # tag, list[StepEvent]
    finished = Signal(object, object)  # tag, FinishInfo
    failed = Signal(object, object)  # tag, ErrorInfo
    bench_progress = Signal(str, object)  # message, fraction done (or None while loading)
    bench_finished = Signal(object)  # engine.bench.runner.BenchResult (cancelled=True when cancelled)
    bench_failed = Signal(object)  # ErrorInfo
    cache_cleared = Signal(object)  # bytes the prefix cache held

    def __init__(self, loader: Loader, flush_interval_s: float) -> None:
        super().__init__()
        self._loader = loader
        self.flush_interval_s = flush_interval_s
        self._pipe: Engine | None = None
        self._info: EngineInfo | None = None
        self._lock = threading.Lock()
        self._cancelled: set[str] = set()
        # (epoch, request): a request waits for the loads / comparison runs sent before it (its
        # epoch) and is taken in by the pump between two steps. Filled from the GUI thread.
        self._queue: deque[tuple[int, GenerateRequest]] = deque()
        self._epochs_done = 0  # loads / comparison runs this worker has started (worker thread)
        self._live: dict[int, _Live] = {}  # request id -> live request (worker thread)
        self._pumping = False
        self.shutting_down = threading.Event()
        self.step_observer: Callable[[float], None] | None = None  # seconds per engine step (the server's metrics)

    # -- called from the GUI thread (thread-safe) ------------------------------------------------
    def request_cancel(self, tag: str) -> None:
        with self._lock:
            self._cancelled.add(tag)

    def enqueue(self, req: GenerateRequest, epoch: int = 0) -> None:
        """Queue a request; the pump takes it in between two steps (wake it with a queued call)."""
        with self._lock:
            self._queue.append((epoch, req))

    def _is_cancelled(self, tag: str) -> bool:
        with self._lock:
            return tag in self._cancelled or self.shutting_down.is_set()

    def release(self) -> None:
        self._pipe = None

    @property
    def live_tags(self) -> list[str]:
        """Tags of the requests the engine is serving now (read on the worker thread; tests)."""
        return [lv.tag for lv in list(self._live.values())]

    # -- slots (worker thread) -------------------------------------------------------------------
    @Slot(object)
    def do_load(self, req: dict) -> None:
        self._epochs_done += 1
        try:
            self._load(req)
        finally:
            self.pump()  # requests sent after this load run on what it loaded

    def _load(self, req: dict) -> None:
        if self.shutting_down.is_set():
            return
        t0 = time.perf_counter()
        try:
            pipe = self._loader(req["target_dir"], req.get("draft_dir"), device=req["device"])
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a readable message
            self.load_failed.emit(ErrorInfo.from_exception(exc, "Loading the models"))
            return
        try:
            description = pipe.describe()
        except BaseException as exc:  # noqa: BLE001 - an engine that cannot say what it runs is not used
            self.load_failed.emit(ErrorInfo.from_exception(exc, "Loading the models"))
            return
        self._pipe = pipe  # the previous engine is dropped only once the new one works
        info = EngineInfo(str(req["target_dir"]), str(req["draft_dir"]) if req.get("draft_dir") else None,
                          req["device"], time.perf_counter() - t0, description)
        self._info = info
        self.loaded.emit(info)

    @Slot()
    def pump(self) -> None:
        """Serve every live request, one engine step at a time, taking queued requests in between
        steps; return when nothing is live (a later request wakes it again)."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while True:
                self._admit()
                if not self._live:
                    break
                self._step_once()
        finally:
            self._pumping = False

    def _admit(self) -> None:
        """add_request for every queued request whose loads / comparison runs have started."""
        while True:
            with self._lock:
                if not self._queue or self._queue[0][0] > self._epochs_done:
                    return
                _epoch, req = self._queue.popleft()
            self._start(req)

    def _start(self, req: GenerateRequest) -> None:
        tag = req.tag
        if self._is_cancelled(tag):
            with self._lock:
                self._cancelled.discard(tag)
            if req.sink is not None:
                req.sink.finished("cancelled", None)
            else:
                self.finished.emit(tag, FinishInfo(-1, "cancelled", {}))
            return
        pipe = self._pipe
        if pipe is None:
            if req.sink is not None:
                req.sink.failed("No model is loaded: load a target in the app first.")
            else:
                self.failed.emit(tag, ErrorInfo("No model loaded", "Load a target model before sending a message."))
            return
        if req.sink is not None:
            rid = req.sink.admit(pipe, self._info)
            if rid is not None:
                self._live[rid] = _Live(req, rid)
            return
        prompt, dropped = req.prompt, 0
        try:
            if req.chat and isinstance(prompt, list):
                prompt, dropped = pipe.fit_chat(prompt, req.config.max_new_tokens)  # the engine's context rule
            rid = pipe.add_request(prompt, req.config, chat=req.chat)
        except BaseException as exc:  # noqa: BLE001 - a bad setting fails this request only
            err = ErrorInfo.from_exception(exc, "Starting the request")
            err.stage = "start"
            self.failed.emit(tag, err)
            return
        self._live[rid] = _Live(req, rid, dropped_turns=dropped)
        self.started.emit(tag, rid)

    def _step_once(self) -> None:
        """Cancels, one engine step for all live requests, events routed and batched per tag."""
        pipe = self._pipe
        for lv in self._live.values():
            lv.cancel_this_step = False
            if not lv.cancel_sent and self._is_cancelled(lv.tag):
                try:
                    pipe.cancel(lv.rid)
                except Exception:  # noqa: BLE001 - the step below ends it anyway
                    pass
                lv.cancel_sent = lv.cancel_this_step = True
        try:
            t0 = time.perf_counter()
            events = pipe.step()
            if self.step_observer is not None:
                self.step_observer(time.perf_counter() - t0)
        except BaseException as exc:  # noqa: BLE001 - every live request fails; the app keeps running
            err = ErrorInfo.from_exception(exc, "Generating")
            live, self._live = list(self._live.values()), {}
            for lv in live:
                if lv.req.sink is not None:
                    self._forget(pipe, lv.rid, lv.tag)
                    lv.req.sink.failed(err.message)
                    continue
                if lv.batch:
                    self.events_ready.emit(lv.tag, lv.batch)
                    lv.batch = []
                self._forget(pipe, lv.rid, lv.tag)
                self.failed.emit(lv.tag, dataclasses.replace(err))
            return
        seen: set[int] = set()
        for ev in events:
            lv = self._live.get(ev.request_id)
            if lv is None:
                continue
            seen.add(lv.rid)
            lv.tokens += len(ev.tokens)
            lv.batch.append(ev)
            if ev.finished:
                lv.done = True
                lv.reason = ev.finish_reason or "unknown"
        idle = not pipe.has_unfinished()
        for lv in self._live.values():
            if lv.done:
                continue
            # A cancel is answered by the next step's "cancelled" event; an engine that drops a
            # request it had not started yet (GenAITargetPipeline's queue) says nothing: it is over.
            if lv.cancel_this_step and lv.rid not in seen:
                lv.done, lv.reason = True, "cancelled"
            elif idle:  # the engine has nothing left, so neither has this request
                lv.done = True
                lv.reason = "cancelled" if lv.cancel_sent else lv.reason
        now = time.perf_counter()
        for lv in list(self._live.values()):
            if lv.req.sink is not None and lv.batch:  # a server request streams every step
                lv.req.sink.events(lv.batch)
                lv.batch = []
            if lv.batch and (lv.done or now - lv.last_flush >= self.flush_interval_s):
                self.events_ready.emit(lv.tag, lv.batch)
                lv.batch = []
                lv.last_flush = now
            if lv.done:
                del self._live[lv.rid]
                self._finish(pipe, lv)

    def _finish(self, pipe: Engine, lv: _Live) -> None:
        try:
            metrics = pipe.metrics(lv.rid)
        except Exception:  # noqa: BLE001 - the reply is kept; its figures are missing
            metrics = None
        if lv.req.sink is not None:
            self._forget(pipe, lv.rid, lv.tag)
            lv.req.sink.finished(lv.reason, metrics)
            return
        stats = stats_from_metrics(metrics, lv.tokens, self._info)
        stats.update(request_stats(lv.req.config, self._info))
        stats["finish_reason"] = lv.reason
        if lv.dropped_turns:
            stats["context_dropped_turns"] = lv.dropped_turns
        cache = pipe.prefix_cache_stats()
        if cache:
            stats["prefix_cache_mb"] = cache["memory_bytes"] / (1 << 20)
        self._forget(pipe, lv.rid, lv.tag)
        self.finished.emit(lv.tag, FinishInfo(lv.rid, lv.reason, stats))

    @Slot()
    def do_clear_cache(self) -> None:
        """Forget the prefix cache (running replies keep their blocks)."""
        self.cache_cleared.emit(self._pipe.clear_prefix_cache() if self._pipe is not None else 0)

    @Slot(object)
    def do_bench(self, job: BenchJob) -> None:
        self._epochs_done += 1
        try:
            self._bench(job)
        finally:
            self.pump()  # chat requests sent after this run

    def _bench(self, job: BenchJob) -> None:
        """Run the shared bench runner; progress at most ~10 times a second, cancel between runs."""
        from engine.bench.runner import run_bench

        def cancelled() -> bool:
            return job.cancel_event.is_set() or self.shutting_down.is_set()

        last = [0.0]

        def progress(message: str, fraction: float | None = None) -> None:
            now = time.perf_counter()
            if fraction is None or fraction >= 1.0 or now - last[0] >= 0.1:
                last[0] = now
                self.bench_progress.emit(message, fraction)

        try:
            result = run_bench(job.spec, progress, cancelled, loader=job.loader or self._loader, machine=job.machine)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a readable message
            self.bench_failed.emit(ErrorInfo.from_exception(exc, "The comparison run"))
            return
        self.bench_finished.emit(result)

    def _forget(self, pipe: Engine, rid: int, tag: str) -> None:
        with self._lock:
            self._cancelled.discard(tag)
        # Make sure a failed request does not linger in the engine's scheduler.
        try:
            if pipe.has_unfinished():
                pipe.cancel(rid)
        except Exception:  # noqa: BLE001
            pass


class EngineController(QObject):
    """GUI-thread handle on the worker thread. Re-emits the worker's signals on the GUI thread."""

    loaded = Signal(object)
    load_failed = Signal(object)
    started = Signal(object, int)
    events_ready = Signal(object, object)
    finished = Signal(object, object)
    failed = Signal(object, object)
    busy_changed = Signal(bool)
    bench_progress = Signal(str, object)
    bench_finished = Signal(object)
    bench_failed = Signal(object)
    cache_cleared = Signal(object)

    _load_req = Signal(object)
    _clear_req = Signal()
    _wake = Signal()  # a generate request is in the worker's queue
    _bench_req = Signal(object)

    def __init__(self, loader: Loader | None = None, flush_interval_s: float = 0.033, parent=None) -> None:
        super().__init__(parent)
        self._thread = TrackedThread()
        self._thread.setObjectName("dflash-engine")
        self._worker = EngineWorker(loader or default_loader, flush_interval_s)
        self._worker.moveToThread(self._thread)
        self._load_req.connect(self._worker.do_load)
        self._wake.connect(self._worker.pump)
        self._bench_req.connect(self._worker.do_bench)
        self._clear_req.connect(self._worker.do_clear_cache)
        self._worker.cache_cleared.connect(self.cache_cleared)
        self._worker.bench_progress.connect(self.bench_progress)
        self._worker.bench_finished.connect(self._on_bench_finished)
        self._worker.bench_failed.connect(self._on_bench_failed)
        self._worker.loaded.connect(self._on_loaded)
        self._worker.load_failed.connect(self._on_load_failed)
        self._worker.started.connect(self.started)
        self._worker.events_ready.connect(self.events_ready)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._thread.finished.connect(self._worker.deleteLater)
        self._thread.start()
        self._pending: list[str] = []  # tags sent and not yet finished, oldest first
        self._loads = 0  # load requests sent and not yet answered
        self._epoch = 0  # loads / comparison runs sent: a request runs after those sent before it
        self._bench: BenchJob | None = None
        self.info: EngineInfo | None = None
        self._closed = False

    # -- state -----------------------------------------------------------------------------------
    @property
    def loading(self) -> bool:
        return self._loads > 0

    @property
    def generating(self) -> bool:
        """True while any request is queued or live."""
        return bool(self._pending)

    @property
    def pending_tags(self) -> list[str]:
        """Requests sent and not finished yet, oldest first."""
        return list(self._pending)

    @property
    def benchmarking(self) -> bool:
        return self._bench is not None

    @property
    def busy(self) -> bool:
        return self._loads > 0 or bool(self._pending) or self._bench is not None

    @property
    def thread(self) -> TrackedThread:
        return self._thread

    # -- requests --------------------------------------------------------------------------------
    def load(self, target_dir: str, draft_dir: str | None, device: str) -> None:
        if self._closed:
            return
        was = self.busy
        self._loads += 1
        self._epoch += 1
        self._load_req.emit({"target_dir": target_dir, "draft_dir": draft_dir, "device": device})
        if not was:
            self.busy_changed.emit(True)

    def generate(self, req: GenerateRequest) -> None:
        """Queue a request; the engine serves it alongside the others that are live (its next step)."""
        if self._closed:
            return
        was = self.busy
        self._pending.append(req.tag)
        self._worker.enqueue(req, self._epoch)
        self._wake.emit()
        if not was:
            self.busy_changed.emit(True)

    def submit_external(self, req: GenerateRequest) -> None:
        """Queue a request with a sink (the local server; any thread): it runs in the same steps as the
        chats, after the loads sent before it, and is not one of the chat's pending replies."""
        if self._closed:
            req.sink.failed("The app is closing.")
            return
        self._worker.enqueue(req, self._epoch)
        self._wake.emit()

    def set_step_observer(self, observer: Callable[[float], None] | None) -> None:
        self._worker.step_observer = observer

    def bench(self, job: BenchJob) -> bool:
        """Queue a comparison run on the engine thread (after what is already queued there)."""
        if self._closed or self._bench is not None:
            return False
        was = self.busy
        self._bench = job
        self._epoch += 1
        self._bench_req.emit(job)
        if not was:
            self.busy_changed.emit(True)
        return True

    def clear_prefix_cache(self) -> None:
        """Ask the engine to forget its prefix cache (answered by cache_cleared)."""
        if not self._closed:
            self._clear_req.emit()

    def cancel_bench(self) -> None:
        """The runner stops before its next prompt / configuration (and a running request at its next step)."""
        if self._bench is not None:
            self._bench.cancel_event.set()

    def cancel(self, tag: str | None = None) -> None:
        """Cancel one request (or every pending one). Takes effect before the engine's next step."""
        for t in ([tag] if tag else list(self._pending)):
            self._worker.request_cancel(t)

    def shutdown(self, timeout_ms: int | None = None) -> bool:
        """Cancel what runs, stop the thread and wait for it. True when the thread has stopped."""
        if self._closed:
            return not self._thread.isRunning()
        self._closed = True
        self._worker.shutting_down.set()
        self.cancel()
        self.cancel_bench()
        self._thread.quit()
        ok = self._thread.wait() if timeout_ms is None else self._thread.wait(timeout_ms)
        if ok:
            self._worker.release()
        return ok

    # -- worker signals (GUI thread) -------------------------------------------------------------
    def _after(self) -> None:
        if not self.busy:
            self.busy_changed.emit(False)

    def _on_loaded(self, info: EngineInfo) -> None:
        self._loads = max(0, self._loads - 1)
        self.info = info
        self.loaded.emit(info)
        self._after()

    def _on_load_failed(self, err: ErrorInfo) -> None:
        self._loads = max(0, self._loads - 1)
        self.load_failed.emit(err)
        self._after()

    def _on_finished(self, tag: str, fin: FinishInfo) -> None:
        if tag in self._pending:
            self._pending.remove(tag)
        self.finished.emit(tag, fin)
        self._after()

    def _on_failed(self, tag: str, err: ErrorInfo) -> None:
        if tag in self._pending:
            self._pending.remove(tag)
        self.failed.emit(tag, err)
        self._after()

    def _on_bench_finished(self, result: Any) -> None:
        self._bench = None
        self.bench_finished.emit(result)
        self._after()

    def _on_bench_failed(self, err: ErrorInfo) -> None:
        self._bench = None
        self.bench_failed.emit(err)
        self._after()
