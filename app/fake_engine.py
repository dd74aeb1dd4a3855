"""A stand-in for engine.pipeline.SpeculativePipeline that needs no model (tests, benchmark, demo).

It follows the same contract (engine/api.py: describe / add_request / step / cancel / metrics / result) and
emits engine.events.StepEvent objects, so the app cannot tell it apart from the real engine. Its
"tokens" are words of a fixed text; which drafted words are accepted comes from a seeded random
generator. It runs no model and holds no model math. Its figures are engine.metrics.RequestMetrics
fed its own events, as the engine's are (one count of steps, tokens and acceptance by position).
"""
from __future__ import annotations

import random
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import GenerationConfig
from engine.description import DraftDescription, EngineDescription
from engine.errors import DFlashError
from engine.events import GenerationResult, StepEvent, StepTimings, TextPiece
from engine.generate import generate
from engine.metrics import RequestMetrics
from engine.scheduler import StepStats

SAMPLE_TEXT = (
    "Block speculative decoding lets a small draft propose a whole block of tokens at once. "
    "The target model then checks the block in a single step and keeps the longest prefix it "
    "agrees with, plus one token of its own. When the draft guesses well, each target step "
    "commits several tokens, so the answer arrives faster while staying exactly what the target "
    "would have written alone. The green runs in this reply are the tokens the target accepted "
    "from the draft; the plain runs are tokens the target produced itself.\n\n"
)


@dataclass
class FakeDraftInfo:
    """The fake draft as a draft folder declares itself (describe() reports it as a DraftDescription)."""

    name: str
    variant: str = "dflash_v1"
    has_head: bool = False
    default_top_k: int = 0
    max_candidates: int = 7
    has_confidence: bool = False


@dataclass
class FakeDraft:
    info: FakeDraftInfo


@dataclass
class _Request:
    rid: int
    config: GenerationConfig
    words: list[str]
    produced: int = 0
    step: int = 0
    cancelled: bool = False
    finished: bool = False
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    finish_reason: str = ""


class FakePipeline:
    """Deterministic fake engine. `tokens_per_second` paces it (0 = as fast as possible)."""

    block_size = 8

    @property
    def default_num_candidates(self) -> int:
        if self.draft_name is None:
            return 0
        return self.draft_default_candidates or self.block_size - 1

    def __init__(self, target_dir=None, draft_dir=None, device="CPU", *, tokens_per_second: float = 0.0,
                 step_delay_s: float = 0.0, acceptance: float = 0.7, seed: int = 0,
                 text: str = SAMPLE_TEXT, has_chat_template: bool = True,
                 fail_on_step: int | None = None, prefill_delay_s: float = 0.0,
                 draft_variant: str = "dflash_v1", draft_head_top_k: int = 0, confidence: bool = False,
                 draft_default_candidates: int | None = None) -> None:
        self.target_name = Path(target_dir).name if target_dir else "fake-target"
        self.draft_name = Path(draft_dir).name if draft_dir else None
        self.draft_default_candidates = draft_default_candidates  # a draft config's num_assistant_tokens
        # A draft "with a Markov head" when draft_head_top_k > 0 (its default K), as DSpark / DFlash v2 say.
        self.draft = (FakeDraft(FakeDraftInfo(self.draft_name, draft_variant, draft_head_top_k > 0, draft_head_top_k,
                                              self.block_size - 1, confidence))
                      if self.draft_name is not None else None)
        self.device = device
        self.has_chat_template = has_chat_template
        self.tokens_per_second = tokens_per_second
        self.step_delay_s = step_delay_s
        self.acceptance = acceptance
        self.fail_on_step = fail_on_step
        self.prefill_delay_s = prefill_delay_s
        self._pace_t0: float | None = None
        self._pace_n = 0
        self._pace_last = 0.0
        self._rng = random.Random(seed)
        self._words = re.findall(r"\S+\s*", text)  # words with the space or line break after them
        self._requests: dict[int, _Request] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self.prompts: list[object] = []  # what add_request received (tests look at it)
        self.configs: list[GenerationConfig] = []
        self.step_calls = 0
        self.last_step = StepStats()
        self.thread_ids: set[int] = set()  # threads the engine was called from (must be one)

    @classmethod
    def load(cls, target_dir, draft_dir=None, device="CPU", precision="default", **kw) -> "FakePipeline":
        if target_dir is not None and not Path(target_dir).exists():
            raise DFlashError(f"Target folder {target_dir} does not exist.")
        return cls(target_dir, draft_dir, device, **kw)

    # -- the engine API (engine/api.py) -------------------------------------------------------------
    def describe(self) -> EngineDescription:
        info = self.draft.info if self.draft is not None else None
        draft = None if info is None else DraftDescription(
            info.name, info.variant, self.block_size, info.max_candidates, self.default_num_candidates, info.has_head,
            info.default_top_k, info.has_confidence, cut_candidates=info.max_candidates)  # a small target: the cut
        return EngineDescription(self.target_name, self.device, "default", "fake", draft, None, self.has_chat_template)

    def encode_prompt(self, prompt, chat: bool | None = None) -> list[int]:
        """Word positions stand in for token ids (the fake's tokens are words of its text)."""
        if isinstance(prompt, str):
            return list(range(max(1, len(prompt.split()))))
        return [int(t) if not isinstance(t, dict) else 0 for t in prompt]

    def chat_prompt(self, messages) -> str:
        """The messages' contents one after the other (the fake has no template to render)."""
        return "".join(f"{m['content']} " for m in messages)

    def encode_text(self, text: str) -> list[int]:
        return self.encode_prompt(text)

    def fit_chat(self, messages, max_new_tokens: int) -> tuple[list[dict[str, str]], int]:
        """The fake has no context limit: every turn stays."""
        return list(messages), 0

    def prefix_cache_stats(self) -> dict[str, int] | None:
        return None

    def clear_prefix_cache(self) -> int:
        return 0

    def set_prefix_caching(self, on: bool) -> None:
        """The fake keeps no prefix cache."""

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """The fake has no context limit nor KV cache: every request fits."""

    def _check_draft_settings(self, config: GenerationConfig) -> None:
        """The engine's per-draft refusals, worded like it (ValueError naming the field)."""
        if self.draft is None:
            return
        info = self.draft.info
        n = config.num_assistant_tokens or info.max_candidates
        if n > info.max_candidates:
            raise ValueError(f"num_assistant_tokens={n} is more than draft {info.name} proposes per block: use "
                             f"1..{info.max_candidates} (its block size is {self.block_size}).")
        if info.has_head and config.markov_head_top_k == 0 and info.variant == "dflash_v2":
            raise ValueError("markov_head_top_k=0 asks for the dense Markov walk, which only DSpark heads have: "
                             "DFlash v2's selector scores Top-K candidates; use markov_head_top_k >= 1.")

    def add_request(self, prompt, config: GenerationConfig, chat: bool | None = None) -> int:
        self.thread_ids.add(threading.get_ident())
        config.validate()
        self._check_draft_settings(config)
        self.prompts.append(prompt)
        self.configs.append(config)
        rid = self._next_id
        self._next_id += 1
        words = []
        while len(words) < config.max_new_tokens:
            words.extend(self._words)
        r = _Request(rid, config, words[: config.max_new_tokens])
        r.metrics = RequestMetrics(self.draft_name, self.device, len(self.encode_prompt(prompt)))
        self._requests[rid] = r
        return rid

    def has_unfinished(self) -> bool:
        return any(not r.finished for r in self._requests.values())

    def cancel(self, request_id: int) -> None:
        r = self._requests.get(request_id)
        if r is not None:
            r.cancelled = True

    def step(self) -> list[StepEvent]:
        self.thread_ids.add(threading.get_ident())
        self.step_calls += 1
        if self.fail_on_step is not None and self.step_calls >= self.fail_on_step:
            raise RuntimeError("fake engine failure: the target's infer request raised")
        out: list[StepEvent] = []
        n_committed = 0
        self.last_step = StepStats(requests=[r.rid for r in self._requests.values() if not r.finished and not r.cancelled])
        for r in list(self._requests.values()):
            if r.finished:
                continue
            if r.cancelled:
                r.finished = True
                r.finish_reason = "cancelled"
                out.append(StepEvent(r.rid, r.step, finished=True, finish_reason="cancelled"))
                r.metrics.record(out[-1])
                continue
            if r.step == 0 and self.prefill_delay_s > 0:
                time.sleep(self.prefill_delay_s)
            ev = self._advance(r)
            n_committed += len(ev.tokens)
            out.append(ev)
        self._pace(n_committed)
        self.last_step.tokens = n_committed
        return out

    def generate(self, prompt, config, chat: bool | None = None, on_event=None) -> GenerationResult:
        """Run one request to the end; `on_event` returning a truthy value cancels it (engine/generate.py)."""
        return generate(self, prompt, config, chat, on_event)

    def result(self, request_id: int) -> GenerationResult:
        r = self._requests[request_id]
        return GenerationResult("".join(r.words[: r.produced]), list(range(r.produced)), r.finish_reason,
                                self.metrics(request_id))

    def metrics(self, request_id: int) -> RequestMetrics:
        return self._requests[request_id].metrics

    # -- internals -------------------------------------------------------------------------------
    def _advance(self, r: _Request) -> StepEvent:
        now = time.perf_counter()
        remaining = len(r.words) - r.produced
        if r.step == 0:  # prefill: the first token, from the target
            tokens, accepted, drafted = [r.produced], 0, []
        else:
            # Without a draft the target makes one token per step, as the real engine does.
            k = (r.config.num_assistant_tokens or self.block_size - 1) if self.draft_name is not None else 0
            drafted = list(range(r.produced, r.produced + k))
            accepted = 0
            while accepted < k and self._rng.random() < self.acceptance:
                accepted += 1
            tokens = list(range(r.produced, r.produced + accepted + 1))
        tokens = tokens[:remaining]
        accepted = min(accepted, len(tokens))
        pieces: list[TextPiece] = []
        for i, tok in enumerate(tokens):
            from_draft = i < accepted
            word = r.words[tok]
            if pieces and pieces[-1].from_draft == from_draft:
                pieces[-1] = TextPiece(pieces[-1].text + word, from_draft)
            else:
                pieces.append(TextPiece(word, from_draft))
        r.produced += len(tokens)
        if tokens:  # the times the engine takes: TTFT at the first token, decode time up to the latest
            if r.first_token_at is None:
                r.first_token_at = now
                r.metrics.ttft_ms = (now - r.started) * 1e3
            else:
                r.metrics.decode_ms = (now - r.first_token_at) * 1e3
        done = r.produced >= len(r.words)
        r.finished = done
        if done:
            r.finish_reason = "length"
        jitter = self._rng.uniform(0.9, 1.1)
        draft_ms = 0.0 if (r.step == 0 or not drafted) else (0.2 + 0.05 * len(drafted)) * jitter
        target_ms = (1.0 + 0.1 * len(tokens)) * self._rng.uniform(0.9, 1.1)
        confidence = None
        if drafted and self.draft is not None and self.draft.info.has_confidence:
            confidence = [max(0.05, 0.95 - 0.1 * i) for i in range(len(drafted))]
        ev = StepEvent(
            request_id=r.rid, step=r.step, drafted=drafted, accepted=accepted, tokens=tokens,
            pieces=pieces, finished=done, finish_reason="length" if done else None, produced=len(tokens),
            timings=StepTimings(draft_step_ms=draft_ms, draft_model_ms=draft_ms * 0.8,
                                target_ms=target_ms, total_ms=draft_ms + target_ms),
            confidence=confidence,
            # Each fake step validates its whole window, as an unsplit window of the engine does.
            window_drafted=drafted[:] if drafted else None, window_accepted=accepted if drafted else 0,
            window_proposed=len(drafted),
        )
        r.step += 1
        r.metrics.record(ev)
        return ev

    def _pace(self, n_tokens: int) -> None:
        """Sleep so that tokens come out at `tokens_per_second` on average (a deadline, not a
        fixed sleep per step, so per-step overhead does not slow the stream down)."""
        if self.step_delay_s > 0:
            time.sleep(self.step_delay_s)
        if self.tokens_per_second > 0 and n_tokens:
            now = time.perf_counter()
            if self._pace_t0 is None or now - self._pace_last > 0.5:  # a new stream: restart the clock
                self._pace_t0, self._pace_n = now, 0
            self._pace_n += n_tokens
            wait = self._pace_t0 + self._pace_n / self.tokens_per_second - now
            if wait > 0:
                time.sleep(wait)
            self._pace_last = time.perf_counter()


def demo_devices():
    """A device list with an Arc GPU and an NPU, for trying the pickers on a machine without them."""
    from engine.devices import describe

    return [describe("CPU", full_name="Intel(R) Core(TM) Ultra 7 155H (demo)"),
            describe("GPU.0", full_name="Intel(R) Arc(TM) A770 Graphics (dGPU) (demo)"),
            describe("NPU", full_name="Intel(R) AI Boost (demo)")]


def fake_loader(**options):
    """A loader with the real signature that builds FakePipelines with `options`."""

    def load(target_dir, draft_dir=None, device="CPU", **kw):
        return FakePipeline.load(target_dir, draft_dir, device, **{**options, **kw})

    return load
