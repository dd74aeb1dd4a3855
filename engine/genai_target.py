"""The target alone through openvino_genai.LLMPipeline: the path for NPU.

NPU pipelines use openvino_genai's stateful backend with static shapes, which this engine's
speculative loop cannot drive, but a person may still want the target alone there. This wraps
LLMPipeline.generate (run on a helper thread, tokens arriving through a streamer) behind the same
add_request / step / cancel / metrics surface as SpeculativePipeline, one StepEvent per token.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np

from engine.config import GenerationConfig
from engine.context import check_fits_context, context_length
from engine.errors import DeviceError
from engine.description import EngineDescription
from engine.generate import generate
from engine.events import GenerationResult, StepEvent, StepTimings
from engine.metrics import RequestMetrics
from engine.models.files import read_optional_json_object
from engine.models.properties import compile_properties
from engine.models.target import check_target_dir
from engine.models.tokenizer import IncrementalDetokenizer, Prompt, TextTokenizer
from engine.scheduler import StepStats

_END = object()
_KEEP_FINISHED = 256


def genai_generation_config(cfg: GenerationConfig, base=None, num_assistant_tokens: int | None = None):
    """`cfg` in openvino_genai's terms: the one translation (the NPU path and the bench's peers use it).

    `base` is the config to fill (a pipeline's own get_config(), so its EOS ids from the model folder
    stay); default a fresh one. `num_assistant_tokens` only for a pipeline with a draft. top_k=0 means
    "off" here and is left at openvino_genai's default (no limit)."""
    import openvino_genai as ov_genai

    g = ov_genai.GenerationConfig() if base is None else base
    g.max_new_tokens = cfg.max_new_tokens
    g.min_new_tokens = cfg.min_new_tokens
    g.do_sample = cfg.do_sample
    if cfg.do_sample:
        g.temperature, g.top_p, g.min_p = cfg.temperature, cfg.top_p, cfg.min_p
        if cfg.top_k:
            g.top_k = cfg.top_k
        if cfg.rng_seed is not None:
            g.rng_seed = cfg.rng_seed
    g.repetition_penalty = cfg.repetition_penalty
    g.presence_penalty = cfg.presence_penalty
    g.frequency_penalty = cfg.frequency_penalty
    g.ignore_eos = cfg.ignore_eos
    if num_assistant_tokens is not None:
        g.num_assistant_tokens = num_assistant_tokens
    if cfg.stop_token_ids:
        g.stop_token_ids = set(cfg.stop_token_ids)
    if cfg.stop_strings:
        g.stop_strings = set(cfg.stop_strings)
        g.include_stop_str_in_output = cfg.include_stop_str_in_output
    return g


class GenAITargetPipeline:
    """The target alone on openvino_genai.LLMPipeline, one request at a time, streamed as StepEvents."""

    draft = None
    draft_name = None
    default_num_candidates = 0

    def __init__(self, target_dir: Path, device: str, precision: str = "default") -> None:
        import openvino_genai as ov_genai

        check_target_dir(target_dir)
        self.folder = Path(target_dir)
        self.context_length = context_length(read_optional_json_object(
            self.folder / "config.json", "export the target again with `dflash-studio export --kind target`."))
        self.device = device
        self.precision = precision
        props = compile_properties(device, precision)
        props.pop("PERFORMANCE_HINT", None)
        try:
            self._pipe = ov_genai.LLMPipeline(str(self.folder), device, **props)
        except RuntimeError as exc:
            last = [ln for ln in str(exc).strip().splitlines() if ln.strip()][-1]
            raise DeviceError(f"openvino_genai could not load {self.folder.name} on {device}: {last.strip()} "
                              "Check the device's driver, or choose CPU or a GPU.") from exc
        self.tokenizer = TextTokenizer(self.folder)
        self._queue: deque[tuple[int, list[int], GenerationConfig]] = deque()
        self._active: dict | None = None
        self._metrics: dict[int, RequestMetrics] = {}
        self._results: dict[int, GenerationResult] = {}
        self._cancelled: list[int] = []  # queued requests cancelled before they started
        self._next_id = 0
        self.last_step = StepStats()

    @property
    def target_name(self) -> str:
        return self.folder.name

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer.has_chat_template

    def describe(self) -> EngineDescription:
        return EngineDescription(self.target_name, self.device, self.precision, "openvino_genai", None, self.folder,
                                 self.has_chat_template)

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tokenizer.chat_prompt(list(messages))

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def fit_chat(self, messages: Sequence[dict[str, str]], max_new_tokens: int) -> tuple[list[dict[str, str]], int]:
        """Nothing is left out here: openvino_genai applies the device's own prompt limit (NPU's static
        MAX_PROMPT_LEN) and says so when a prompt is too long."""
        return list(messages), 0

    def prefix_cache_stats(self) -> dict[str, int] | None:
        return None  # LLMPipeline keeps its own KV per call: no prefix cache to show

    def clear_prefix_cache(self) -> int:
        return 0

    def set_prefix_caching(self, on: bool) -> None:
        """LLMPipeline here keeps no prefix cache between requests: nothing to switch."""

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """The target's context (its config.json); openvino_genai applies the device's own prompt limit."""
        check_fits_context(prompt_tokens, max_new_tokens, self.context_length, self.target_name)

    def add_request(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None) -> int:
        config = (config or GenerationConfig()).validate()
        if config.min_p:
            raise ValueError("min_p is not available for the target alone on NPU (openvino_genai has no min-p); "
                             "set min_p=0 or choose CPU/GPU.")
        genai_config = genai_generation_config(config)
        ids = self.encode_prompt(prompt, chat)
        if not ids:
            raise ValueError("The prompt is empty: type something to send.")
        rid = self._next_id
        self._next_id += 1
        self._metrics[rid] = RequestMetrics(draft_name=None, device=self.device, prompt_tokens=len(ids))
        self._queue.append((rid, ids, genai_config))
        return rid

    def has_unfinished(self) -> bool:
        return self._active is not None or bool(self._queue) or bool(self._cancelled)

    def cancel(self, request_id: int) -> None:
        """Like the engine: the next step() ends the request with a "cancelled" event."""
        if self._active is not None and self._active["id"] == request_id:
            self._active["cancel"].set()
        if any(r[0] == request_id for r in self._queue):
            self._queue = deque(r for r in self._queue if r[0] != request_id)
            self._cancelled.append(request_id)

    def metrics(self, request_id: int) -> RequestMetrics:
        return self._metrics[request_id]

    def _start(self, rid: int, ids: list[int], cfg) -> None:
        import openvino as ov
        import openvino_genai as ov_genai

        tokens: queue.Queue = queue.Queue()
        cancel = threading.Event()

        class Streamer(ov_genai.StreamerBase):
            def write(self, token):
                for t in (token if isinstance(token, list) else [token]):
                    tokens.put(int(t))
                return ov_genai.StreamingStatus.CANCEL if cancel.is_set() else ov_genai.StreamingStatus.RUNNING

            def end(self):
                pass

        streamer = Streamer()

        def run() -> None:
            try:
                self._pipe.generate(ov.Tensor(np.asarray([ids], np.int64)), cfg, streamer)
            except Exception as exc:  # surfaced by step() on the caller's thread
                tokens.put(exc)
            tokens.put(_END)

        self._active = {"id": rid, "tokens": tokens, "cancel": cancel, "steps": 0, "t0": time.perf_counter(),
                        "detok": IncrementalDetokenizer(self.tokenizer), "eos": self.tokenizer.eos_token_ids,
                        "max": cfg.max_new_tokens, "generated": 0, "thread": threading.Thread(target=run, daemon=True)}
        self._active["thread"].start()

    def step(self) -> list[StepEvent]:
        """Wait for the next token of the active request (starting the next request if none)."""
        if self._cancelled:
            gone, self._cancelled = self._cancelled, []
            self.last_step = StepStats()
            for rid in gone:
                self._keep(GenerationResult("", [], "cancelled", self._metrics[rid]), rid)
            return [StepEvent(rid, 0, finished=True, finish_reason="cancelled") for rid in gone]
        if self._active is None:
            if not self._queue:
                return []
            self._start(*self._queue.popleft())
        a = self._active
        self.last_step = StepStats(requests=[a["id"]], tokens=1)
        t0 = time.perf_counter()
        item = a["tokens"].get()
        metrics = self._metrics[a["id"]]
        if isinstance(item, Exception):
            self._active = None
            raise item
        if item is _END or a["cancel"].is_set():
            reason = "cancelled" if a["cancel"].is_set() else ("length" if a["generated"] >= a["max"] else "eos")
            a["thread"].join()
            self._active = None
            event = StepEvent(a["id"], a["steps"], finished=True, finish_reason=reason,
                              produced=1 if reason == "eos" else 0)
            if reason == "eos":  # the step that produced the EOS is a target step, like the engine counts it
                metrics.record(event)
            self._keep(GenerationResult(a["detok"].text, list(a["detok"].ids), reason, metrics), a["id"])
            return [event]
        if item in a["eos"]:
            return self.step()  # the end arrives next
        a["generated"] += 1
        now = time.perf_counter()
        event = StepEvent(a["id"], a["steps"], tokens=[item], pieces=a["detok"].feed([item], 0), produced=1,
                          timings=StepTimings(target_ms=(now - t0) * 1e3, total_ms=(now - t0) * 1e3))
        if a["steps"] == 0:
            metrics.ttft_ms = (now - a["t0"]) * 1e3
            a["t_first"] = now
        else:
            metrics.decode_ms = (now - a["t_first"]) * 1e3
        a["steps"] += 1
        metrics.record(event)
        return [event]

    def _keep(self, result: GenerationResult, rid: int) -> None:
        """Results of the latest finished requests (as many as the engine keeps)."""
        self._results[rid] = result
        while len(self._results) > _KEEP_FINISHED:
            self._results.pop(next(iter(self._results)))

    def result(self, request_id: int) -> GenerationResult:
        return self._results[request_id]

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None,
                 on_event=None) -> GenerationResult:
        """Run one request to the end; `on_event` returning a truthy value cancels it (engine/generate.py)."""
        return generate(self, prompt, config, chat, on_event)
