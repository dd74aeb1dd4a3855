"""SpeculativePipeline: DFlash block drafting verified by the target, many requests per step.

One step = one target inference for every scheduled request (prompt chunks and validation rows of
[anchor, candidates...] windows, drafted by one draft inference for all of them), under a token
budget, with split windows and preemption (engine/scheduler.py, docs/batching.md). The target
alone (no draft) runs through the same loop and is every comparison's baseline.
"""
from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import openvino as ov

from engine.config import GenerationConfig
from engine.context import check_fits_context, context_length, fit_chat
from engine.conversation import extend_ids
from engine.devices import NPU_NOTICE
from engine.errors import ContextLengthError, DeviceError, DraftMismatchError
from engine.description import DraftDescription, EngineDescription
from engine.generate import generate
from engine.events import GenerationResult, StepEvent, StepTimings
from engine.draft_policy import ADAPTIVE, ALWAYS, DraftPolicy, Offer, default_count, make_policy, survivals
from engine.drafting.draft_batch import DraftCall
from engine.drafting.factory import make_draft_batch
from engine.drafting.selector import DraftJob, SamplingSpec, draft_candidates
from engine.metrics import RequestMetrics
from engine.models.draft import DraftInfo, DraftModel, check_draft_fits, read_draft_info
from engine.models.files import openvino_reason
from engine.models.properties import compile_properties, row_mode
from engine.models.paged_target import PagedTarget, SeqChunk
from engine.models.folders import read_target_folder
from engine.prefix_cache import DraftPart, PrefixCache, chain_hashes
from engine.scheduler import SchedulerConfig, StepStats, plan_rows
from engine.stop_strings import StopStrings
from engine.models.tokenizer import IncrementalDetokenizer, Prompt, TextTokenizer
from engine.sampling.distribution import Dist
from engine.sampling.processors import LogitsProcessor, needs_logits
from engine.sampling.rejection import verify_window

_KEEP_FINISHED = 256


@dataclass
class _Finished:
    """What a finished request keeps: its results and metrics (its rows, proposals and logits go)."""

    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    cumulative_logprob: float | None
    prompt_ids: list[int]  # with prompt_text: a chat's next turn reuses these ids (engine/conversation.py)
    prompt_text: str | None
    text_is_ids: bool | None = None  # its text decodes from its ids, checked once
    spans: list[tuple[int, int]] = field(default_factory=list)  # generated positions of prompt + reply


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
    policy: str = ALWAYS  # how much of a drafted window the target verifies (engine/draft_policy.py)
    cap: int | None = None  # the draft policy's most candidates for the next window (None: num_candidates)
    short: int = 0  # adaptive: the draft's tuned count (at most num_candidates), drafted where the cut does not run
    last_accepted: int = -1  # candidates its last closed window accepted (-1: none closed yet); the cut's gate
    steps: int = 0  # events emitted (0: the one with the first token)
    anchor: int = -1  # the newest token: emitted, not yet in the KV cache
    feed: list[int] = field(default_factory=list)  # tokens to compute into the KV cache (prompt or recompute)
    fed: int = 0  # of them already in the cache
    resume: bool = False  # feed is a recompute after preemption: no token comes out of its end
    kv_len: int = 0  # tokens in the target's KV cache
    window: list[int] | None = None  # [anchor, c1..cN] under validation
    window_pos: int = 0  # rows of the window validated so far
    window_accepted: int = 0
    window_steps: int = 0
    window_proposed: int = 0  # candidates the draft proposed for the window (the policy may verify fewer)
    window_chances: list[float] | None = None  # the policy's P(accepted | the ones before) per verified candidate
    proposals: list[Dist] = field(default_factory=list)  # the draft distributions of c1..cN (sampled)
    confidence: list[float] | None = None  # the draft's confidence head, per candidate (shown in the app)
    peak: list[float] = field(default_factory=list)  # the draft's peak probability per candidate (the policy's signal)
    context: list[np.ndarray] = field(default_factory=list)  # target rows not yet in the draft's state
    stops: StopStrings = field(default_factory=lambda: StopStrings(()))  # decoded text not shown yet
    t_first: float = 0.0
    finish_reason: str | None = None
    cancel_requested: bool = False
    processor: LogitsProcessor | None = None  # None: greedy on in-graph argmax ids
    rng: np.random.Generator | None = None  # the target's draws (verification, residuals, bonus)
    draft_rng: np.random.Generator | None = None  # the draft's own, independent stream
    cumulative_logprob: float = 0.0
    prompt_text: str | None = None  # the rendering the prompt ids came from (a next turn extends it)
    admitted: bool = False  # has run before (a preempted request is admitted again)
    hashes: list[bytes] = field(default_factory=list)  # prefix keys of its full blocks (prompt + generated)
    cached: int = 0  # leading blocks in the prefix cache (found there or put there)
    staged: list[np.ndarray] = field(default_factory=list)  # target rows of the KV positions past those blocks
    draft_kv_blocks: int = 0  # leading cached blocks whose draft part is the draft's KV
    spans: list[tuple[int, int]] = field(default_factory=list)  # prompt positions an earlier reply generated

    def generated_at(self, pos: int) -> bool:
        """Whether position `pos` holds a generated token (this request's, or an earlier reply's in its
        prompt): the paged target scores those rows one by one, prompt rows together."""
        return pos >= len(self.prompt_ids) or any(a <= pos < b for a, b in self.spans)

    def prefill_rows(self, rows: int) -> tuple[int, int]:
        """(rows, prompt rows) of the next prefill chunk of at most `rows`: prompt-position rows first,
        then generated ones; it ends where a prompt position follows a generated one."""
        kinds = [self.generated_at(self.fed + j) for j in range(rows)]
        m = kinds.index(True) if True in kinds else rows
        end = next((j for j in range(m, rows) if not kinds[j]), rows)
        return end, m

    @property
    def decoding(self) -> bool:
        return self.fed >= len(self.feed)

    def next_candidates(self) -> int:
        """Candidates the next window can hold without running past max_new_tokens (nor the policy's cap)."""
        n = self.num_candidates if self.cap is None else min(self.num_candidates, self.cap)
        return max(0, min(n, self.config.max_new_tokens - len(self.generated) - 1))

    @property
    def reproducible(self) -> bool:
        """A seeded sampled request: its text must not depend on timings nor on the batch."""
        return self.config.do_sample and self.config.rng_seed is not None

    def rows_wanted(self) -> int:
        if not self.decoding:
            return len(self.feed) - self.fed
        if self.window is not None:
            return len(self.window) - self.window_pos
        return 1 + self.next_candidates()


def window_sizes(info: DraftInfo | None, weights_bytes: int, budget_mb: int) -> tuple[int, ...]:
    """The call sizes the target gets a compiled copy of its own for, within `budget_mb` (each copy takes about
    its weights file): the cut's two windows (the tuned count's and the block's), else the long one alone (the
    main model then keeps the short one's shape between prompts), else none (an `adaptive` request that does not
    say then drafts the tuned count: `_cut_block`). With one copy the cut verified more than with two and gained
    less in the run measured (docs/benchmarks.md, issue 25), so two is what a small target gets."""
    if info is None or info.default_candidates >= info.max_candidates:
        return ()
    fits = (budget_mb << 20) // max(weights_bytes, 1)
    short, long = info.default_candidates + 1, info.max_candidates + 1
    return (short, long) if fits >= 2 else (long,) if fits >= 1 else ()


class SpeculativePipeline:
    """DFlash speculative decoding for many requests at once over a PagedAttention target.

    Each step() is one target inference (and at most one draft and one head inference) for every
    scheduled request: see engine/scheduler.py for who runs and docs/batching.md for the design.
    """

    def __init__(self, target: PagedTarget, tokenizer: TextTokenizer, draft: DraftModel | None = None,
                 precision: str = "default", scheduler: SchedulerConfig | None = None) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.draft = draft
        self.drafts = make_draft_batch(draft) if draft is not None else None
        self.precision = precision
        self.scheduler = replace(scheduler or SchedulerConfig()).validate()  # own copy: caching switches on it
        self._policy: DraftPolicy | None = None
        self.policy = make_policy(self.scheduler.draft_policy) if self.drafts is not None else None
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._finished: OrderedDict[int, _Finished] = OrderedDict()
        self.context_length = context_length(getattr(target, "config", None) or {})
        self._next_id = 0
        self._rotate = 0
        self.last_step = StepStats()
        self.cache: PrefixCache | None = None
        self.set_prefix_caching(self.scheduler.prefix_caching)

    @classmethod
    def load(cls, target_dir: Path | str, draft_dir: Path | str | None = None, device: str = "CPU",
             precision: str = "default", core: ov.Core | None = None,
             scheduler: SchedulerConfig | None = None) -> "SpeculativePipeline":
        """Load and compile; raises ModelFolderError / DraftMismatchError / DeviceError with the fix (NPU
        included: the speculative loop needs continuous batching; engine.api.load_engine serves NPU)."""
        core = core or ov.Core()
        target_dir = Path(target_dir)
        device = device.strip().upper()  # OpenVINO's names are upper case; "cpu" means CPU
        scheduler = (scheduler or SchedulerConfig()).validate()
        if device.upper().startswith("NPU"):  # engine.api.load_engine runs the target alone there
            raise DeviceError(f"{device}: {NPU_NOTICE}")
        folder = read_target_folder(target_dir, core)  # checked and read once; the loaders below share it
        props = compile_properties(device, precision)
        taps = None
        info = None
        if draft_dir is not None:
            info = read_draft_info(Path(draft_dir), core)
            reasons = check_draft_fits(folder, info, core)
            if reasons:
                raise DraftMismatchError(f"Draft {Path(draft_dir).name} does not fit target {target_dir.name}:\n- "
                                         + "\n- ".join(reasons))
            taps = info.target_layer_ids
        try:
            largest_call = scheduler.max_num_batched_tokens + scheduler.max_num_seqs  # padding rows included
            target = PagedTarget(folder, core, device, props, taps, scheduler.num_kv_blocks,
                                 scheduler.cache_size_mb, rows=row_mode(device), max_call_rows=largest_call,
                                 window_sizes=window_sizes(info, folder.weights_bytes,
                                                           scheduler.window_models_mb))
            draft = DraftModel(info, folder, core, device, props) if info else None
        except RuntimeError as exc:
            fix = ("a model file may be damaged, or this OpenVINO cannot compile the architecture: export the "
                   "folders again" if device == "CPU" else "try CPU, or a smaller model / weight format for this device")
            raise DeviceError(f"Could not compile the models on {device}: {openvino_reason(exc)}. "
                              f"{fix[0].upper()}{fix[1:]}.") from exc
        return cls(target, TextTokenizer(target_dir), draft, precision, scheduler)

    @property
    def policy(self) -> DraftPolicy | None:
        """The adaptive policy's state (the bench swaps one in per configuration)."""
        return self._policy

    @policy.setter
    def policy(self, state: DraftPolicy | None) -> None:
        if state is not None:  # the call sizes that never change shape: the target's window models
            state.own_models = frozenset(getattr(self.target, "window_sizes", ()))
        self._policy = state

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

    @property
    def _cut_block(self) -> int:
        """What an `adaptive` request that does not say drafts: the draft's block where the target has window models
        for the cut (engine/draft_policy.py), else the tuned count (without them the cut did not pay on Qwen2.5-Coder:
        docs/benchmarks.md, issue 25)."""
        info = self.draft.info
        return info.max_candidates if getattr(self.target, "window_sizes", ()) else info.default_candidates

    def _unset_count(self, policy: str) -> int:
        """Candidates per step a request under `policy` drafts when it does not say (draft_policy.default_count)."""
        return default_count(policy, self.draft.info.default_candidates, self._cut_block)

    # ---- requests ---------------------------------------------------------------------------
    def describe(self) -> EngineDescription:
        info = self.draft.info if self.draft else None
        draft = None if info is None else DraftDescription(
            info.name, info.variant, info.block_size, info.max_candidates, info.default_candidates, info.has_head,
            info.default_top_k, info.has_confidence, info.folder, self._cut_block)
        blocks = self.target.blocks
        return EngineDescription(self.target_name, self.device, self.precision, "paged", draft, self.target.folder,
                                 self.has_chat_template, blocks.num_blocks * blocks.block_size)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tokenizer.chat_prompt(list(messages))

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt: text (chat template when the model has one), messages, or ids. A prompt
        that continues a finished request's conversation reuses the ids that request saw and generated
        (engine/conversation.py), so the prefix cache finds them."""
        return self._encode(prompt, chat)[0]

    def _encode(self, prompt: Prompt, chat: bool | None) -> tuple[list[int], list[tuple[int, int]], str | None]:
        """(ids, the positions of reused generated ids among them, the rendered text they stand for: None
        for ids given as such); the tokenizer's rules (TextTokenizer.prompt_text), with a finished
        request's ids reused for the text they cover."""
        rendered = self.tokenizer.prompt_text(prompt, chat)
        if rendered is None:
            return [int(t) for t in prompt], [], None
        text, special = rendered
        return *self._text_ids(text, special), text

    def _text_ids(self, text: str, special: bool) -> tuple[list[int], list[tuple[int, int]]]:
        known = [r for r in reversed(self._finished.values())
                 if r.prompt_text is not None and text.startswith(r.prompt_text + r.text) and self._text_is_ids(r)]
        ids = extend_ids(text, ((r.prompt_text + r.text, r.prompt_ids + r.token_ids) for r in known),
                         lambda rest: self.tokenizer.encode(rest, add_special_tokens=False))
        if ids is None:
            return self.tokenizer.encode(text, add_special_tokens=special), []
        reused = max(known, key=lambda r: len(r.prompt_text + r.text))  # the one extend_ids took
        return ids, list(reused.spans)

    def _text_is_ids(self, req: _Finished) -> bool:
        """Whether a finished reply's text is exactly its generated ids decoded (not when a stop string cut
        the text, nor when the reply ended inside a character), checked once."""
        if req.text_is_ids is None:
            req.text_is_ids = req.finish_reason != "stop" and self.tokenizer.decode(req.token_ids) == req.text
        return req.text_is_ids

    def fit_chat(self, messages: Sequence[dict[str, str]], max_new_tokens: int) -> tuple[list[dict[str, str]], int]:
        """The chat messages that fit the target's context with max_new_tokens to spare, and how many of
        the oldest turns were left out (engine/context.py)."""
        return fit_chat(messages, lambda m: len(self.encode_prompt(m)), self.context_length, max_new_tokens)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int, candidates: int | None = None) -> None:
        """ContextLengthError when a request of this size cannot run: the target's context, then the KV cache
        (`candidates` per window: the draft's default when None)."""
        check_fits_context(prompt_tokens, max_new_tokens, self.context_length, self.target_name)
        blocks = self.target.blocks
        if candidates is None and self.draft is not None:  # what a request that does not say drafts
            candidates = self._unset_count(self.scheduler.draft_policy)
        extra = (candidates or 0) + 1  # the last window's rows
        need = blocks.blocks_for(prompt_tokens + max_new_tokens + extra)
        if need <= blocks.num_blocks:
            return
        held = blocks.num_blocks * blocks.block_size
        per_block = getattr(self.target, "bytes_per_block", 0)
        if self.scheduler.num_kv_blocks is not None:  # the size was given in blocks: say it in blocks
            bigger = f"num_kv_blocks={need} (bench --num-kv-blocks; SchedulerConfig.num_kv_blocks from Python)"
        elif per_block:
            bigger = f"--cache-size-mb {-(-need * per_block // (1 << 20))} (SchedulerConfig.cache_size_mb from Python)"
        else:
            bigger = "a bigger SchedulerConfig.cache_size_mb"
        raise ContextLengthError(
            f"This request needs {prompt_tokens + max_new_tokens + extra:,} tokens of KV cache ({prompt_tokens:,} "
            f"prompt + {max_new_tokens:,} new + {extra} for the last step's window), but the KV cache holds "
            f"{held:,} tokens: lower max_new_tokens to {max(1, held - prompt_tokens - extra):,} or less, shorten "
            f"the prompt, or give a bigger cache: {bigger}.")

    def add_request(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None) -> int:
        config = (config or GenerationConfig()).validate()
        ids, spans, text = self._encode(prompt, chat)
        if not ids:
            raise ValueError("The prompt is empty: type something to send.")
        policy = config.draft_policy or self.scheduler.draft_policy
        n, top_k = self._draft_settings(config, policy)
        self.check_fits(len(ids), config.max_new_tokens, n)
        rid = self._next_id
        self._next_id += 1
        metrics = RequestMetrics(draft_name=self.draft_name, device=self.device, prompt_tokens=len(ids))
        req = _Request(rid, ids, config, n, top_k, IncrementalDetokenizer(self.tokenizer), metrics,
                       time.perf_counter(), policy=policy, prompt_text=text, spans=spans,
                       short=min(n, self.draft.info.default_candidates) if self.draft is not None else 0)
        if req.reproducible and policy == ADAPTIVE:  # its count must not depend on the batch: its tuned count
            req.cap = req.short
        if needs_logits(config):
            stops = set(config.stop_token_ids) | (set() if config.ignore_eos else self.tokenizer.eos_token_ids)
            req.processor = LogitsProcessor(config, self.target.vocab_size, ids, stops)
            seed = config.rng_seed if config.rng_seed is not None else int(np.random.SeedSequence().entropy % 2**63)
            req.rng = np.random.default_rng(seed)
            req.draft_rng = np.random.default_rng([seed, 0xD4AF7])  # independent of the target's draws
        req.feed = list(ids)
        req.stops = StopStrings(config.stop_strings, config.include_stop_str_in_output)
        self._waiting.append(req)
        return rid

    def _draft_settings(self, config: GenerationConfig, policy: str) -> tuple[int, int]:
        """(candidates per step, scorer K) for a request; ValueError naming the field when they don't fit.
        Unless the request says, `always` drafts the draft's tuned count (drafting a full block costs the draft
        call and the verify rows more than the longer windows return) and `adaptive` the whole block where the
        target has window models (`_cut_block`), which it drafts only where its cut runs (engine/draft_policy.py;
        docs/benchmarks.md)."""
        if self.draft is None:
            return 0, 0
        info = self.draft.info
        n = config.num_assistant_tokens or self._unset_count(policy)
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
        return bool(self._running or self._waiting)

    def _live(self) -> list[_Request]:
        return self._running + list(self._waiting)

    def cancel(self, request_id: int) -> None:
        """The next step() ends the request with finish_reason "cancelled" and frees its KV blocks."""
        for req in self._live():
            if req.id == request_id:
                req.cancel_requested = True

    def metrics(self, request_id: int) -> RequestMetrics:
        req = self._finished.get(request_id) or next((r for r in self._live() if r.id == request_id), None)
        if req is None:
            raise KeyError(f"No request {request_id}.")
        return req.metrics

    def result(self, request_id: int) -> GenerationResult:
        done = self._finished[request_id]
        return GenerationResult(done.text, list(done.token_ids), done.finish_reason, done.metrics,
                                done.cumulative_logprob)

    def kv_stats(self) -> dict[str, int]:
        """The KV cache's size and use, in blocks (free: blocks a request can take, cached idle ones included)."""
        blocks = self.target.blocks
        return {"block_size": blocks.block_size, "total_blocks": blocks.num_blocks,
                "free_blocks": blocks.free_blocks, "used_blocks": blocks.num_blocks - blocks.free_blocks,
                "cached_blocks": self.cache.cached_blocks if self.cache is not None else 0}

    @property
    def prefix_caching(self) -> bool:
        return self.cache is not None

    def set_prefix_caching(self, on: bool) -> None:
        """Turn prefix caching on or off between requests (off forgets what was cached)."""
        if on == (self.cache is not None):
            return
        if self.has_unfinished():
            raise RuntimeError("Prefix caching is switched between requests: wait until they have finished.")
        if on:
            self.cache = PrefixCache(self.target.blocks, self.target.bytes_per_block,
                                     self.scheduler.prefix_cache_mb << 20, with_draft=self.drafts is not None)
        else:
            self.cache.clear()
            self.cache = self.target.blocks.cache = None
        self.scheduler.prefix_caching = on

    def prefix_cache_stats(self) -> dict[str, int] | None:
        """The prefix cache's blocks, memory (target KV + draft parts, bytes) and hits; None when it is off."""
        return self.cache.stats() if self.cache is not None else None

    def clear_prefix_cache(self) -> int:
        """Forget every cached prefix (running requests keep their blocks); returns the bytes it held."""
        return self.cache.clear() if self.cache is not None else 0

    # ---- the step loop ----------------------------------------------------------------------
    def step(self) -> list[StepEvent]:
        """One target inference for every scheduled request; one event per request that emitted or ended."""
        t0 = time.perf_counter()
        stats = self.last_step = StepStats()
        events = [self._finish(r, StepEvent(r.id, r.steps, pieces=r.stops.flush(r.detok.text), finished=True,
                                            finish_reason="cancelled"))
                  for r in self._live() if r.cancel_requested]
        while self._waiting and len(self._running) < self.scheduler.max_num_seqs:
            self._admit(self._waiting.popleft(), stats)
        if self.policy is not None:
            self._cap_candidates()
        plan = plan_rows(self._running, self.scheduler.max_num_batched_tokens, self.scheduler.max_num_seqs,
                         self._rotate)
        self._rotate += 1
        plan = self._reserve([(r, r.prefill_rows(n)[0] if not r.decoding else n) for r, n in plan], stats)
        if not plan:
            return events
        timings = StepTimings()
        drafted_now = self._draft(plan, timings, stats)
        # the most candidates a window drafted in this step: what the draft stage's time is filed and priced under
        drafted = max((r.window_proposed for r, _ in plan if r.id in drafted_now), default=0)
        if drafted_now and self.policy is not None:
            self._choose_windows(plan, drafted_now, timings.draft_step_ms, drafted)
        plan = [(r, min(rows, len(r.window) - r.window_pos) if r.decoding else rows) for r, rows in plan]
        chunks = []
        for req, rows in plan:
            if req.decoding:
                chunks.append(SeqChunk(req.id, req.window[req.window_pos: req.window_pos + rows], req.kv_len, rows,
                                       prompt_rows=0))
            else:
                last = req.fed + rows == len(req.feed) and not req.resume
                chunks.append(SeqChunk(req.id, req.feed[req.fed: req.fed + rows], req.kv_len, int(last),
                                       prompt_rows=req.prefill_rows(rows)[1]))
        want_logits = any(r.processor is not None and c.logit_rows for (r, _), c in zip(plan, chunks))
        t1 = time.perf_counter()
        out = self.target.infer(chunks, want_logits)
        timings.target_ms = (time.perf_counter() - t1) * 1e3
        stats.requests = [r.id for r, _ in plan]
        stats.tokens = sum(rows for _, rows in plan)
        for i, (req, rows) in enumerate(plan):
            own = StepTimings(target_ms=timings.target_ms)
            if req.id in drafted_now:
                own.draft_step_ms, own.draft_model_ms = timings.draft_step_ms, timings.draft_model_ms
                own.markov_head_ms, own.sampling_ms = timings.markov_head_ms, timings.sampling_ms
            if req.decoding:
                if rows < req.rows_wanted():
                    stats.split.append(req.id)
                event = self._validate(req, rows, out.next_ids[i], out.logits[i], out.hidden[i], own)
            else:
                stats.prefill_tokens += rows
                event = self._prefill(req, rows, out.next_ids[i], out.logits[i], out.hidden[i], own)
            self._cache_full_blocks(req)
            if event is not None:
                event.timings.total_ms = (time.perf_counter() - t0) * 1e3
                events.append(self._finish(req, event) if event.finished else self._record(req, event))
        if self.policy is not None:
            host_ms = (time.perf_counter() - t0) * 1e3 - timings.target_ms - timings.draft_step_ms
            plain = not drafted_now and all(r.decoding and rows == 1 for r, rows in plan)
            self.policy.observe_step(self.target.call_size(chunks), timings.target_ms, host_ms, timings.draft_step_ms,
                                     plain, drafted)
        return events

    def _target_rows(self, rows: int) -> int:
        """The rows the target runs for a decode chunk of `rows`: in the "padded" row layout a one-row chunk
        gets a padding row; the "split" layout scores generated rows one by one (engine/models/paged_target.py)."""
        return rows + int(rows == 1 and getattr(self.target, "rows", "plain") == "padded")

    def _cap_candidates(self) -> None:
        """How many candidates the adaptive windows that may open this step draft (engine/draft_policy.py)."""
        live = self._running[: self.scheduler.max_num_seqs]
        opening = [r for r in live if r.decoding and r.window is None and r.policy == ADAPTIVE and not r.reproducible]
        if len(live) == 1 and opening and self._cut_runs(opening[0]):
            req = opening[0]  # the cut: the whole count, verified short or whole, where its gate opens
            req.cap = None if self.policy.drafts_block(req.last_accepted, req.short, req.num_candidates) else req.short
            return
        cap = self.policy.draft_cap() if opening else None
        if len(live) > 1 and opening and all(r.decoding and (r.window is not None or r in opening) for r in live):
            # a step of decodes only whose every new window is the policy's: does its draft call pay at all? (One
            # request always drafts: it is what its user chose, and drafting paid at one request everywhere measured.)
            base = sum(self._target_rows(1 if r.window is None else len(r.window) - r.window_pos) for r in live)
            if not self.policy.draft_pays(base, float(len(live))):
                cap = 0
        for r in opening:  # where the cut does not run the long draft did not pay: the tuned count at most
            r.cap = r.short if cap is None else min(cap, r.short)

    @staticmethod
    def _cut_runs(req: _Request) -> bool:
        """Whether this request's windows get the cut when it runs alone: greedy, adaptive, drafting more than
        the tuned count."""
        return req.policy == ADAPTIVE and not req.config.do_sample and req.num_candidates > req.short

    def _choose_windows(self, plan: list[tuple[_Request, int]], drafted_now: set[int], draft_ms: float,
                        drafted: int) -> None:
        """How far the target verifies each window drafted in this step (engine/draft_policy.py): the
        adaptive requests' windows are cut to the candidates that pay for their rows, before the verify call
        and from what is known before it (the candidates' confidences or the request's acceptance so far).
        `drafted`: the most candidates a window drafted in this step (the draft stage's price is looked up by it)."""
        offers: list[tuple[_Request, Offer]] = []
        fixed_rows, fixed_tokens = 0, 0.0
        padded = self._target_rows(1) == 2
        for req, rows in plan:
            if req.id not in drafted_now:
                fixed_rows += self._target_rows(rows)
                fixed_tokens += 1.0 if req.decoding else 0.0
                continue
            n = len(req.window) - 1
            seeded = req.reproducible
            reach = req.short if len(plan) == 1 and self._cut_runs(req) else None  # the cut (draft_policy.choose_cut)
            chances = self.policy.chances(n, req.config.do_sample, req.peak, req.metrics.positions, seeded, reach)
            req.window_chances = chances
            if req.policy == ADAPTIVE and seeded:  # its text must not depend on timings nor on the batch
                m = self.policy.choose_reproducible(chances, padded)
                req.window, req.proposals = req.window[: m + 1], req.proposals[:m]
                fixed_rows += self._target_rows(min(rows, m + 1))
                fixed_tokens += 1.0 + sum(survivals(chances[:m]))
            elif req.policy == ADAPTIVE:
                offers.append((req, Offer(req.id, chances, padded, sampled=req.config.do_sample)))
            else:
                fixed_rows += self._target_rows(rows)
                fixed_tokens += 1.0 + sum(survivals(chances[: rows - 1]))
        if not offers:
            return
        if len(offers) == 1 and not fixed_rows and getattr(self.target, "pad_matmul_rows", False):
            offers[0][1].padded = True  # a call of one row gets a dummy row: its first candidate is free
        fixed_ms = self.policy.fixed_ms(draft_ms, drafted)
        alone = offers[0][0] if len(offers) == 1 and not fixed_rows else None
        if alone is not None and self._cut_runs(alone):  # the cut (a window its gate drafted short: verified whole)
            verify = [self.policy.choose_cut(offers[0][1].chances, alone.short, fixed_ms)]
        else:
            verify = self.policy.choose([o for _, o in offers], fixed_rows, fixed_tokens, fixed_ms)
        for (req, offer), m in zip(offers, verify):
            if not self.policy.explored:
                capped = req.cap is not None and len(offer.chances) == req.cap < req.num_candidates
                self.policy.observe_choice(m, len(offer.chances), capped)
            req.window = req.window[: m + 1]
            req.proposals = req.proposals[:m]

    def _reserve(self, plan: list[tuple[_Request, int]], stats: StepStats) -> list[tuple[_Request, int]]:
        """Grow every planned request's KV blocks, oldest first, preempting the newest when they run out."""
        order = {r.id: i for i, r in enumerate(self._running)}
        kept: dict[int, tuple[_Request, int]] = {}
        for req, rows in sorted(plan, key=lambda p: order[p[0].id]):
            if req not in self._running:
                continue  # preempted for an older request in this loop
            while not self.target.blocks.can_grow(req.id, req.kv_len + rows):
                victim = self._running[-1]
                self._preempt(victim, stats)
                kept.pop(victim.id, None)
                if victim is req:
                    break
            else:
                self.target.blocks.grow(req.id, req.kv_len + rows)
                kept[req.id] = (req, rows)
        return [p for p in plan if p[0].id in kept]

    def _admit(self, req: _Request, stats: StepStats) -> None:
        """Start running `req`: with prefix caching, its longest cached prefix of full blocks becomes its own
        KV (shared) and only the rest is computed; the draft gets what it needs to resume there."""
        first = not req.admitted
        req.admitted = True
        self._running.append(req)
        req.cached, req.staged, req.draft_kv_blocks = 0, [], 0
        if self.cache is None:
            return
        bs = self.target.blocks.block_size
        usable = (len(req.feed) - 1) // bs  # the last fed token is always computed: its row gives the next token
        hashes = chain_hashes(req.prompt_ids + req.generated, bs, req.hashes)[:usable]
        hit = self.cache.lookup(hashes)
        if not hit.blocks:
            return
        self.target.blocks.adopt(req.id, hit.blocks)
        req.fed = req.kv_len = hit.num_blocks * bs
        req.cached = hit.num_blocks
        req.draft_kv_blocks = hit.kv_blocks
        if hit.draft_kv is not None:
            self.drafts.preload(req.id, hit.draft_kv)
        if hit.draft_hidden is not None:
            req.context = [hit.draft_hidden]
        if first:
            req.metrics.cached_tokens = req.kv_len
        stats.cached_tokens += req.kv_len

    def _cache_full_blocks(self, req: _Request) -> None:
        """Put the request's newly filled blocks into the prefix cache, each with its target rows for the
        draft (replaced by the draft's own KV once the draft has taken them in: `_keep_draft_kv`)."""
        if self.cache is None:
            return
        bs = self.target.blocks.block_size
        tokens = req.prompt_ids + req.generated
        full = min(req.kv_len, len(tokens)) // bs  # past the committed tokens the KV may hold stopped rows
        if full <= req.cached:
            return
        hashes = chain_hashes(tokens, bs, req.hashes)
        owned = self.target.blocks.blocks(req.id)
        rows = np.concatenate(req.staged) if req.staged else None
        for j in range(req.cached, full):
            part = None
            if self.drafts is not None:
                at = (j - req.cached) * bs
                part = DraftPart(hidden=rows[at: at + bs].copy())
            self.cache.insert(hashes[j], owned[j], part)
        used = (full - req.cached) * bs
        req.staged = [rows[used:]] if rows is not None and used < rows.shape[0] else []
        req.cached = full

    def _keep_draft_kv(self, req: _Request) -> None:
        """The draft has taken in the rows of the request's cached blocks: keep its KV in their place."""
        bs = self.target.blocks.block_size
        upto = min(self.drafts.lengths.get(req.id, 0) // bs, req.cached)
        for j in range(req.draft_kv_blocks, upto):
            part = self.cache.draft_part(req.hashes[j])
            if part is not None and part.kv is None:
                self.cache.set_draft_kv(req.hashes[j], self.drafts.export(req.id, j * bs, (j + 1) * bs))
        req.draft_kv_blocks = max(req.draft_kv_blocks, upto)

    def _preempt(self, req: _Request, stats: StepStats) -> None:
        """Free the request's KV (and draft rows); it is recomputed from its tokens when it runs again.
        A window under validation is kept, so the output does not change."""
        self.target.blocks.release(req.id)
        if self.drafts is not None:
            self.drafts.drop(req.id)
        req.resume = bool(req.generated)
        req.feed = req.prompt_ids + req.generated[:-1] if req.generated else list(req.prompt_ids)
        req.fed = req.kv_len = 0
        req.context, req.staged, req.cached = [], [], 0
        req.metrics.preemptions += 1
        stats.preempted.append(req.id)
        self._running.remove(req)
        self._waiting.appendleft(req)

    def _draft(self, plan: list[tuple[_Request, int]], timings: StepTimings, stats: StepStats) -> set[int]:
        """Open a window for every scheduled decoding request without one: ONE draft inference for all."""
        jobs, owners = [], []
        for req, _ in plan:
            if not req.decoding or req.window is not None:
                continue
            n = req.next_candidates() if self.drafts is not None else 0
            req.window, req.window_pos, req.window_accepted, req.window_steps = [req.anchor], 0, 0, 0
            req.proposals, req.confidence, req.window_proposed, req.window_chances = [], None, 0, None
            req.peak = []
            if n == 0:
                continue
            context = np.concatenate(req.context) if req.context else np.zeros((0, self.drafts.info.context_width),
                                                                               np.float32)
            req.context = []
            sampling = (SamplingSpec(req.processor, req.draft_rng, req.config.temperature)
                        if req.config.do_sample else None)
            jobs.append(DraftJob(DraftCall(req.id, req.anchor, n, context), req.top_k, sampling))
            owners.append(req)
        if not jobs:
            return set()
        t0 = time.perf_counter()
        got, head_ms = draft_candidates(self.drafts, jobs)
        timings.draft_step_ms = (time.perf_counter() - t0) * 1e3
        timings.draft_model_ms = self.drafts.last_model_ms
        timings.markov_head_ms = head_ms
        timings.sampling_ms = timings.draft_step_ms - timings.draft_model_ms - head_ms
        for req, d in zip(owners, got):
            req.window = [req.anchor] + d.tokens
            req.proposals, req.confidence, req.peak = d.proposals, d.confidence, d.peak
            req.window_proposed = len(d.tokens)
            if self.cache is not None and hasattr(self.drafts, "export"):
                self._keep_draft_kv(req)
        stats.draft_batch = len(jobs)
        return {r.id for r in owners}

    def _prefill(self, req: _Request, rows: int, next_ids: np.ndarray, logits: np.ndarray | None,
                 hidden: np.ndarray | None, timings: StepTimings) -> StepEvent | None:
        """A prompt (or recompute) chunk; the chunk that ends a prompt emits the first token."""
        req.fed += rows
        req.kv_len += rows
        if hidden is not None:
            req.context.append(hidden.copy())
            if self.cache is not None:
                req.staged.append(req.context[-1])
        if not req.decoding:
            return None
        if req.resume:
            req.resume = False  # back where it was: the anchor is the last token it emitted
            return None
        if req.processor is None:
            return self._commit(req, [], [int(next_ids[-1])], 0, timings)
        p = req.processor.distribution(logits[-1])
        token = p.sample(req.rng.random()) if req.config.do_sample else p.argmax()
        return self._commit(req, [], [token], 0, timings, [_log(p.prob(token))])

    def _validate(self, req: _Request, rows: int, post: np.ndarray, logits: np.ndarray | None,
                  hidden: np.ndarray | None, timings: StepTimings) -> StepEvent:
        """Validate the window rows [pos, pos+rows): each row checks the candidate after it."""
        pos, window = req.window_pos, req.window
        bonus = pos + rows == len(window)
        seg = window[pos + 1: pos + rows + 1]
        logprobs = None
        p_row = None
        if req.processor is not None:
            cache: dict[int, Dist] = {}

            def p_row(k: int) -> Dist:
                if k not in cache:
                    cache[k] = req.processor.distribution(logits[k], seg[:k])
                return cache[k]

        proposals = req.proposals[pos: pos + len(seg)] if req.config.do_sample else None
        acc, last = verify_window(seg, bonus, post, p_row, proposals, req.rng, self.target.vocab_size)
        tokens = seg[:acc] + ([last] if last is not None else [])
        if p_row is not None:
            logprobs = [_log(p_row(k).prob(t)) for k, t in enumerate(tokens)]
        rejected = acc < len(seg)
        kept_rows = acc + 1 if rejected else rows
        req.kv_len += kept_rows
        self.target.blocks.shrink(req.id, req.kv_len)
        if hidden is not None:
            req.context.append(hidden[:kept_rows].copy())
            if self.cache is not None:
                req.staged.append(req.context[-1])
        req.window_pos += rows
        req.window_accepted += acc
        req.window_steps += 1
        done = rejected or bonus
        confidence = req.confidence[pos: pos + len(seg)] if req.confidence else None
        peak = req.peak[pos: pos + len(seg)] or None
        event = self._commit(req, seg, tokens, acc, timings, logprobs)
        event.confidence, event.peak = confidence, peak
        event.window_proposed = req.window_proposed
        if done or event.finished:
            if len(window) > 1 or req.window_proposed:  # a window the policy verified none of counts too
                event.window_drafted = window[1:] if done else window[1: pos + 1 + len(seg)]
                event.window_accepted = req.window_accepted
                req.metrics.split_windows += int(req.window_steps > 1)
                if done:
                    req.last_accepted = req.window_accepted
                    if self.policy is not None:
                        verified = len(window) - 1
                        self.policy.observe_window(req.config.do_sample, verified, req.window_accepted,
                                                   req.peak[:verified] or None,
                                                   req.window_chances[:verified] if req.window_chances else None)
            req.window = None
        return event

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
        decoded = req.detok.feed(tokens, accepted)
        pieces, stop = req.stops.release(req.detok.text, decoded, reason is not None)
        if stop is not None:
            reason = "stop"
            req.detok.text = req.detok.text[:stop]
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

    def _record(self, req: _Request, event: StepEvent) -> StepEvent:
        req.metrics.record(event)
        return event

    def _finish(self, req: _Request, event: StepEvent) -> StepEvent:
        req.finish_reason = event.finish_reason
        self._record(req, event)
        self.target.blocks.release(req.id)
        if self.drafts is not None:
            self.drafts.drop(req.id)
        if req in self._running:
            self._running.remove(req)
        else:
            self._waiting.remove(req)
        p = len(req.prompt_ids)
        self._finished[req.id] = _Finished(req.detok.text, req.generated, req.finish_reason or "", req.metrics,
                                           req.cumulative_logprob if req.processor is not None else None,
                                           req.prompt_ids, req.prompt_text,
                                           spans=req.spans + [(p, p + len(req.generated))])
        while len(self._finished) > _KEEP_FINISHED:
            self._finished.popitem(last=False)
        return event

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None,
                 on_event: Callable[[StepEvent], object] | None = None) -> GenerationResult:
        """Run one request to the end; `on_event` returning a truthy value cancels it (engine/generate.py)."""
        return generate(self, prompt, config, chat, on_event)


def _log(p: float) -> float:
    return float(np.log(p)) if p > 0.0 else -float("inf")
