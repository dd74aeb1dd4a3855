"""The bench: this engine and openvino_genai side by side on the same IR, the same prompts, one process.

One runner for `dflash-studio bench` and the app's comparison panel. A `BenchSpec` says what to
compare: the target alone (this engine, always: it is every speedup's baseline), the target alone
through openvino_genai.LLMPipeline, each draft in this engine once per num_assistant_tokens x
markov_head_top_k (K only for drafts with a Markov head) x decoding (greedy and/or sampled
settings), and openvino_genai's own DFlash with the same draft where it can run (DFlash v1 drafts
without a head, greedy); configurations that cannot run are skipped with a note saying why.

Every configuration runs every prompt in turn (prompt-major order, so machine drift hits all alike)
after one untimed warm-up. TPOT = (wall - TTFT) / (tokens - 1) for every configuration, measured the
same way; speedup = TPOT of this engine's target alone with the same decoding settings / the
configuration's TPOT, from the same run. Greedy outputs are compared token by token with that
target-alone output (`matches_target`, first differences); sampled outputs are not (they match in
distribution, not token for token).

`progress(message, fraction)` reports as it goes; `cancel()` is asked between loads, prompts and
configurations (and stops a running request of this engine at its next step); a cancelled run
returns the prompts that every configuration finished.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.bench.datasets import Prompt, load_prompts
from engine.bench.turns import caching_label, check_turns, per_setting, run_turns, turn_notes
from engine.config import GenerationConfig
from engine.errors import ContextLengthError, DFlashError

Progress = Callable[[str, "float | None"], object]
Cancel = Callable[[], bool]
Loader = Callable[..., Any]  # (target, draft, device=, precision=) -> a SpeculativePipeline-like object

ENGINE = "engine"
GENAI = "openvino_genai"
WARMUP_TOKENS = 8


# ---- what to compare --------------------------------------------------------------------------
@dataclass(frozen=True)
class Decoding:
    """Greedy or sampled settings shared by a group of configurations (and their baseline)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    rng_seed: int | None = 0  # fixed by default so a bench run can be repeated

    @property
    def greedy(self) -> bool:
        return not self.do_sample

    @property
    def plain_greedy(self) -> bool:
        """Greedy without penalties: the target's argmax, what openvino_genai's DFlash verifies."""
        return self.greedy and self.repetition_penalty == 1.0 and not self.presence_penalty \
            and not self.frequency_penalty

    @property
    def label(self) -> str:
        parts = [f"T={self.temperature:g}"] if self.do_sample else ["greedy"]
        if self.do_sample:
            if self.top_k:
                parts.append(f"top_k={self.top_k}")
            if self.top_p < 1.0:
                parts.append(f"top_p={self.top_p:g}")
            if self.min_p:
                parts.append(f"min_p={self.min_p:g}")
        if self.repetition_penalty != 1.0:
            parts.append(f"rep={self.repetition_penalty:g}")
        if self.presence_penalty:
            parts.append(f"presence={self.presence_penalty:g}")
        if self.frequency_penalty:
            parts.append(f"frequency={self.frequency_penalty:g}")
        if self.do_sample and self.rng_seed is not None:
            parts.append(f"seed={self.rng_seed}")
        return " ".join(parts)

    def config_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class BenchSpec:
    target: Path
    drafts: list[Path] = field(default_factory=list)
    dataset: str = "smoke"
    prompts: int | None = 4  # None: the whole set
    max_new_tokens: int = 64
    device: str = "CPU"
    precision: str = "default"
    num_assistant_tokens: list[int | None] = field(default_factory=lambda: [None])  # None: the draft's own default
    markov_head_top_k: list[int | None] = field(default_factory=lambda: [None])  # None: the draft's default K
    decodings: list[Decoding] = field(default_factory=lambda: [Decoding()])
    genai_target: bool = True  # the target alone through openvino_genai.LLMPipeline
    genai_dflash: bool = True  # openvino_genai's DFlash with each draft, where it can run
    turns: int = 1  # user turns per conversation; rows report the last (engine/bench/turns.py)
    prefix_caching: list[bool] = field(default_factory=lambda: [True])  # this engine's rows, one per setting

    def validate(self) -> "BenchSpec":
        """ValueError naming the setting, before anything is loaded."""
        if self.max_new_tokens < 2:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: TPOT needs at least 2 new tokens.")
        if self.prompts is not None and self.prompts < 1:
            raise ValueError(f"prompts={self.prompts}: run at least one prompt.")
        if not self.decodings:
            raise ValueError("decodings: choose greedy, a sampling temperature, or both.")
        if self.turns not in range(1, 9):
            raise ValueError(f"turns={self.turns}: use 1 (the first turn) to 8 (2: MT-Bench's second turn).")
        if not self.prefix_caching:
            raise ValueError("prefix_caching: choose on, off, or both.")
        for n in self.num_assistant_tokens:
            if n is not None:
                GenerationConfig(num_assistant_tokens=n).validate()
        for k in self.markov_head_top_k:
            if k is not None:
                GenerationConfig(markov_head_top_k=k).validate()
        for d in self.decodings:
            GenerationConfig(**d.config_fields()).validate()
        return self


# ---- results ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    token_ids: list[int]
    text: str
    ttft_ms: float
    wall_ms: float
    target_steps: int  # decode steps after the prefill
    drafted: int = 0
    accepted: int = 0
    draft_step_ms: float = 0.0  # sums over the request's steps
    draft_model_ms: float = 0.0
    markov_head_ms: float = 0.0
    sampling_ms: float = 0.0
    target_ms: float = 0.0
    confidence_sum: float = 0.0
    confidence_n: int = 0
    finish_reason: str = ""
    produced: int | None = None  # decode tokens the steps produced, a final EOS included (default: decode_tokens)

    @property
    def decode_tokens(self) -> int:
        return max(len(self.token_ids) - 1, 0)


@dataclass
class Row:
    config: str
    engine: str
    target: str
    draft: str | None
    dataset: str
    num_assistant_tokens: int
    variant: str | None = None
    markov_head_top_k: int | None = None
    decoding: str = "greedy"
    greedy: bool = True
    baseline: str = ""  # the row whose TPOT the speedup divides
    prompts: int = 0
    tokens: int = 0
    decode_tokens: int = 0
    produced: int = 0  # tokens per step counts the EOS a step produced, like engine.metrics
    target_steps: int = 0
    decode_ms: float = 0.0
    ttft_ms_total: float = 0.0
    matches_target: int | None = 0  # None: not compared (sampled, or the baseline of sampled rows)
    first_differences: list[str] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    draft_step_ms: float = 0.0
    draft_model_ms: float = 0.0
    markov_head_ms: float = 0.0
    sampling_ms: float = 0.0
    target_ms: float = 0.0
    confidence_sum: float = 0.0
    confidence_n: int = 0
    speedup: float = 0.0

    def add(self, out: Outcome) -> None:
        self.prompts += 1
        self.tokens += len(out.token_ids)
        self.decode_tokens += out.decode_tokens
        self.produced += out.decode_tokens if out.produced is None else out.produced
        self.target_steps += out.target_steps
        self.decode_ms += max(out.wall_ms - out.ttft_ms, 0.0)
        self.ttft_ms_total += out.ttft_ms
        self.drafted += out.drafted
        self.accepted += out.accepted
        self.draft_step_ms += out.draft_step_ms
        self.draft_model_ms += out.draft_model_ms
        self.markov_head_ms += out.markov_head_ms
        self.sampling_ms += out.sampling_ms
        self.target_ms += out.target_ms
        self.confidence_sum += out.confidence_sum
        self.confidence_n += out.confidence_n

    @property
    def tokens_per_step(self) -> float:
        """Tokens per target step after the prefill (accepted drafts + the target's own, a final EOS included)."""
        return self.produced / self.target_steps if self.target_steps else 0.0

    @property
    def tpot_ms(self) -> float:
        """(wall - TTFT) / (tokens - 1), summed over the prompts."""
        return self.decode_ms / self.decode_tokens if self.decode_tokens else 0.0

    @property
    def tok_s(self) -> float:
        return 1e3 / self.tpot_ms if self.tpot_ms else 0.0

    @property
    def ttft_ms(self) -> float:
        return self.ttft_ms_total / self.prompts if self.prompts else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict[str, object]:
        steps = max(self.target_steps, 1)
        rate = self.acceptance_rate
        return {
            "config": self.config, "engine": self.engine, "target": self.target, "draft": self.draft,
            "variant": self.variant, "dataset": self.dataset, "num_assistant_tokens": self.num_assistant_tokens,
            "markov_head_top_k": self.markov_head_top_k, "decoding": self.decoding, "prompts": self.prompts,
            "tokens": self.tokens, "target_steps": self.target_steps,
            "tokens_per_step": round(self.tokens_per_step, 3), "tpot_ms": round(self.tpot_ms, 3),
            "tok_s": round(self.tok_s, 2), "speedup": round(self.speedup, 3), "baseline": self.baseline,
            "ttft_ms": round(self.ttft_ms, 2),
            "matches_target": self.matches_target, "first_differences": self.first_differences[:5],
            "acceptance_rate": None if rate is None else round(rate, 4),
            "confidence": round(self.confidence_sum / self.confidence_n, 4) if self.confidence_n else None,
            "draft_step_ms": round(self.draft_step_ms / steps, 3),
            "draft_model_ms": round(self.draft_model_ms / steps, 3),
            "markov_head_ms": round(self.markov_head_ms / steps, 3),
            "sampling_ms": round(self.sampling_ms / steps, 3),
            "target_ms": round(self.target_ms / steps, 3) if self.engine == ENGINE else None,
        }


@dataclass
class BenchResult:
    rows: list[Row]
    notes: list[str]  # configurations skipped and why, and other remarks
    machine: dict[str, str]
    settings: dict[str, object]
    cancelled: bool = False
    prompts_done: int = 0
    prompts_planned: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"machine": self.machine, "settings": self.settings, "notes": self.notes,
                "cancelled": self.cancelled, "prompts_done": self.prompts_done,
                "rows": [r.as_dict() for r in self.rows]}

    def header_lines(self) -> list[str]:
        s = self.settings
        lines = [f"{k}: {v}" for k, v in self.machine.items()]
        lines.append(f"precision: {s.get('precision')}; {self.prompts_done} x {s.get('dataset')} prompts, "
                     f"{s.get('max_new_tokens')} new tokens"
                     + (f" (cancelled after {self.prompts_done} of {self.prompts_planned} prompts)"
                        if self.cancelled else ""))
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


# ---- runners ----------------------------------------------------------------------------------
def _sum(m: Any, name: str) -> float:
    v = getattr(m, name, 0.0)
    if isinstance(v, (list, tuple)):
        return float(sum(v))
    return float(v or 0.0)


def draft_meta(pipe: Any) -> tuple[str | None, bool, int, int]:
    """(variant, has a Markov head, default K, default candidates per step) of a pipeline's draft."""
    info = getattr(getattr(pipe, "draft", None), "info", None)
    default_n = int(getattr(pipe, "default_num_candidates", 0) or 0)
    if info is None:
        return None, False, 0, default_n
    return (str(getattr(info, "variant", "dflash_v1")), bool(getattr(info, "has_head", False)),
            int(getattr(info, "default_top_k", 0) or 0), default_n or int(getattr(info, "max_candidates", 0) or 0))


def default_loader(target: Path, draft: Path | None, device: str = "CPU", precision: str = "default") -> Any:
    from engine.pipeline import SpeculativePipeline

    return SpeculativePipeline.load(target, draft, device=device, precision=precision)


class EngineRunner:
    """This engine (SpeculativePipeline): one request with one GenerationConfig at a time."""

    def __init__(self, pipe: Any, config: GenerationConfig) -> None:
        self.pipe = pipe
        self.config = config

    def encode(self, prompt: Prompt) -> list[int]:
        return self.pipe.encode_prompt(prompt.text, chat=prompt.chat and self.pipe.has_chat_template)

    def run(self, ids: list[int], max_new_tokens: int, cancel: Cancel | None = None) -> Outcome:
        cfg = self.config.copy(max_new_tokens=max_new_tokens)
        conf = [0.0, 0]

        def on_event(ev: Any) -> bool:
            c = getattr(ev, "confidence", None)
            if c:
                conf[0] += float(sum(c[: len(ev.drafted)]))
                conf[1] += min(len(c), len(ev.drafted))
            return bool(cancel and cancel())

        t0 = time.perf_counter()
        res = self.pipe.generate(ids, cfg, on_event=on_event)
        wall = (time.perf_counter() - t0) * 1e3
        m = res.metrics
        return Outcome([int(t) for t in res.token_ids], res.text, float(m.ttft_ms), wall, int(m.target_steps),
                       int(getattr(m, "drafted_total", 0)), int(getattr(m, "accepted_total", 0)),
                       _sum(m, "draft_step_ms"), _sum(m, "draft_model_ms"), _sum(m, "markov_head_ms"),
                       _sum(m, "sampling_ms"), _sum(m, "target_ms"), conf[0], int(conf[1]),
                       str(getattr(res, "finish_reason", "")), int(getattr(m, "decode_produced", 0)) or None)


class GenAIRunner:
    """openvino_genai.LLMPipeline on the same IR: the target alone, or its DFlash with the same draft."""

    def __init__(self, target: Path, draft: Path | None, device: str, precision: str,
                 prefix_caching: bool = False) -> None:
        import openvino_genai as ov_genai

        from engine.models.properties import compile_properties

        props = compile_properties(device, precision)
        props.pop("PERFORMANCE_HINT", None)
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


class GenAIConfigRunner:
    """One openvino_genai configuration (num_assistant_tokens, decoding) over a shared GenAIRunner."""

    def __init__(self, base: GenAIRunner, num_assistant_tokens: int, decoding: Decoding) -> None:
        self.base = base
        self.num_assistant_tokens = num_assistant_tokens
        self.decoding = decoding

    def run(self, ids: list[int], max_new_tokens: int, cancel: Cancel | None = None) -> Outcome:
        import openvino as ov
        import openvino_genai as ov_genai

        d = self.decoding
        cfg = ov_genai.GenerationConfig(max_new_tokens=max_new_tokens)
        if self.base.draft is not None:
            cfg.num_assistant_tokens = self.num_assistant_tokens
        if d.do_sample:
            cfg.do_sample = True
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
        return Outcome(tokens, self.base.tokenizer.decode(tokens, skip_special_tokens=True), ttft, wall, steps,
                       drafted if accepted else 0, accepted, produced=produced)


# ---- the run ----------------------------------------------------------------------------------
def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def describe_machine(device: str) -> dict[str, str]:
    import openvino as ov

    try:
        import openvino_genai as ov_genai
        genai_version = ov_genai.get_version()
    except ImportError:
        genai_version = "not installed"
    try:
        from importlib.metadata import version
        ours = version("dflash-studio")
        tok_version = version("openvino-tokenizers")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        ours = tok_version = "?"
    core = ov.Core()
    devices = core.available_devices

    def full(name: str) -> str:
        try:
            return str(core.get_property(name, "FULL_DEVICE_NAME"))
        except Exception:  # noqa: BLE001
            return "?"

    cpu = full("CPU") if "CPU" in devices else "?"
    kind = device.split(".")[0].upper()
    name = device if device in devices else next((d for d in devices if d.split(".")[0] == kind), device)
    return {"machine": f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}",
            "device": f"{device} ({full(name) if name in devices else 'not reported by OpenVINO'})",
            "python": platform.python_version(), "openvino": ov.get_version(),
            "openvino_genai": genai_version, "openvino_tokenizers": tok_version, "dflash_studio": ours}


class _Cancelled(Exception):
    pass


@dataclass
class _Config:
    row: Row
    runner: Any
    decoding: Decoding
    outcomes: list[Outcome] = field(default_factory=list)


def run_bench(spec: BenchSpec, progress: Progress | None = None, cancel: Cancel | None = None,
              loader: Loader | None = None, machine: dict[str, str] | None = None) -> BenchResult:
    """Run every configuration of `spec` on every prompt; one Row per configuration that ran."""
    spec.validate()
    loader = loader or default_loader
    say = progress or (lambda _m, _f=None: None)
    stop = cancel or (lambda: False)
    items = load_prompts(spec.dataset, spec.prompts)
    if not items:
        raise DFlashError(f"The prompt set {spec.dataset!r} is empty.")
    check_turns(items, spec.turns)
    target = Path(spec.target)
    notes: list[str] = []
    configs: list[_Config] = []
    settings = {"target": target.name, "dataset": spec.dataset, "prompts": len(items),
                "max_new_tokens": spec.max_new_tokens, "device": spec.device, "precision": spec.precision,
                "turns": spec.turns, "prefix_caching": [caching_label(x) for x in spec.prefix_caching],
                "order": "prompt-major, one request at a time, one untimed warm-up per configuration",
                "command": spec_command(spec)}

    def result(cancelled: bool, done: int) -> BenchResult:
        rows = _aggregate(configs, [p.id for p in items[:done]])
        return BenchResult(rows, notes + turn_notes(configs, spec.turns, done),
                           machine if machine is not None else describe_machine(spec.device),
                           settings, cancelled, done, len(items))

    try:
        _plan(spec, target, loader, say, stop, notes, configs)
    except _Cancelled:
        configs.clear()
        return result(True, 0)

    encoder = configs[0].runner
    encoded = [(p.id, encoder.encode(p)) for p in items]
    check_prompts_fit(getattr(encoder, "pipe", None), encoded, spec.max_new_tokens, spec.dataset)
    # Warm-up: one short untimed request per configuration (also where the engine refuses a setting).
    say("warming up", None)
    warm_ids = encoded[0][1]
    kept: list[_Config] = []
    for c in configs:
        if stop():
            configs[:] = kept
            return result(True, 0)
        refused = (ValueError, DFlashError) if c.row.engine == ENGINE else Exception  # a peer's own errors
        try:
            c.runner.run(warm_ids, WARMUP_TOKENS)
        except refused as exc:
            if c.row.engine == ENGINE and c.row.draft is None:
                raise  # the baseline itself cannot run: nothing to compare with
            notes.append(f"{c.row.config}: skipped, {_one_line(exc)}")
            continue
        kept.append(c)
    configs[:] = kept

    total = len(items) * len(configs)
    done_runs = 0
    done_prompts = 0
    cancelled = False
    for prompt, (_pid, ids) in zip(items, encoded):
        if stop():
            cancelled = True
            break
        finished = True
        for c in configs:
            if stop():
                finished = False
                break
            say(f"{c.row.config}: prompt {prompt.id}", done_runs / total)
            out = run_turns(c.runner, encoder, prompt, spec.turns, spec.max_new_tokens, stop)
            if out.finish_reason == "cancelled":
                finished = False
                break
            c.outcomes.append(out)
            done_runs += 1
        if not finished:
            cancelled = True
            break
        done_prompts += 1
    say("cancelled" if cancelled else "done", None if cancelled else 1.0)
    return result(cancelled, done_prompts)


def _plan(spec: BenchSpec, target: Path, loader: Loader, say: Progress, stop: Cancel, notes: list[str],
          configs: list[_Config]) -> None:
    """Load the pipelines and list the configurations (skipping with a note what cannot run)."""
    def check() -> None:
        if stop():
            raise _Cancelled

    ds = spec.dataset
    say(f"loading {target.name} (this engine)", None)
    base = loader(target, None, device=spec.device, precision=spec.precision)
    genai_target: GenAIRunner | None = None
    if spec.genai_target:
        check()
        say(f"loading {target.name} (openvino_genai)", None)
        try:
            genai_target = GenAIRunner(target, None, spec.device, spec.precision)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is a note, not a failure
            notes.append(f"target alone (openvino_genai): skipped, it could not load: {_one_line(exc)}")
    drafts: list[tuple[Path, Any]] = []
    for d in spec.drafts:
        check()
        say(f"loading {target.name} + {Path(d).name} (this engine)", None)
        try:
            drafts.append((Path(d), loader(target, Path(d), device=spec.device, precision=spec.precision)))
        except (DFlashError, ValueError) as exc:
            notes.append(f"{Path(d).name}: skipped, {_one_line(exc)}")
    genai_dflash: dict[Path, GenAIRunner] = {}

    for dec in spec.decodings:
        suffix = "" if dec.label == "greedy" else f", {dec.label}"
        base_name = f"target alone (this engine{suffix})"
        configs.append(_Config(Row(base_name, ENGINE, target.name, None, ds, 0, decoding=dec.label,
                                   greedy=dec.greedy, baseline=base_name),
                               EngineRunner(base, GenerationConfig(**dec.config_fields())), dec))
        if genai_target is not None:
            configs.append(_Config(Row(f"target alone (openvino_genai{suffix})", GENAI, target.name, None, ds, 0,
                                       decoding=dec.label, greedy=dec.greedy, baseline=base_name),
                                   GenAIConfigRunner(genai_target, 0, dec), dec))
        for path, pipe in drafts:
            variant, has_head, default_k, max_n = draft_meta(pipe)
            ns = sorted({n or max_n for n in spec.num_assistant_tokens})
            if has_head:
                ks = sorted({default_k if k is None else k for k in spec.markov_head_top_k}, reverse=True)
            else:
                ks = [None]
                if any(k is not None for k in spec.markov_head_top_k) and dec is spec.decodings[0]:
                    notes.append(f"{path.name}: has no Markov head, so markov_head_top_k does not apply "
                                 "(one row per num_assistant_tokens).")
            for n in ns:
                for k in ks:
                    label = f"{path.name} ({variant or 'draft'}) n={n}" + ("" if k is None else f" K={k}")
                    cfg = GenerationConfig(num_assistant_tokens=n, markov_head_top_k=k, **dec.config_fields())
                    configs.append(_Config(Row(f"{label} (this engine{suffix})", ENGINE, target.name, path.name, ds,
                                               n, variant, k, dec.label, dec.greedy, base_name),
                                           EngineRunner(pipe, cfg), dec))
                if not spec.genai_dflash:
                    continue
                why = _genai_dflash_refusal(variant, has_head, dec)
                if why:
                    note = f"{path.name} (openvino_genai DFlash): skipped, {why}"
                    if note not in notes:
                        notes.append(note)
                    continue
                if path not in genai_dflash:
                    check()
                    say(f"loading {target.name} + {path.name} (openvino_genai DFlash)", None)
                    try:
                        genai_dflash[path] = GenAIRunner(target, path, spec.device, spec.precision)
                    except Exception as exc:  # noqa: BLE001
                        notes.append(f"{path.name} (openvino_genai DFlash): skipped, it could not load: "
                                     f"{_one_line(exc)}")
                        genai_dflash[path] = None  # type: ignore[assignment]
                if genai_dflash[path] is None:
                    continue
                configs.append(_Config(Row(f"{path.name} ({variant}) n={n} (openvino_genai DFlash{suffix})", GENAI,
                                           target.name, path.name, ds, n, variant, None, dec.label, dec.greedy,
                                           base_name),
                                       GenAIConfigRunner(genai_dflash[path], n, dec), dec))
    cached_peer: list[GenAIRunner | None] = []

    def genai_cached(dec: Decoding) -> GenAIConfigRunner | None:
        """openvino_genai's target alone with its prefix caching on (multi-turn rows), loaded once."""
        if not cached_peer:
            say(f"loading {target.name} (openvino_genai, prefix caching on)", None)
            try:
                cached_peer.append(GenAIRunner(target, None, spec.device, spec.precision, prefix_caching=True))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"target alone (openvino_genai, prefix caching on): skipped, it could not load: "
                             f"{_one_line(exc)}")
                cached_peer.append(None)
        return GenAIConfigRunner(cached_peer[0], 0, dec) if cached_peer[0] is not None else None

    configs[:] = per_setting(configs, spec.prefix_caching, spec.turns, genai_cached if spec.genai_target else None)


def _genai_dflash_refusal(variant: str | None, has_head: bool, dec: Decoding) -> str:
    if variant not in (None, "dflash_v1"):
        return f"openvino_genai's DFlash runs DFlash v1 drafts only (this one is {variant})"
    if has_head:
        return "openvino_genai's DFlash has no Markov head / selector"
    if not dec.plain_greedy:
        return "sampled or penalised rows: openvino_genai's DFlash is compared greedy only"
    return ""


def _one_line(exc: BaseException) -> str:
    """The telling line of an error (OpenVINO's start with "Exception from <file>:"); a list of reasons
    ("...:" then "- reason" lines, as a draft that does not fit says) is kept whole, joined by "; "."""
    lines = [x.strip() for x in str(exc).strip().splitlines() if x.strip()]
    lines = [x for x in lines if not x.startswith("Exception from ")] or lines
    if len(lines) > 1 and all(x.startswith("- ") for x in lines[1:]):
        text = lines[0].rstrip(":") + ": " + "; ".join(x[2:] for x in lines[1:])
        return text if len(text) <= 800 else text[:797] + "..."
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def check_prompts_fit(pipe: Any, encoded: list[tuple[str, list[int]]], max_new_tokens: int, dataset: str) -> None:
    """Every prompt must fit the target's context and KV cache with max_new_tokens, checked before the
    run (a prompt that does not fit would otherwise stop it midway, its results lost)."""
    check = getattr(pipe, "check_fits", None)
    if check is None:
        return
    for pid, ids in encoded:
        try:
            check(len(ids), max_new_tokens)
        except ContextLengthError as exc:
            raise ContextLengthError(f"Prompt {pid} of the {dataset} set: {exc}") from exc


def _aggregate(configs: list[_Config], prompt_ids: list[str]) -> list[Row]:
    """Rows over the prompts every configuration finished (`prompt_ids`, in order)."""
    rows: list[Row] = []
    baselines: dict[Decoding, _Config] = {}
    for c in configs:
        if c.row.engine == ENGINE and c.row.draft is None:
            baselines.setdefault(c.decoding, c)
    for c in configs:
        fresh = replace(c.row, first_differences=[])  # the template's counters are all zero
        base = baselines.get(c.decoding)
        fresh.matches_target = 0 if c.decoding.greedy else None
        for i, out in enumerate(c.outcomes[: len(prompt_ids)]):
            fresh.add(out)
            if c.decoding.greedy and base is not None:
                diff = _first_difference(out.token_ids, base.outcomes[i].token_ids)
                if diff is None:
                    fresh.matches_target += 1
                else:
                    fresh.first_differences.append(f"{prompt_ids[i]}@{diff}")
        rows.append(fresh)
    by_name = {r.config: r for r in rows}
    for r in rows:
        b = by_name.get(r.baseline)
        r.speedup = b.tpot_ms / r.tpot_ms if (b is not None and r.tpot_ms and b.tpot_ms) else 0.0
    return rows


# ---- tables -----------------------------------------------------------------------------------
TABLE_COLUMNS = ("config", "draft", "variant", "target", "dataset", "num_assistant_tokens", "markov_head_top_k",
                 "decoding", "tokens per step", "speedup", "tok/s", "TPOT ms", "TTFT ms", "matches target",
                 "acceptance", "draft step ms", "backbone ms", "head ms", "sampling ms")


def _fmt_matches(d: dict[str, object]) -> str:
    return "n/a (sampled)" if d["matches_target"] is None else f"{d['matches_target']}/{d['prompts']}"


def markdown_table(rows: list[Row]) -> str:
    head = "| " + " | ".join(TABLE_COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(TABLE_COLUMNS)]
    for r in rows:
        d = r.as_dict()
        acc = "-" if d["acceptance_rate"] is None else f"{100 * d['acceptance_rate']:.0f}%"
        k = "-" if d["markov_head_top_k"] is None else str(d["markov_head_top_k"])
        lines.append(f"| {d['config']} | {d['draft'] or '-'} | {d['variant'] or '-'} | {d['target']} | {d['dataset']} | "
                     f"{d['num_assistant_tokens'] or '-'} | {k} | {d['decoding']} | {d['tokens_per_step']:.2f} | "
                     f"{d['speedup']:.2f}x | {d['tok_s']:.1f} | {d['tpot_ms']:.2f} | {d['ttft_ms']:.1f} | "
                     f"{_fmt_matches(d)} | {acc} | {d['draft_step_ms']:.2f} | {d['draft_model_ms']:.2f} | "
                     f"{d['markov_head_ms']:.2f} | {d['sampling_ms']:.2f} |")
    return "\n".join(lines)


def csv_table(rows: list[Row]) -> str:
    buf = io.StringIO()
    dicts = [r.as_dict() for r in rows]
    if not dicts:
        return ""
    w = csv.DictWriter(buf, fieldnames=list(dicts[0].keys()))
    w.writeheader()
    for d in dicts:
        w.writerow(dict(d, first_differences=";".join(d["first_differences"])))
    return buf.getvalue()


# ---- command line -----------------------------------------------------------------------------
def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The bench's own options (engine/cli.py adds --target, --draft DIR..., --device, --precision)."""
    p.add_argument("--dataset", default="smoke",
                   help="humaneval | mt-bench | a set in resources/prompts (smoke, ...) | FILE.jsonl")
    p.add_argument("--prompts", type=int, default=4, help="number of prompts (0: the whole set)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-assistant-tokens", type=int, nargs="+", default=[None], metavar="N",
                   help="candidates per step, one row each (default: the draft's own: its config's "
                        "num_assistant_tokens, else a full block: 7 for an 8-row DFlash v1 block, 8 for DSpark)")
    p.add_argument("--markov-head-top-k", type=int, nargs="+", default=[None], metavar="K",
                   help="drafts with a Markov head: K of the Top-K scorer, one row each (0 = dense walk, DSpark)")
    p.add_argument("--temperature", type=float, nargs="+", default=[], metavar="T",
                   help="add sampled rows at these temperatures (greedy rows stay unless --no-greedy)")
    p.add_argument("--no-greedy", action="store_true", help="only the sampled rows")
    p.add_argument("--top-k", type=int, default=0, help="sampled rows: top-k (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampled rows: top-p")
    p.add_argument("--min-p", type=float, default=0.0, help="sampled rows: min-p")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="every row (greedy and sampled)")
    p.add_argument("--seed", type=int, default=0, help="sampled rows: random seed (default 0)")
    p.add_argument("--no-genai", action="store_true", help="skip both openvino_genai peers")
    p.add_argument("--no-genai-target", action="store_true", help="skip the target alone in openvino_genai")
    p.add_argument("--no-genai-dflash", action="store_true", help="skip openvino_genai's DFlash")
    p.add_argument("--turns", type=int, default=1, choices=range(1, 9), metavar="N",
                   help="user turns per conversation, each answer the next turn's history; rows report the last "
                        "(2: MT-Bench's second turn; more: --dataset chat-turns)")
    p.add_argument("--prefix-caching", nargs="+", default=["on"], choices=["on", "off"],
                   help="this engine's prefix cache (cleared before every conversation); both: one row each")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list (machine on stderr)")
    p.add_argument("--out", help="folder to write results.md / results.csv / results.json")
    from engine.bench.concurrency import add_concurrency_args

    add_concurrency_args(p)  # --concurrency N... and the scheduler options (engine/bench/concurrency.py)


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    from engine.catalog import resolve_models

    # No --draft: a catalogue target's drafts, all of them, the best first.
    target, drafts = resolve_models(args.target, args.draft or None)
    decodings: list[Decoding] = []
    if not args.no_greedy:
        decodings.append(Decoding(repetition_penalty=args.repetition_penalty))
    for t in args.temperature:
        decodings.append(Decoding(True, t, args.top_k, args.top_p, args.min_p, args.repetition_penalty,
                                  rng_seed=args.seed))
    return BenchSpec(target, drafts, args.dataset, args.prompts or None, args.max_new_tokens, args.device,
                     args.precision, list(args.num_assistant_tokens), list(args.markov_head_top_k), decodings,
                     genai_target=not (args.no_genai or args.no_genai_target),
                     genai_dflash=not (args.no_genai or args.no_genai_dflash),
                     turns=args.turns, prefix_caching=[x == "on" for x in dict.fromkeys(args.prefix_caching)])


def spec_command(spec: BenchSpec) -> str:
    """The `dflash-studio bench` command line that runs `spec` again."""
    parts = ["dflash-studio", "bench", "--target", str(spec.target)]
    parts += ["--draft", *map(str, spec.drafts)] if spec.drafts else ["--draft", "none"]
    parts += ["--device", spec.device, "--precision", spec.precision, "--dataset", spec.dataset,
              "--prompts", str(spec.prompts or 0), "--max-new-tokens", str(spec.max_new_tokens)]
    if any(n is not None for n in spec.num_assistant_tokens):
        parts += ["--num-assistant-tokens", *(str(n) for n in spec.num_assistant_tokens if n is not None)]
    if any(k is not None for k in spec.markov_head_top_k):
        parts += ["--markov-head-top-k", *(str(k) for k in spec.markov_head_top_k if k is not None)]
    sampled = [d for d in spec.decodings if d.do_sample]
    if sampled:
        d = sampled[0]
        parts += ["--temperature", *(f"{x.temperature:g}" for x in sampled)]
        if d.top_k:
            parts += ["--top-k", str(d.top_k)]
        if d.top_p < 1.0:
            parts += ["--top-p", f"{d.top_p:g}"]
        if d.min_p:
            parts += ["--min-p", f"{d.min_p:g}"]
        if d.rng_seed:
            parts += ["--seed", str(d.rng_seed)]
    if not any(d.greedy for d in spec.decodings):
        parts.append("--no-greedy")
    if spec.decodings and spec.decodings[0].repetition_penalty != 1.0:
        parts += ["--repetition-penalty", f"{spec.decodings[0].repetition_penalty:g}"]
    if spec.turns != 1:
        parts += ["--turns", str(spec.turns)]
    if spec.prefix_caching != [True]:
        parts += ["--prefix-caching", *("on" if x else "off" for x in spec.prefix_caching)]
    if not spec.genai_target and not spec.genai_dflash:
        parts.append("--no-genai")
    elif not spec.genai_dflash:
        parts.append("--no-genai-dflash")
    elif not spec.genai_target:
        parts.append("--no-genai-target")
    return " ".join(shlex.quote(x) for x in parts)


def run_cli(args: argparse.Namespace) -> int:
    from engine.bench import concurrency
    from engine.cli import _progress_printer

    if getattr(args, "concurrency", None):
        return concurrency.run_cli(args)  # N requests in flight per level: its own rows and tables
    spec = spec_from_args(args)
    scheduler = concurrency.make_scheduler(concurrency.scheduler_options(args))
    res = run_bench(spec, progress=_progress_printer(),
                    loader=concurrency.scheduler_loader(scheduler) if scheduler is not None else None)
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
