"""One client request on its way through the engine: admitted, fed step events, finished.

Every method but `cancel` runs on the thread that owns the engine (engine/serve/loop.py or the
app's worker). What the client must hear goes to `send`, a thread-safe callable that hands the
message to the HTTP side (engine/serve/app.py), as one of the message classes below.
"""
from __future__ import annotations

import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from engine.api import Engine
from engine.config import GenerationConfig
from engine.events import StepEvent
from engine.metrics import RequestMetrics
from engine.serve.errors import APIError, from_value_error
from engine.serve.model import ServedModel
from engine.serve.schemas import (FIELD_NAMES, ChatCompletionRequest, _Sampling, chat_messages, completion_prompt,
                                  generation_config, requested_max_tokens, wants_logprobs)


@dataclass
class Started:
    request_id: int
    prompt_tokens: int


@dataclass
class Delta:
    text: str
    tokens: list[int]
    logprobs: list[dict[str, Any]] | None  # per token: token, logprob, bytes (when asked for)


@dataclass
class Done:
    finish_reason: str  # OpenAI's: stop | length (cancelled requests have nobody to tell)
    usage: dict[str, Any]
    speculative: dict[str, Any]


@dataclass
class Failed:
    error: APIError


class Tracker(Protocol):
    """Who counts the requests (engine/serve/bridge.py): told on the engine thread."""

    def job_started(self, job: "Job") -> None: ...

    def job_stepped(self, job: "Job", events: list[StepEvent]) -> None: ...

    def job_ended(self, job: "Job") -> None: ...


_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "cancelled"}
_serial = itertools.count(1)


@dataclass(eq=False)
class Job:
    kind: str  # "chat" | "completion"
    request: _Sampling
    send: Callable[[object], None]
    tracker: Tracker | None = None
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    serial: int = field(default_factory=lambda: next(_serial))
    # set on the engine thread
    state: str = "queued"  # queued | running | done | failed | cancelled
    rid: int | None = None
    model: ServedModel | None = None
    config: GenerationConfig | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, found in the prefix cache (OpenAI's prompt_tokens_details)
    # Its events so far, counted as the engine counts them (steps, windows, acceptance by position).
    tally: RequestMetrics = field(default_factory=RequestMetrics)
    finish_reason: str | None = None
    t_submit: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    t_end: float | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
            self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"

    # -- any thread ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask for the end (a client that went away); the engine thread acts on it before its next step."""
        self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    @property
    def steps(self) -> int:
        """Target steps after the prefill so far."""
        return self.tally.target_steps

    @property
    def drafted(self) -> int:
        """Draft candidates the target verified so far."""
        return self.tally.verified_total

    @property
    def accepted(self) -> int:
        return self.tally.accepted_total

    @property
    def ended(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    # -- the engine thread -----------------------------------------------------------------------
    def admit(self, engine: Engine, model: ServedModel | None) -> int:
        """Count the prompt, check it against the context, add it to the engine; APIError when refused."""
        if model is None:
            raise APIError(503, "No model is loaded: load a target in the app first.", "service_unavailable_error")
        if self.request.model != model.id:
            raise model_not_found(self.request.model, model.id)
        req = self.request
        prompt: Any
        if isinstance(req, ChatCompletionRequest):
            prompt, param = chat_messages(req), "messages"
            # The engine's own encoding: a conversation that continues an earlier reply reuses the ids
            # that reply generated, so the prefix cache finds them (engine/conversation.py).
            if not model.tokenizer.has_chat_template:
                ids = prompt = model.encode_chat(prompt)  # 400 when the model has no chat template
            else:
                ids = engine.encode_prompt(prompt, True)
        else:
            ids, param = model.encode_text(completion_prompt(req)), "prompt"
            prompt = ids
        budget = model.check_context(len(ids), requested_max_tokens(req), param)
        config = generation_config(req, budget)
        try:
            rid = engine.add_request(prompt, config, chat=True) if prompt is not ids else engine.add_request(ids, config)
        except ValueError as exc:
            raise from_value_error(exc, FIELD_NAMES) from exc
        self.rid, self.model, self.config, self.prompt_tokens = rid, model, config, len(ids)
        self.state = "running"
        if self.tracker is not None:
            self.tracker.job_started(self)
        self.send(Started(rid, len(ids)))
        return rid

    def on_events(self, events: list[StepEvent]) -> None:
        """This request's events of one step: text, tokens and (when asked) their log-probabilities."""
        tokens: list[int] = []
        logprobs: list[dict[str, Any]] | None = [] if wants_logprobs(self.request) else None
        for ev in events:
            tokens += ev.tokens
            self.tally.record(ev)
            if logprobs is not None and ev.logprobs is not None:
                logprobs += [self._logprob(t, lp) for t, lp in zip(ev.tokens, ev.logprobs)]
        self.completion_tokens += len(tokens)
        if tokens and self.t_first is None:
            self.t_first = time.perf_counter()
        if self.tracker is not None:
            self.tracker.job_stepped(self, events)
        text = "".join(ev.text for ev in events)
        if text or tokens:
            self.send(Delta(text, tokens, logprobs))

    def on_finished(self, reason: str, metrics: RequestMetrics | None) -> None:
        self.cached_tokens = metrics.cached_tokens if metrics is not None else 0
        self.finish_reason = _FINISH.get(reason, reason)
        self.t_end = time.perf_counter()
        self.state = "cancelled" if reason == "cancelled" else "done"
        if self.tracker is not None:
            self.tracker.job_ended(self)
        if self.state == "done":
            self.send(Done(self.finish_reason, self.usage(), speculative_stats(metrics, self)))
        else:
            self.send(Failed(APIError(499, "The request was cancelled.", "invalid_request_error", None, "cancelled")))

    def on_failed(self, error: APIError) -> None:
        self.t_end = time.perf_counter()
        self.state = "failed"
        self.finish_reason = "error"
        if self.tracker is not None:
            self.tracker.job_ended(self)
        self.send(Failed(error))

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def _logprob(self, token: int, logprob: float) -> dict[str, Any]:
        m = self.model
        text = m.token_text(token) if m else ""
        return {"token": text, "logprob": float(logprob) if logprob > -1e30 else -9999.0,
                "bytes": m.token_bytes(token) if m else list(text.encode()), "id": token}


def model_not_found(asked: str, served: str) -> APIError:
    return APIError(404, f"The model '{asked}' does not exist here: this server serves '{served}' "
                         "(GET /v1/models lists it).", "invalid_request_error", "model", "model_not_found")


# The speculative object's keys: counts (the job's own count of its events stands in when the engine
# gave no metrics) and what only the engine knows (times, preemptions).
_COUNTS = ("drafted", "verified", "mean_verified", "accepted", "target_steps", "tokens_per_step", "acceptance_rate",
           "acceptance_by_position")
_ENGINE_ONLY = ("ttft_ms", "tpot_ms", "decode_tok_s", "preemptions")


def speculative_stats(metrics: RequestMetrics | None, job: Job) -> dict[str, Any]:
    """The per-response extra object (like llama-server's `timings`): what the draft did for this request,
    from the engine's metrics() (or, where the engine could not give them, the job's count of its events)."""
    d = (metrics if metrics is not None else job.tally).as_dict()
    keys = _COUNTS + (_ENGINE_ONLY if metrics is not None else ())  # no times made up from the events alone
    out: dict[str, Any] = {"draft": d["draft"] if d["draft"] is not None else
                           (job.model.draft_name if job.model else None)}
    out.update({k: d[k] for k in keys})
    return out
