"""The bench's peers: openvino_genai on the same IR, with the same precision properties.

- one request at a time: `LLMPeer` (openvino_genai.LLMPipeline; the target alone, or its DFlash
  with the same draft) and `LLMRunner`, one configuration over it;
- N requests in flight: `CBPeer` (ContinuousBatchingPipeline with the target alone, the engine's
  scheduler budget) and `CBRunner`, driven by add_request / step like this engine.

Each runner's `run(items, concurrency, max_new_tokens, cancel)` returns a report.BatchRun, as the
engine's runner does. GenerationConfig goes into openvino_genai's terms in one place
(engine.genai_target.genai_generation_config).
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.bench.report import GENAI, GENAI_CB, BatchRun, RequestRun
from engine.bench.spec import Decoding
from engine.genai_target import genai_generation_config
from engine.models.properties import compile_properties

Cancel = Callable[[], bool]
# Tokens per KV block of openvino's PagedAttention caches: the CPU plugin pages by 32, the GPU by 16.
GENAI_BLOCK_TOKENS = {"CPU": 32, "GPU": 16}


def _properties(device: str, precision: str) -> dict[str, str]:
    props = compile_properties(device, precision)
    props.pop("PERFORMANCE_HINT", None)
    return props


class LLMPeer:
    """openvino_genai.LLMPipeline on the same IR: the target alone, or its DFlash with the same draft."""

    def __init__(self, target: Path, draft: Path | None, device: str, precision: str,
                 prefix_caching: bool = False) -> None:
        import openvino_genai as ov_genai

        props = _properties(device, precision)
        sc = ov_genai.SchedulerConfig()
        # No prefix caching unless asked for (multi-turn rows): DFlash CB/PA refuses it, and for the target
        # alone it would reuse the chat template's shared system prompt across prompts.
        sc.enable_prefix_caching = prefix_caching
        if draft is None:
            self.pipe = ov_genai.LLMPipeline(str(target), device, scheduler_config=sc, **props)
        else:
            self.pipe = ov_genai.LLMPipeline(str(target), device, scheduler_config=sc,
                                             draft_model=ov_genai.draft_model(str(draft), device, **props), **props)
        self.tokenizer = self.pipe.get_tokenizer()
        self.draft = draft


class LLMRunner:
    """One configuration (num_assistant_tokens, decoding) over a shared LLMPeer: one request at a time."""

    engine = GENAI

    def __init__(self, base: LLMPeer, num_assistant_tokens: int, decoding: Decoding) -> None:
        self.base = base
        self.num_assistant_tokens = num_assistant_tokens
        self.decoding = decoding

    def run(self, items: list[tuple[str, list[int]]], concurrency: int, max_new_tokens: int,
            cancel: Cancel | None = None) -> BatchRun:
        t0 = time.perf_counter()
        done: list[RequestRun] = []
        for pid, ids in items:
            if cancel is not None and cancel():
                return BatchRun(done, (time.perf_counter() - t0) * 1e3, len(done), len(done), 0, True)
            done.append(self._one(pid, ids, max_new_tokens))
        return BatchRun(done, (time.perf_counter() - t0) * 1e3, len(done), len(done),
                        sum(len(r.token_ids) for r in done))

    def _one(self, pid: str, ids: list[int], max_new_tokens: int) -> RequestRun:
        import openvino as ov

        drafted_by = self.num_assistant_tokens if self.base.draft is not None else None
        cfg = genai_generation_config(self.decoding.config(max_new_tokens=max_new_tokens),
                                      num_assistant_tokens=drafted_by)
        t0 = time.perf_counter()
        res = self.base.pipe.generate(ov.Tensor(np.asarray([ids], dtype=np.int64)), cfg)
        wall = (time.perf_counter() - t0) * 1e3
        tokens = [int(t) for t in res.tokens[0]]
        produced = max(len(tokens) - 1, 0)  # the EOS included, as engine.metrics counts it
        eos = self.base.tokenizer.get_eos_token_id()
        if tokens and tokens[-1] == eos:
            tokens = tokens[:-1]
        ttft = res.perf_metrics.get_ttft().mean
        if self.base.draft is not None:
            steps = len(res.extended_perf_metrics.main_model_metrics.raw_metrics.m_durations) - 1
            accepted = int(res.extended_perf_metrics.get_num_accepted_tokens())
        else:
            steps, accepted = produced, 0  # one token per step, the EOS step included
        steps = max(steps, 0)
        # Its get_num_draft_tokens() reads 0 in openvino_genai 2026.4, so drafted is estimated as
        # steps x num_assistant_tokens (a step near max_new_tokens may draft fewer).
        drafted = steps * self.num_assistant_tokens if self.base.draft is not None else 0
        return RequestRun(pid, tokens, self.base.tokenizer.decode(tokens, skip_special_tokens=True), ttft, wall,
                          steps, produced, drafted if accepted else 0, accepted,
                          verified=drafted if accepted else 0, windows=steps if accepted else 0)


class CBPeer:
    """openvino_genai.ContinuousBatchingPipeline on the same IR, same precision properties and budget."""

    def __init__(self, target: Path, device: str, precision: str, scheduler: dict[str, int | None],
                 kv_tokens: int | None) -> None:
        import openvino_genai as ov_genai

        props = _properties(device, precision)
        sc = ov_genai.SchedulerConfig()
        sc.max_num_batched_tokens = int(scheduler["max_num_batched_tokens"] or 256)
        sc.max_num_seqs = int(scheduler["max_num_seqs"] or 16)
        sc.enable_prefix_caching = False  # every prompt is computed, as this engine does
        sc.dynamic_split_fuse = True
        block = GENAI_BLOCK_TOKENS.get(device.split(".")[0].upper(), 32)
        if kv_tokens:
            sc.num_kv_blocks = max(1, math.ceil(kv_tokens / block))
            self.cache = f"num_kv_blocks={sc.num_kv_blocks} ({sc.num_kv_blocks * block} tokens)"
        else:
            sc.cache_size = max(1, math.ceil((scheduler.get("cache_size_mb") or 512) / 1024))
            self.cache = f"cache_size={sc.cache_size} GB"
        self.scheduler = sc
        self.pipe = ov_genai.ContinuousBatchingPipeline(str(target), sc, device, props)
        self.tokenizer = self.pipe.get_tokenizer()
        self.eos = int(self.tokenizer.get_eos_token_id())
        self._next_id = 0

    def describe(self) -> str:
        sc = self.scheduler
        return (f"max_num_batched_tokens={sc.max_num_batched_tokens}, max_num_seqs={sc.max_num_seqs}, {self.cache}, "
                f"dynamic_split_fuse={sc.dynamic_split_fuse}, prefix caching off")

    def next_id(self) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        return rid


@dataclass
class _Live:
    prompt_id: str
    t_add: float
    handle: Any = None
    tokens: list[int] = field(default_factory=list)
    t_first: float | None = None


class CBRunner:
    """One decoding over the shared CBPeer: N requests in flight through add_request / step."""

    engine = GENAI_CB

    def __init__(self, base: CBPeer, decoding: Decoding) -> None:
        self.base = base
        self.decoding = decoding

    def run(self, items: list[tuple[str, list[int]]], concurrency: int, max_new_tokens: int,
            cancel: Cancel | None = None) -> BatchRun:
        import openvino as ov
        from openvino_genai import py_openvino_genai as pg

        cb = self.base.pipe
        pending = deque(items)
        live: dict[int, _Live] = {}
        done: list[RequestRun] = []
        steps = scheduled = emitted = 0
        cancelled = False
        running = pg.GenerationStatus.RUNNING

        def top_up() -> None:
            while pending and len(live) < concurrency:
                pid, ids = pending.popleft()
                cfg = genai_generation_config(self.decoding.config(max_new_tokens=max_new_tokens), cb.get_config())
                rid = self.base.next_id()
                t = time.perf_counter()
                handle = cb.add_request(rid, ov.Tensor(np.asarray([ids], dtype=np.int64)), cfg)
                live[rid] = _Live(pid, t, handle)

        t0 = time.perf_counter()
        top_up()
        while live:
            if not cancelled and cancel is not None and cancel():
                cancelled = True
                pending.clear()
                for lv in live.values():
                    lv.handle.cancel()
            scheduled += len(live)
            cb.step()
            now = time.perf_counter()
            steps += 1
            for rid in list(live):
                lv = live[rid]
                while lv.handle.can_read():
                    for out in lv.handle.read().values():
                        new = [int(t) for t in out.generated_ids]
                        emitted += len(new)
                        if new and lv.t_first is None:
                            lv.t_first = now
                        lv.tokens.extend(new)
                status = lv.handle.get_status()
                if status != running:
                    done.append(self._finish(lv, str(status).split(".")[-1].lower(), now))
                    del live[rid]
            if live and not cb.has_non_finished_requests():
                for rid in list(live):  # finished without a status change (should not happen)
                    done.append(self._finish(live[rid], "finished", now))
                    del live[rid]
            if not cancelled:
                top_up()
        return BatchRun(done, (time.perf_counter() - t0) * 1e3, steps, scheduled, emitted, cancelled)

    def _finish(self, lv: _Live, reason: str, now: float) -> RequestRun:
        tokens = lv.tokens
        produced = max(len(tokens) - 1, 0)  # the EOS included, as engine.metrics counts it
        if tokens and tokens[-1] == self.base.eos:
            tokens = tokens[:-1]
        t_first = lv.t_first if lv.t_first is not None else now
        text = self.base.tokenizer.decode(tokens, skip_special_tokens=True)
        # The target alone: one token per step after the first, the EOS step included.
        return RequestRun(lv.prompt_id, tokens, text, (t_first - lv.t_add) * 1e3, (now - lv.t_add) * 1e3,
                          produced, produced, finish_reason=reason)
