"""The bench at N concurrent requests: `dflash-studio bench --concurrency N [N ...]` (issue 5).

For every concurrency level N and every configuration (this engine's target alone, each draft x
num_assistant_tokens x markov_head_top_k x decoding, and openvino_genai.ContinuousBatchingPipeline
with the target alone on the same IR as the peer), the prompts run through ONE pipeline with N
requests in flight: N are added, the pipeline is stepped (`add_request` / `step`, nothing else),
and whenever one finishes the next prompt is added, until every prompt has finished. The order is
level-major (for each N, every configuration in turn), after one untimed warm-up batch per
configuration.

What a row says, measured the same way by the same driver loop for this engine and the peer:

- aggregate tok/s = all generated tokens of the batch / wall time of the whole batch (first
  add_request to the step that finished the last request);
- per request: TTFT = from its add_request to the end of the step that gave its first token (so
  time spent waiting for a slot in the pipeline counts), TPOT = (finish - first token) / (tokens - 1);
  the row gives their mean, p50 and p90 over the requests;
- tokens per step = tokens the request's target steps produced / those steps, after the prefill (as
  the single-request bench); tokens per pipeline step = all tokens emitted / step() calls;
  requests per step = requests the pipeline scheduled per step (this engine's `last_step.requests`;
  for the peer, which does not report it, the requests in flight); step ms = wall / step() calls;
  target ms / draft ms = the engine's own timings of the step's target inference and draft stage,
  averaged over the requests' steps (batched: one shared inference each, not a per-request share);
- speedup = the row's aggregate tok/s / this engine's target alone's at the same N and decoding;
  vs CB = the row's aggregate tok/s / openvino_genai CB's at the same N and decoding;
- matches target: greedy outputs compared token for token with this engine's target alone run at
  the lowest level (normally N=1: each request alone).

Scheduler options (`--max-num-batched-tokens`, `--max-num-seqs`, `--num-kv-blocks`,
`--cache-size-mb`) go to `SpeculativePipeline.load(scheduler=engine.scheduler.SchedulerConfig(...))`
and the same budget to the peer's openvino_genai.SchedulerConfig (KV capacity converted to the
peer's blocks of tokens).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shlex
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.bench.datasets import Prompt, load_prompts
from engine.bench.runner import (ENGINE, WARMUP_TOKENS, BenchSpec, Cancel, Decoding, Loader, Progress,
                                 _first_difference, _one_line, _sum, check_prompts_fit, default_loader,
                                 describe_machine, draft_meta, spec_command, spec_from_args)
from engine.config import GenerationConfig
from engine.errors import DFlashError
from engine.draft_policy import ALWAYS, POLICIES, make_policy
from engine.scheduler import SchedulerConfig

GENAI_CB = "openvino_genai CB"
SCHEDULER_FIELDS = ("max_num_batched_tokens", "max_num_seqs", "num_kv_blocks", "cache_size_mb")
# Tokens per KV block of openvino's PagedAttention caches: the CPU plugin pages by 32, the GPU by 16.
GENAI_BLOCK_TOKENS = {"CPU": 32, "GPU": 16}


# ---- scheduler options -------------------------------------------------------------------------
def make_scheduler(options: dict[str, int | None]) -> SchedulerConfig | None:
    """A validated engine SchedulerConfig from the options that were given (None: none given)."""
    given = {k: v for k, v in options.items() if v is not None}
    return SchedulerConfig(**given).validate() if given else None


def scheduler_loader(scheduler: Any | None, base: Loader | None = None) -> Loader:
    """A loader that passes `scheduler` to SpeculativePipeline.load (unchanged when it is None)."""
    base = base or default_loader
    if scheduler is None:
        return base
    if base is not default_loader:
        return lambda target, draft, device="CPU", precision="default": base(
            target, draft, device=device, precision=precision, scheduler=scheduler)

    def load(target: Path, draft: Path | None, device: str = "CPU", precision: str = "default") -> Any:
        from engine.pipeline import SpeculativePipeline

        return SpeculativePipeline.load(target, draft, device=device, precision=precision, scheduler=scheduler)

    return load


def effective_scheduler(options: dict[str, int | None]) -> dict[str, int | None]:
    """The engine's scheduler settings in force: the options given over the SchedulerConfig defaults."""
    eff = {k: getattr(SchedulerConfig(), k) for k in SCHEDULER_FIELDS}
    eff.update({k: v for k, v in options.items() if v is not None})
    return eff


# ---- what one batch did ------------------------------------------------------------------------
@dataclass
class RequestRun:
    prompt_id: str
    token_ids: list[int]
    text: str
    ttft_ms: float  # add_request -> end of the step that gave its first token
    e2e_ms: float  # add_request -> end of the step that finished it
    target_steps: int = 0  # decode steps after the prefill
    produced: int = 0  # tokens those steps produced, a final EOS included
    drafted: int = 0
    accepted: int = 0
    preemptions: int = 0
    draft_step_ms: float = 0.0  # sums over the request's steps (of the step's shared inferences, when batched)
    draft_model_ms: float = 0.0
    markov_head_ms: float = 0.0
    target_ms: float = 0.0
    finish_reason: str = ""

    @property
    def tpot_ms(self) -> float | None:
        """(finish - first token) / (tokens - 1); None with fewer than 2 tokens."""
        n = len(self.token_ids)
        return (self.e2e_ms - self.ttft_ms) / (n - 1) if n > 1 else None


@dataclass
class BatchRun:
    requests: list[RequestRun]
    wall_ms: float
    steps: int  # step() calls
    scheduled: int  # requests scheduled, summed over the steps
    emitted: int  # tokens the events carried, summed over the steps
    cancelled: bool = False


@dataclass
class _Live:
    prompt_id: str
    t_add: float
    rid: Any = None
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    t_first: float | None = None


# ---- runners -----------------------------------------------------------------------------------
class EngineBatchRunner:
    """This engine: one pipeline, N requests in flight through add_request / step."""

    engine = ENGINE

    def __init__(self, pipe: Any, config: GenerationConfig, draft_policy: str | None = None) -> None:
        self.pipe = pipe
        self.config = config
        # one policy state per configuration, kept across its batches (what it learned of the costs carries
        # over from level to level, as in an app that runs for a while); None: the pipeline's own
        self.draft_policy = draft_policy
        self._policy = make_policy(draft_policy) if draft_policy else None

    def encode(self, prompt: Prompt) -> list[int]:
        return self.pipe.encode_prompt(prompt.text, chat=prompt.chat and self.pipe.has_chat_template)

    def run(self, items: list[tuple[str, list[int]]], concurrency: int, max_new_tokens: int,
            cancel: Cancel | None = None) -> BatchRun:
        pipe = self.pipe
        if self.draft_policy is not None and hasattr(pipe, "policy"):
            pipe.policy = self._policy
        cfg = self.config.copy(max_new_tokens=max_new_tokens)
        pending = deque(items)
        live: dict[int, _Live] = {}
        done: list[RequestRun] = []
        steps = scheduled = emitted = 0
        cancelled = False

        def top_up() -> None:
            while pending and len(live) < concurrency:
                pid, ids = pending.popleft()
                t = time.perf_counter()
                rid = pipe.add_request(list(ids), cfg.copy())
                live[rid] = _Live(pid, t, rid)

        t0 = time.perf_counter()
        top_up()
        while live:
            if not cancelled and cancel is not None and cancel():
                cancelled = True
                pending.clear()
                for rid in live:
                    pipe.cancel(rid)
            events = pipe.step()
            now = time.perf_counter()
            steps += 1
            stats = getattr(pipe, "last_step", None)
            reqs = getattr(stats, "requests", None) if stats is not None else None
            scheduled += len(reqs) if reqs is not None else len(events)
            for ev in events:
                emitted += len(ev.tokens)
                lv = live.get(ev.request_id)
                if lv is None:
                    continue
                if ev.tokens:
                    lv.tokens.extend(int(t) for t in ev.tokens)
                    lv.text.append(ev.text)
                    if lv.t_first is None:
                        lv.t_first = now
                if ev.finished:
                    done.append(self._finish(lv, ev.finish_reason or "", now))
                    del live[ev.request_id]
            if not events and live and not pipe.has_unfinished():
                raise DFlashError(f"the engine finished requests {sorted(live)} without a finishing event.")
            if not cancelled:
                top_up()
        return BatchRun(done, (time.perf_counter() - t0) * 1e3, steps, scheduled, emitted, cancelled)

    def _finish(self, lv: _Live, reason: str, now: float) -> RequestRun:
        pipe = self.pipe
        res = pipe.result(lv.rid) if hasattr(pipe, "result") else None
        tokens = [int(t) for t in res.token_ids] if res is not None else lv.tokens
        text = res.text if res is not None else "".join(lv.text)
        m = res.metrics if res is not None else pipe.metrics(lv.rid)
        t_first = lv.t_first if lv.t_first is not None else now
        steps = int(getattr(m, "target_steps", 0))
        produced = int(getattr(m, "decode_produced", 0) or 0) or max(len(tokens) - 1, 0)
        return RequestRun(lv.prompt_id, tokens, text, (t_first - lv.t_add) * 1e3, (now - lv.t_add) * 1e3, steps,
                          produced, int(getattr(m, "drafted_total", 0)), int(getattr(m, "accepted_total", 0)),
                          int(getattr(m, "preemptions", 0) or 0), _sum(m, "draft_step_ms"), _sum(m, "draft_model_ms"),
                          _sum(m, "markov_head_ms"), _sum(m, "target_ms"),
                          str(getattr(res, "finish_reason", "") or reason))


def _genai_config(base: Any, decoding: Decoding, max_new_tokens: int) -> Any:
    """The peer's GenerationConfig: its own defaults (EOS from the model folder) + the row's decoding."""
    cfg = base
    cfg.max_new_tokens = max_new_tokens
    d = decoding
    cfg.do_sample = d.do_sample
    if d.do_sample:
        cfg.temperature = d.temperature
        cfg.top_p = d.top_p
        cfg.min_p = d.min_p
        if d.top_k:
            cfg.top_k = d.top_k
        if d.rng_seed is not None:
            cfg.rng_seed = d.rng_seed
    cfg.repetition_penalty = d.repetition_penalty
    cfg.presence_penalty = d.presence_penalty
    cfg.frequency_penalty = d.frequency_penalty
    return cfg


class GenAICBPipeline:
    """openvino_genai.ContinuousBatchingPipeline on the same IR, same precision properties and budget."""

    def __init__(self, target: Path, device: str, precision: str, scheduler: dict[str, int | None],
                 kv_tokens: int | None) -> None:
        import openvino_genai as ov_genai

        from engine.models.properties import compile_properties

        props = compile_properties(device, precision)
        props.pop("PERFORMANCE_HINT", None)
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


class GenAICBRunner:
    """One decoding over the shared peer pipeline: N requests in flight through add_request / step."""

    engine = GENAI_CB

    def __init__(self, base: GenAICBPipeline, decoding: Decoding) -> None:
        self.base = base
        self.decoding = decoding

    def run(self, items: list[tuple[str, list[int]]], concurrency: int, max_new_tokens: int,
            cancel: Cancel | None = None) -> BatchRun:
        import openvino as ov
        from openvino_genai import py_openvino_genai as pg

        cb = self.base.pipe
        pending = deque(items)
        live: dict[int, tuple[_Live, Any]] = {}
        done: list[RequestRun] = []
        steps = scheduled = emitted = 0
        cancelled = False
        running = pg.GenerationStatus.RUNNING

        def top_up() -> None:
            while pending and len(live) < concurrency:
                pid, ids = pending.popleft()
                cfg = _genai_config(cb.get_config(), self.decoding, max_new_tokens)
                rid = self.base._next_id
                self.base._next_id += 1
                t = time.perf_counter()
                handle = cb.add_request(rid, ov.Tensor(np.asarray([ids], dtype=np.int64)), cfg)
                live[rid] = (_Live(pid, t, rid), handle)

        t0 = time.perf_counter()
        top_up()
        while live:
            if not cancelled and cancel is not None and cancel():
                cancelled = True
                pending.clear()
                for _lv, h in live.values():
                    h.cancel()
            scheduled += len(live)
            cb.step()
            now = time.perf_counter()
            steps += 1
            for rid in list(live):
                lv, h = live[rid]
                while h.can_read():
                    for out in h.read().values():
                        new = [int(t) for t in out.generated_ids]
                        emitted += len(new)
                        if new and lv.t_first is None:
                            lv.t_first = now
                        lv.tokens.extend(new)
                status = h.get_status()
                if status != running:
                    done.append(self._finish(lv, str(status).split(".")[-1].lower(), now))
                    del live[rid]
            if live and not cb.has_non_finished_requests():
                for rid in list(live):  # finished without a status change (should not happen)
                    done.append(self._finish(live[rid][0], "finished", now))
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


# ---- rows --------------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else 0.0


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


@dataclass
class ConcurrencyRow:
    config: str
    engine: str
    target: str
    draft: str | None
    dataset: str
    concurrency: int
    num_assistant_tokens: int = 0
    variant: str | None = None
    markov_head_top_k: int | None = None
    decoding: str = "greedy"
    greedy: bool = True
    baseline: str = ""  # this engine's target alone with the same decoding (speedup and matches)
    requests: list[RequestRun] = field(default_factory=list)
    wall_ms: float = 0.0
    pipeline_steps: int = 0
    scheduled: int = 0
    emitted: int = 0
    matches_target: int | None = 0  # None: not compared (sampled)
    first_differences: list[str] = field(default_factory=list)
    speedup: float = 0.0
    vs_genai_cb: float | None = None

    @property
    def prompts(self) -> int:
        return len(self.requests)

    @property
    def tokens(self) -> int:
        """All generated tokens of the batch (each request's output, a final EOS not counted)."""
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def tok_s(self) -> float:
        """Aggregate throughput: all generated tokens / wall time of the whole batch."""
        return 1e3 * self.tokens / self.wall_ms if self.wall_ms else 0.0

    @property
    def tpots(self) -> list[float]:
        return [t for t in (r.tpot_ms for r in self.requests) if t is not None]

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_ms for r in self.requests]

    @property
    def target_steps(self) -> int:
        return sum(r.target_steps for r in self.requests)

    @property
    def tokens_per_step(self) -> float:
        steps = self.target_steps
        return sum(r.produced for r in self.requests) / steps if steps else 0.0

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.requests)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.requests)

    def as_dict(self) -> dict[str, object]:
        tp, tt = self.tpots, self.ttfts
        rate = self.accepted / self.drafted if self.drafted else None
        steps = self.pipeline_steps
        return {
            "config": self.config, "engine": self.engine, "target": self.target, "draft": self.draft,
            "variant": self.variant, "dataset": self.dataset, "concurrency": self.concurrency,
            "num_assistant_tokens": self.num_assistant_tokens, "markov_head_top_k": self.markov_head_top_k,
            "decoding": self.decoding, "prompts": self.prompts, "tokens": self.tokens,
            "wall_ms": round(self.wall_ms, 2), "tok_s": round(self.tok_s, 2), "speedup": round(self.speedup, 3),
            "vs_genai_cb": None if self.vs_genai_cb is None else round(self.vs_genai_cb, 3),
            "baseline": self.baseline,
            "tpot_ms": round(_mean(tp), 3), "tpot_p50_ms": round(_pct(tp, 50), 3), "tpot_p90_ms": round(_pct(tp, 90), 3),
            "ttft_ms": round(_mean(tt), 2), "ttft_p50_ms": round(_pct(tt, 50), 2), "ttft_p90_ms": round(_pct(tt, 90), 2),
            "target_steps": self.target_steps, "tokens_per_step": round(self.tokens_per_step, 3),
            "pipeline_steps": steps, "tokens_per_pipeline_step": round(self.emitted / steps, 3) if steps else 0.0,
            "requests_per_step": round(self.scheduled / steps, 3) if steps else 0.0,
            "matches_target": self.matches_target, "first_differences": self.first_differences[:5],
            "acceptance_rate": None if rate is None else round(rate, 4),
            "preemptions": sum(r.preemptions for r in self.requests),
            "step_ms": round(self.wall_ms / steps, 3) if steps else 0.0,
            # Per target step of a request, averaged over the requests' steps: with batching these are the
            # times of the step's ONE shared draft stage / target inference, not a request's share of them.
            "draft_step_ms": self._per_step("draft_step_ms"), "draft_model_ms": self._per_step("draft_model_ms"),
            "markov_head_ms": self._per_step("markov_head_ms"),
            "target_ms": self._per_step("target_ms") if self.engine == ENGINE else None,
            "finish_reasons": _count([r.finish_reason for r in self.requests]),
        }


    def _per_step(self, name: str) -> float:
        return round(sum(getattr(r, name) for r in self.requests) / max(self.target_steps, 1), 3)


def _count(xs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


TABLE_COLUMNS = ("config", "concurrency", "decoding", "prompts", "tokens", "wall s", "aggregate tok/s",
                 "vs target alone", "vs genai CB", "TPOT ms mean", "TPOT p50", "TPOT p90", "TTFT ms mean",
                 "TTFT p50", "TTFT p90", "tokens per step", "tokens per pipeline step", "requests per step",
                 "step ms", "target ms", "draft ms", "matches target", "acceptance", "preemptions")


def markdown_table(rows: list[ConcurrencyRow]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in rows:
        d = r.as_dict()
        acc = "-" if d["acceptance_rate"] is None else f"{100 * d['acceptance_rate']:.0f}%"
        vs = "-" if d["vs_genai_cb"] is None else f"{d['vs_genai_cb']:.2f}x"
        match = "n/a (sampled)" if d["matches_target"] is None else f"{d['matches_target']}/{d['prompts']}"
        lines.append(f"| {d['config']} | {d['concurrency']} | {d['decoding']} | {d['prompts']} | {d['tokens']} | "
                     f"{d['wall_ms'] / 1e3:.2f} | {d['tok_s']:.1f} | {d['speedup']:.2f}x | {vs} | "
                     f"{d['tpot_ms']:.2f} | {d['tpot_p50_ms']:.2f} | {d['tpot_p90_ms']:.2f} | {d['ttft_ms']:.1f} | "
                     f"{d['ttft_p50_ms']:.1f} | {d['ttft_p90_ms']:.1f} | {d['tokens_per_step']:.2f} | "
                     f"{d['tokens_per_pipeline_step']:.2f} | {d['requests_per_step']:.2f} | {d['step_ms']:.1f} | "
                     f"{'-' if d['target_ms'] is None else format(d['target_ms'], '.1f')} | {d['draft_step_ms']:.1f} | "
                     f"{match} | {acc} | {d['preemptions']} |")
    return "\n".join(lines)


def csv_table(rows: list[ConcurrencyRow]) -> str:
    dicts = [r.as_dict() for r in rows]
    if not dicts:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dicts[0].keys()))
    w.writeheader()
    for d in dicts:
        w.writerow(dict(d, first_differences=";".join(d["first_differences"]),
                        finish_reasons=";".join(f"{k}={v}" for k, v in d["finish_reasons"].items())))
    return buf.getvalue()


@dataclass
class ConcurrencyResult:
    rows: list[ConcurrencyRow]
    notes: list[str]
    machine: dict[str, str]
    settings: dict[str, object]
    cancelled: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"machine": self.machine, "settings": self.settings, "notes": self.notes, "cancelled": self.cancelled,
                "rows": [r.as_dict() for r in self.rows]}

    def header_lines(self) -> list[str]:
        s = self.settings
        lines = [f"{k}: {v}" for k, v in self.machine.items()]
        lines.append(f"precision: {s.get('precision')}; {s.get('prompts')} x {s.get('dataset')} prompts, "
                     f"{s.get('max_new_tokens')} new tokens, concurrency {s.get('concurrency')}"
                     + (" (cancelled)" if self.cancelled else ""))
        lines.append(f"scheduler (this engine): {s.get('scheduler')}")
        if s.get("genai_scheduler"):
            lines.append(f"scheduler (openvino_genai CB): {s['genai_scheduler']}")
        if s.get("load_average"):
            lines.append(f"load average (1 min) before / after: {s['load_average']}")
        if s.get("command"):
            lines.append(f"command: {s['command']}")
        return lines

    def markdown(self) -> str:
        out = self.header_lines() + ["", markdown_table(self.rows)]
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def csv(self) -> str:
        return csv_table(self.rows)


# ---- the run -----------------------------------------------------------------------------------
@dataclass
class ConcurrencySpec:
    bench: BenchSpec  # target, drafts, prompts, decodings, n, K, device, precision; genai_target = the CB peer
    levels: list[int] = field(default_factory=lambda: [1])
    scheduler: dict[str, int | None] = field(default_factory=dict)  # the options given (None: default)
    draft_policies: list[str] = field(default_factory=lambda: [ALWAYS])  # each draft configuration runs under each

    def validate(self) -> "ConcurrencySpec":
        self.bench.validate()
        if not self.levels:
            raise ValueError("concurrency: give at least one level (e.g. --concurrency 1 2 4 8).")
        for n in self.levels:
            if int(n) < 1:
                raise ValueError(f"concurrency={n}: run at least one request at a time.")
        for k in self.scheduler:
            if k not in SCHEDULER_FIELDS:
                raise ValueError(f"{k}: not a scheduler option ({', '.join(SCHEDULER_FIELDS)}).")
        make_scheduler(self.scheduler)  # SchedulerConfig.validate names a value out of range
        for name in self.draft_policies or [ALWAYS]:
            if name not in POLICIES:
                raise ValueError(f"draft policy {name!r}: use one of {', '.join(POLICIES)}.")
        return self


@dataclass
class _Cfg:
    template: ConcurrencyRow
    runner: Any
    decoding: Decoding


def _command(spec: ConcurrencySpec) -> str:
    parts = [spec_command(spec.bench), "--concurrency", *(str(n) for n in spec.levels)]
    for k in SCHEDULER_FIELDS:
        v = spec.scheduler.get(k)
        if v is not None:
            parts += ["--" + k.replace("_", "-"), str(v)]
    if spec.draft_policies and spec.draft_policies != [ALWAYS]:
        parts += ["--draft-policy", *spec.draft_policies]
    return " ".join(shlex.quote(p) if i else p for i, p in enumerate(parts))


def run_concurrency(spec: ConcurrencySpec, progress: Progress | None = None, cancel: Cancel | None = None,
                    loader: Loader | None = None, machine: dict[str, str] | None = None) -> ConcurrencyResult:
    """Every configuration of `spec.bench` at every level of `spec.levels`; one row per (configuration, level)."""
    spec.validate()
    b = spec.bench
    levels = sorted({int(n) for n in spec.levels})
    sched = make_scheduler(spec.scheduler)  # ValueError naming the field when an option is out of range
    loader = scheduler_loader(sched, loader)
    say = progress or (lambda _m, _f=None: None)
    stop = cancel or (lambda: False)
    items = load_prompts(b.dataset, b.prompts)
    if not items:
        raise DFlashError(f"The prompt set {b.dataset!r} is empty.")
    load_before = _loadavg()
    target = Path(b.target)
    notes: list[str] = []
    eff = effective_scheduler(spec.scheduler)
    settings: dict[str, object] = {
        "target": target.name, "dataset": b.dataset, "prompts": len(items), "max_new_tokens": b.max_new_tokens,
        "device": b.device, "precision": b.precision, "concurrency": levels,
        "scheduler": ", ".join(f"{k}={eff[k]}" for k in SCHEDULER_FIELDS),
        "order": "level-major (for each N every configuration), N requests in flight through add_request/step, "
                 "one untimed warm-up batch per configuration",
        "command": _command(spec)}
    if b.drafts and b.genai_dflash:
        notes.append("openvino_genai's DFlash (LLMPipeline with a draft) has no rows here: the peer at N requests "
                     "is ContinuousBatchingPipeline with the target alone.")
    if levels[-1] > len(items):
        notes.append(f"concurrency {levels[-1]} > {len(items)} prompts: at most {len(items)} requests are in flight.")
    if eff.get("max_num_seqs") and levels[-1] > int(eff["max_num_seqs"]):
        notes.append(f"concurrency {levels[-1]} > max_num_seqs={eff['max_num_seqs']}: the engine schedules at most "
                     f"{eff['max_num_seqs']} requests per step.")

    cfgs: list[_Cfg] = []
    runs: dict[tuple[int, int], BatchRun] = {}  # (config index, level) -> its batch
    cancelled = False

    def result() -> ConcurrencyResult:
        settings["load_average"] = f"{load_before} / {_loadavg()}"
        rows = _aggregate(cfgs, runs, levels, [p.id for p in items])
        return ConcurrencyResult(rows, notes, machine if machine is not None else describe_machine(b.device),
                                 settings, cancelled)

    try:
        _plan(spec, target, loader, say, stop, notes, cfgs, eff, settings)
    except _Stop:
        cancelled = True
        cfgs.clear()
        return result()

    say("warming up", None)
    encoder = cfgs[0].runner
    encoded = [(p.id, encoder.encode(p)) for p in items]
    check_prompts_fit(getattr(encoder, "pipe", None), encoded, b.max_new_tokens, b.dataset)
    warm = encoded[: max(1, min(levels[-1], len(encoded)))]
    kept: list[_Cfg] = []
    for c in cfgs:
        if stop():
            cancelled = True
            cfgs[:] = kept
            return result()
        refused = (ValueError, DFlashError) if c.template.engine == ENGINE else Exception
        try:
            c.runner.run(warm, len(warm), WARMUP_TOKENS)
        except refused as exc:
            if c.template.engine == ENGINE and c.template.draft is None:
                raise
            notes.append(f"{c.template.config}: skipped, {_one_line(exc)}")
            continue
        kept.append(c)
    cfgs[:] = kept

    total = len(levels) * len(cfgs)
    done = 0
    for n in levels:
        for i, c in enumerate(cfgs):
            if stop():
                cancelled = True
                break
            say(f"N={n}: {c.template.config}", done / total)
            run = c.runner.run(encoded, n, b.max_new_tokens, stop)
            if run.cancelled:
                cancelled = True
                break
            runs[(i, n)] = run
            done += 1
        if cancelled:
            break
    say("cancelled" if cancelled else "done", None if cancelled else 1.0)
    return result()


class _Stop(Exception):
    pass


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def _plan(spec: ConcurrencySpec, target: Path, loader: Loader, say: Progress, stop: Cancel, notes: list[str],
          cfgs: list[_Cfg], eff: dict[str, int | None], settings: dict[str, object]) -> None:
    b = spec.bench
    ds = b.dataset

    def check() -> None:
        if stop():
            raise _Stop

    say(f"loading {target.name} (this engine)", None)
    base = loader(target, None, device=b.device, precision=b.precision)
    peer: GenAICBPipeline | None = None
    if b.genai_target:
        check()
        say(f"loading {target.name} (openvino_genai ContinuousBatchingPipeline)", None)
        kv_tokens = None
        stats = getattr(base, "kv_stats", None)
        if callable(stats):
            st = stats()
            kv_tokens = int(st["total_blocks"]) * int(st["block_size"])
        try:
            peer = GenAICBPipeline(target, b.device, b.precision, eff, kv_tokens)
            settings["genai_scheduler"] = peer.describe()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is a note, not a failure
            notes.append(f"target alone ({GENAI_CB}): skipped, it could not load: {_one_line(exc)}")
    drafts: list[tuple[Path, Any]] = []
    for d in b.drafts:
        check()
        say(f"loading {target.name} + {Path(d).name} (this engine)", None)
        try:
            drafts.append((Path(d), loader(target, Path(d), device=b.device, precision=b.precision)))
        except (DFlashError, ValueError) as exc:
            notes.append(f"{Path(d).name}: skipped, {_one_line(exc)}")

    for dec in b.decodings:
        suffix = "" if dec.label == "greedy" else f", {dec.label}"
        base_name = f"target alone (this engine{suffix})"

        def row(config: str, engine: str, draft: str | None = None, n: int = 0, variant: str | None = None,
                k: int | None = None) -> ConcurrencyRow:
            return ConcurrencyRow(config, engine, target.name, draft, ds, 0, n, variant, k, dec.label, dec.greedy,
                                  base_name)

        cfgs.append(_Cfg(row(base_name, ENGINE), EngineBatchRunner(base, GenerationConfig(**dec.config_fields())),
                         dec))
        if peer is not None:
            cfgs.append(_Cfg(row(f"target alone ({GENAI_CB}{suffix})", GENAI_CB), GenAICBRunner(peer, dec), dec))
        for path, pipe in drafts:
            variant, has_head, default_k, max_n = draft_meta(pipe)
            ns = sorted({n or max_n for n in b.num_assistant_tokens})
            ks = sorted({default_k if k is None else k for k in b.markov_head_top_k}, reverse=True) if has_head \
                else [None]
            for n in ns:
                for k in ks:
                    for policy in spec.draft_policies or [ALWAYS]:
                        label = (f"{path.name} ({variant or 'draft'}) n={n}" + ("" if k is None else f" K={k}")
                                 + ("" if policy == ALWAYS else f", {policy}"))
                        cfg = GenerationConfig(num_assistant_tokens=n, markov_head_top_k=k, **dec.config_fields())
                        cfgs.append(_Cfg(row(f"{label} (this engine{suffix})", ENGINE, path.name, n, variant, k),
                                         EngineBatchRunner(pipe, cfg, policy), dec))


def _aggregate(cfgs: list[_Cfg], runs: dict[tuple[int, int], BatchRun], levels: list[int],
               prompt_ids: list[str]) -> list[ConcurrencyRow]:
    rows: list[ConcurrencyRow] = []
    order = {pid: i for i, pid in enumerate(prompt_ids)}
    for n in levels:
        for i, c in enumerate(cfgs):
            run = runs.get((i, n))
            if run is None:
                continue
            t = c.template
            reqs = sorted(run.requests, key=lambda r: order.get(r.prompt_id, len(order)))
            rows.append(ConcurrencyRow(t.config, t.engine, t.target, t.draft, t.dataset, n, t.num_assistant_tokens,
                                       t.variant, t.markov_head_top_k, t.decoding, t.greedy, t.baseline, reqs,
                                       run.wall_ms, run.steps, run.scheduled, run.emitted))
    # Baselines: this engine's target alone (per decoding) at the lowest level it ran.
    alone: dict[str, dict[str, list[int]]] = {}
    tok_s: dict[tuple[str, int], float] = {}
    peer_tok_s: dict[tuple[str, int], float] = {}
    for r in rows:
        if r.engine == ENGINE and r.draft is None:
            alone.setdefault(r.decoding, {q.prompt_id: q.token_ids for q in r.requests})
            tok_s[(r.decoding, r.concurrency)] = r.tok_s
        if r.engine == GENAI_CB:
            peer_tok_s[(r.decoding, r.concurrency)] = r.tok_s
    for r in rows:
        base = alone.get(r.decoding)
        r.matches_target = 0 if r.greedy else None
        r.first_differences = []
        if r.greedy and base is not None:
            for q in r.requests:
                ref = base.get(q.prompt_id)
                diff = None if ref is None else _first_difference(q.token_ids, ref)
                if ref is not None and diff is None:
                    r.matches_target += 1
                elif ref is not None:
                    r.first_differences.append(f"{q.prompt_id}@{diff}")
        b = tok_s.get((r.decoding, r.concurrency))
        r.speedup = r.tok_s / b if b else 0.0
        p = peer_tok_s.get((r.decoding, r.concurrency))
        r.vs_genai_cb = r.tok_s / p if p else None
    return rows


# ---- command line ------------------------------------------------------------------------------
def add_concurrency_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, nargs="+", default=None, metavar="N",
                   help="run the prompts with N requests in flight through one pipeline, one row per N "
                        "(aggregate tok/s, per-request TPOT/TTFT); the peer is openvino_genai's "
                        "ContinuousBatchingPipeline with the target alone")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="T",
                   help="scheduler: target rows per step (prompt chunks + validation rows)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="S", help="scheduler: requests per step")
    p.add_argument("--num-kv-blocks", type=int, default=None, metavar="B", help="scheduler: KV cache size in blocks")
    p.add_argument("--cache-size-mb", type=int, default=None, metavar="MB",
                   help="scheduler: KV cache size in MB (when --num-kv-blocks is not given)")
    p.add_argument("--draft-policy", nargs="+", default=[ALWAYS], choices=list(POLICIES), metavar="P",
                   help="candidates per window: 'always' the full count, 'adaptive' fewer when the step's rows "
                        "cost more than they save (engine/draft_policy.py); several: each draft row under each")


def scheduler_options(args: argparse.Namespace) -> dict[str, int | None]:
    return {k: getattr(args, k, None) for k in SCHEDULER_FIELDS}


def run_cli(args: argparse.Namespace) -> int:
    from engine.cli import _progress_printer

    bench = spec_from_args(args)
    spec = ConcurrencySpec(bench, list(args.concurrency), scheduler_options(args),
                           list(getattr(args, "draft_policy", None) or [ALWAYS]))
    res = run_concurrency(spec, progress=_progress_printer())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(res.markdown())
        (out / "results.csv").write_text(res.csv())
        (out / "results.json").write_text(json.dumps(res.as_dict(), indent=1))
    if args.json:
        print("\n".join(res.header_lines() + [f"note: {n}" for n in res.notes]), file=sys.stderr)
        print(json.dumps([r.as_dict() for r in res.rows]))
    else:
        print(res.markdown())
    return 0
