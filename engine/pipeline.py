"""SpeculativePipeline: DFlash block drafting verified by the target, one step at a time.

One step = one target inference for the active request: its prefill (which emits the first
token), or a verification of [anchor, candidates...] drafted by one draft inference. The target
alone (no draft) runs through the same loop and is every comparison's baseline. Requests are
queued and served one after another; add_request/step/cancel are shaped for several per step.
"""
from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import openvino as ov

from engine.config import GenerationConfig
from engine.devices import NPU_NOTICE
from engine.errors import DeviceError, DraftMismatchError
from engine.events import StepEvent, StepTimings, TextPiece
from engine.drafting.selector import SamplingSpec, select_candidates
from engine.metrics import RequestMetrics
from engine.models.draft import DraftModel, check_draft_fits, read_draft_info
from engine.models.properties import compile_properties
from engine.models.target import TargetModel, check_target_dir
from engine.models.tokenizer import IncrementalDetokenizer, TextTokenizer
from engine.sampling.distribution import Dist
from engine.sampling.processors import LogitsProcessor, needs_logits
from engine.sampling.rejection import verify, verify_greedy

Prompt = str | Sequence[dict[str, str]] | Sequence[int]
_KEEP_FINISHED = 256


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    cumulative_logprob: float | None = None  # under the processed target distribution (logits requests)


@dataclass
class _Request:
    id: int
    prompt_ids: list[int]
    config: GenerationConfig
    num_candidates: int
    top_k: int  # the Markov head's scorer K (0 = dense walk); unused without a head
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    t_added: float
    generated: list[int] = field(default_factory=list)
    steps: int = 0
    anchor: int = -1
    context: np.ndarray | None = None
    t_first: float = 0.0
    finish_reason: str | None = None
    cancel_requested: bool = False
    processor: LogitsProcessor | None = None  # None: greedy on in-graph argmax ids
    rng: np.random.Generator | None = None  # the target's draws (verification, residuals, bonus)
    draft_rng: np.random.Generator | None = None  # the draft's own, independent stream
    cumulative_logprob: float = 0.0


class SpeculativePipeline:
    """Greedy DFlash speculative decoding over a stateful target and a DFlash-family draft."""

    def __init__(self, target: TargetModel, tokenizer: TextTokenizer, draft: DraftModel | None = None,
                 precision: str = "default") -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.draft = draft
        self.precision = precision
        self._queue: deque[_Request] = deque()
        self._active: _Request | None = None
        self._finished: OrderedDict[int, _Request] = OrderedDict()
        self._next_id = 0

    @classmethod
    def load(cls, target_dir: Path | str, draft_dir: Path | str | None = None, device: str = "CPU",
             precision: str = "default", core: ov.Core | None = None) -> "SpeculativePipeline":
        """Load and compile; raises ModelFolderError / DraftMismatchError / DeviceError with the fix."""
        core = core or ov.Core()
        target_dir = Path(target_dir)
        check_target_dir(target_dir)
        if device.upper().startswith("NPU"):
            if draft_dir is not None:
                raise DeviceError(f"{device}: {NPU_NOTICE}")
            from engine.genai_target import GenAITargetPipeline

            return GenAITargetPipeline(target_dir, device, precision)  # the target alone, via openvino_genai
        props = compile_properties(device, precision)
        taps = None
        info = None
        if draft_dir is not None:
            info = read_draft_info(Path(draft_dir), core)
            reasons = check_draft_fits(target_dir, Path(draft_dir), core)
            if reasons:
                raise DraftMismatchError(f"Draft {Path(draft_dir).name} does not fit target {target_dir.name}:\n- "
                                         + "\n- ".join(reasons))
            taps = info.target_layer_ids
        try:
            target = TargetModel(target_dir, core, device, props, taps)
            draft = DraftModel(info, target_dir, core, device, props) if info else None
        except RuntimeError as exc:
            raise DeviceError(f"Could not compile the models on {device}: {str(exc).strip().splitlines()[-1]}. "
                              "Try CPU, or a smaller model / weight format for this device.") from exc
        return cls(target, TextTokenizer(target_dir), draft, precision)

    # ---- properties the app shows -------------------------------------------------------------
    @property
    def device(self) -> str:
        return self.target.device

    @property
    def target_name(self) -> str:
        return self.target.folder.name

    @property
    def draft_name(self) -> str | None:
        return self.draft.info.name if self.draft else None

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer.has_chat_template

    @property
    def default_num_candidates(self) -> int:
        return self.draft.info.default_candidates if self.draft else 0

    # ---- requests ---------------------------------------------------------------------------
    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt: text (chat template when the model has one), messages, or ids."""
        if isinstance(prompt, str):
            use_chat = self.has_chat_template if chat is None else chat
            if use_chat:
                text = self.tokenizer.chat_prompt([{"role": "user", "content": prompt}])
                return self.tokenizer.encode(text, add_special_tokens=False)
            return self.tokenizer.encode(prompt)
        items = list(prompt)
        if items and isinstance(items[0], dict):
            if not self.has_chat_template:
                raise ValueError("This model has no chat template: send plain text for completion instead of "
                                 "chat messages.")
            return self.tokenizer.encode(self.tokenizer.chat_prompt(items), add_special_tokens=False)
        return [int(t) for t in items]

    def add_request(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None) -> int:
        config = (config or GenerationConfig()).validate()
        ids = self.encode_prompt(prompt, chat)
        if not ids:
            raise ValueError("The prompt is empty: type something to send.")
        n, top_k = self._draft_settings(config)
        rid = self._next_id
        self._next_id += 1
        metrics = RequestMetrics(draft_name=self.draft_name, device=self.device, prompt_tokens=len(ids))
        req = _Request(rid, ids, config, n, top_k, IncrementalDetokenizer(self.tokenizer), metrics,
                       time.perf_counter())
        if needs_logits(config):
            stops = set(config.stop_token_ids) | (set() if config.ignore_eos else self.tokenizer.eos_token_ids)
            req.processor = LogitsProcessor(config, self.target.vocab_size, ids, stops)
            seed = config.rng_seed if config.rng_seed is not None else int(np.random.SeedSequence().entropy % 2**63)
            req.rng = np.random.default_rng(seed)
            req.draft_rng = np.random.default_rng([seed, 0xD4AF7])  # independent of the target's draws
        self._queue.append(req)
        return rid

    def _draft_settings(self, config: GenerationConfig) -> tuple[int, int]:
        """(candidates per step, scorer K) for a request; ValueError naming the field when they don't fit."""
        if self.draft is None:
            return 0, 0
        info = self.draft.info
        n = config.num_assistant_tokens or info.default_candidates
        if n > info.max_candidates:
            raise ValueError(f"num_assistant_tokens={n} is more than draft {info.name} proposes per block: use "
                             f"1..{info.max_candidates} (its block size is {info.block_size}).")
        if not info.has_head:
            return n, 0
        k = info.default_top_k if config.markov_head_top_k is None else config.markov_head_top_k
        if k == 0 and info.variant == "dflash_v2":
            raise ValueError("markov_head_top_k=0 asks for the dense Markov walk, which only DSpark heads have: "
                             "DFlash v2's selector scores Top-K candidates; use markov_head_top_k >= 1.")
        if k == 0 and self.draft.dense_head is None:
            raise ValueError(f"markov_head_top_k=0 (dense Markov walk) needs {info.folder.name}/"
                             "openvino_markov_head_dense_model.xml, which is missing: export the draft again.")
        if k > self.target.vocab_size:
            raise ValueError(f"markov_head_top_k={k} is larger than the vocabulary ({self.target.vocab_size}).")
        return n, k

    def has_unfinished(self) -> bool:
        return self._active is not None or bool(self._queue)

    def cancel(self, request_id: int) -> None:
        """The next step() ends the request with finish_reason "cancelled"."""
        for req in ([self._active] if self._active else []) + list(self._queue):
            if req.id == request_id:
                req.cancel_requested = True

    def metrics(self, request_id: int) -> RequestMetrics:
        req = self._finished.get(request_id) or next(
            (r for r in ([self._active] if self._active else []) + list(self._queue) if r.id == request_id), None)
        if req is None:
            raise KeyError(f"No request {request_id}.")
        return req.metrics

    def result(self, request_id: int) -> GenerationResult:
        req = self._finished[request_id]
        return GenerationResult(req.detok.text, list(req.generated), req.finish_reason or "", req.metrics,
                                req.cumulative_logprob if req.processor is not None else None)

    # ---- the step loop ----------------------------------------------------------------------
    def step(self) -> list[StepEvent]:
        """Advance the active request by one target inference; return its event."""
        if self._active is None:
            if not self._queue:
                return []
            self._active = self._queue.popleft()
            self.target.reset()
            if self.draft is not None:
                self.draft.reset()
        req = self._active
        if req.cancel_requested:
            return [self._finish(req, StepEvent(req.id, req.steps, finished=True, finish_reason="cancelled"))]
        t0 = time.perf_counter()
        timings = StepTimings()
        if req.steps == 0:
            drafted, confidence = [], None
            tokens, accepted, logprobs = self._prefill(req, timings)
        else:
            drafted, tokens, accepted, logprobs, confidence = self._verify_step(req, timings)
        event = self._commit(req, drafted, tokens, accepted, timings, logprobs)
        event.confidence = confidence
        event.timings.total_ms = (time.perf_counter() - t0) * 1e3
        return [self._finish(req, event) if event.finished else self._record(req, event)]

    def _prefill(self, req: _Request, timings: StepTimings) -> tuple[list[int], int, list[float] | None]:
        """Run the prompt; its last row gives the first token, its hidden rows the draft's first context."""
        t0 = time.perf_counter()
        out = self.target.infer(req.prompt_ids, logit_rows=1, want_logits=req.processor is not None)
        timings.target_ms = (time.perf_counter() - t0) * 1e3
        req.context = out.hidden.copy() if out.hidden is not None else None
        if req.processor is None:
            return [int(out.next_ids[-1])], 0, None
        p = req.processor.distribution(out.logits[-1])
        token = p.sample(req.rng.random()) if req.config.do_sample else p.argmax()
        return [token], 0, [_log(p.prob(token))]

    def _verify_step(self, req: _Request, timings: StepTimings):
        """Draft up to N candidates, verify [anchor, candidates] in one target inference, roll back the rest."""
        t0 = time.perf_counter()
        n = min(req.num_candidates, req.config.max_new_tokens - len(req.generated) - 1)
        drafted: list[int] = []
        proposals: list[Dist] = []
        confidence = None
        if n > 0:
            sampling = (SamplingSpec(req.processor, req.draft_rng, req.config.temperature)
                        if req.config.do_sample else None)
            got = select_candidates(self.draft, req.anchor, n, req.context, req.top_k, sampling)
            drafted, proposals, confidence = got.tokens, got.proposals, got.confidence
            timings.draft_model_ms = self.draft.last_model_ms
            timings.markov_head_ms = got.head_ms
            timings.draft_step_ms = (time.perf_counter() - t0) * 1e3
            timings.sampling_ms = timings.draft_step_ms - timings.draft_model_ms - timings.markov_head_ms
        t1 = time.perf_counter()
        out = self.target.infer([req.anchor] + drafted, logit_rows=len(drafted) + 1,
                                want_logits=req.processor is not None)
        timings.target_ms = (time.perf_counter() - t1) * 1e3
        logprobs = None
        if req.processor is None:
            post = out.next_ids
            accepted = 0
            while accepted < len(drafted) and drafted[accepted] == post[accepted]:
                accepted += 1
            tokens = drafted[:accepted] + [int(post[accepted])]
        else:
            rows, cache = out.logits, {}

            def p_row(k: int) -> Dist:
                if k not in cache:
                    cache[k] = req.processor.distribution(rows[k], drafted[:k])
                return cache[k]

            if req.config.do_sample:
                accepted, last = verify(p_row, drafted, proposals, req.rng, self.target.vocab_size)
            else:
                accepted, last = verify_greedy(p_row, drafted)
            tokens = drafted[:accepted] + [last]
            logprobs = [_log(p_row(k).prob(t)) for k, t in enumerate(tokens)]
        self.target.trim(self.target.length - (len(drafted) - accepted))
        if out.hidden is not None:
            req.context = out.hidden[: accepted + 1].copy()
        return drafted, tokens, accepted, logprobs, confidence

    def _commit(self, req: _Request, drafted: list[int], tokens: list[int], accepted: int,
                timings: StepTimings, logprobs: list[float] | None = None) -> StepEvent:
        """Apply stop rules to the step's tokens, decode them and build the event."""
        cfg = req.config
        reason = None
        produced = len(tokens)
        stops = set(cfg.stop_token_ids) | (set() if cfg.ignore_eos else self.tokenizer.eos_token_ids)
        for i, tok in enumerate(tokens):
            if tok in stops:
                tokens, reason = tokens[:i], "eos"
                break
        room = cfg.max_new_tokens - len(req.generated)
        if len(tokens) >= room:
            if len(tokens) > room or reason is None:
                tokens, reason = tokens[:room], "length"
        accepted = min(accepted, len(tokens))
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
            req.cumulative_logprob += sum(logprobs)
        if req.processor is not None:
            req.processor.commit(tokens)
        shown = len(req.detok.text)
        pieces = req.detok.feed(tokens, accepted)
        if cfg.stop_strings:
            end = self._stop_string_end(req.detok.text, shown, cfg)
            if end is not None:
                pieces, reason = _cut_pieces(pieces, end - shown), "stop"
                req.detok.text = req.detok.text[:end]
        req.generated.extend(tokens)
        if tokens:
            req.anchor = tokens[-1]
        now = time.perf_counter()
        if req.steps == 0:
            req.t_first = now
            req.metrics.ttft_ms = (now - req.t_added) * 1e3
        else:
            req.metrics.decode_ms = (now - req.t_first) * 1e3
        event = StepEvent(req.id, req.steps, drafted, accepted, tokens, pieces, reason is not None, reason, timings,
                          logprobs=logprobs, produced=produced)
        req.steps += 1
        return event

    @staticmethod
    def _stop_string_end(text: str, shown: int, cfg: GenerationConfig) -> int | None:
        """Where the text ends if a stop string completed in this step's text, else None."""
        best: int | None = None
        for s in cfg.stop_strings:
            idx = text.find(s, max(0, shown - len(s) + 1))
            if idx >= 0:
                end = idx + len(s) if cfg.include_stop_str_in_output else idx
                best = end if best is None else min(best, end)
        return None if best is None else max(best, shown)

    def _record(self, req: _Request, event: StepEvent) -> StepEvent:
        req.metrics.record(event)
        return event

    def _finish(self, req: _Request, event: StepEvent) -> StepEvent:
        req.finish_reason = event.finish_reason
        self._record(req, event)
        self._active = None
        self._finished[req.id] = req
        while len(self._finished) > _KEEP_FINISHED:
            self._finished.popitem(last=False)
        return event

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None,
                 on_event: Callable[[StepEvent], object] | None = None) -> GenerationResult:
        """Run one request to the end; `on_event` returning a truthy value cancels it."""
        rid = self.add_request(prompt, config, chat)
        while rid not in self._finished:
            for event in self.step():
                if event.request_id == rid and on_event is not None and on_event(event):
                    self.cancel(rid)
        return self.result(rid)


def _log(p: float) -> float:
    return float(np.log(p)) if p > 0.0 else -float("inf")


def _cut_pieces(pieces: list[TextPiece], keep: int) -> list[TextPiece]:
    """The first `keep` characters of a list of pieces."""
    out: list[TextPiece] = []
    for p in pieces:
        if keep <= 0:
            break
        out.append(TextPiece(p.text[:keep], p.from_draft))
        keep -= len(p.text)
    return out
