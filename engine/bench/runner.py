"""The bench: this engine and openvino_genai side by side on the same IR, the same prompts, one process.

Every configuration runs every prompt in turn (prompt-major order, so machine drift hits all alike)
after one untimed warm-up. TPOT = (wall - TTFT) / (tokens - 1) for every configuration, measured the
same way, and speedup = target-alone TPOT / configuration TPOT from the same run.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engine.bench.datasets import Prompt, load_prompts
from engine.config import GenerationConfig
from engine.models.properties import compile_properties


@dataclass
class Outcome:
    token_ids: list[int]
    text: str
    ttft_ms: float
    wall_ms: float
    target_steps: int  # decode steps after the prefill
    draft_step_ms: float = 0.0
    draft_model_ms: float = 0.0
    markov_head_ms: float = 0.0
    sampling_ms: float = 0.0


@dataclass
class Row:
    config: str
    engine: str
    target: str
    draft: str | None
    dataset: str
    num_assistant_tokens: int
    prompts: int = 0
    tokens: int = 0
    target_steps: int = 0
    decode_ms: float = 0.0
    ttft_ms_total: float = 0.0
    matches_target: int = 0
    first_differences: list[str] = field(default_factory=list)
    draft_step_ms: float = 0.0
    draft_model_ms: float = 0.0
    markov_head_ms: float = 0.0
    sampling_ms: float = 0.0
    speedup: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.tokens - self.prompts) / self.target_steps if self.target_steps else 0.0

    @property
    def tpot_ms(self) -> float:
        n = self.tokens - self.prompts
        return self.decode_ms / n if n > 0 else 0.0

    @property
    def tok_s(self) -> float:
        return 1e3 / self.tpot_ms if self.tpot_ms else 0.0

    def as_dict(self) -> dict[str, object]:
        steps = max(self.target_steps, 1)
        return {
            "config": self.config, "engine": self.engine, "target": self.target, "draft": self.draft,
            "dataset": self.dataset, "num_assistant_tokens": self.num_assistant_tokens, "prompts": self.prompts,
            "tokens": self.tokens, "tokens_per_step": round(self.tokens_per_step, 3),
            "tpot_ms": round(self.tpot_ms, 3), "tok_s": round(self.tok_s, 2), "speedup": round(self.speedup, 3),
            "ttft_ms": round(self.ttft_ms_total / max(self.prompts, 1), 2),
            "matches_target": self.matches_target, "first_differences": self.first_differences[:5],
            "draft_step_ms": round(self.draft_step_ms / steps, 3),
            "draft_model_ms": round(self.draft_model_ms / steps, 3),
            "markov_head_ms": round(self.markov_head_ms / steps, 3),
            "sampling_ms": round(self.sampling_ms / steps, 3),
        }


class EngineRunner:
    """This engine (SpeculativePipeline), target alone or with a draft."""

    def __init__(self, target: Path, draft: Path | None, device: str, precision: str) -> None:
        from engine.pipeline import SpeculativePipeline

        self.pipe = SpeculativePipeline.load(target, draft, device=device, precision=precision)
        self.num_assistant_tokens = self.pipe.default_num_candidates

    def encode(self, prompt: Prompt) -> list[int]:
        return self.pipe.encode_prompt(prompt.text, chat=prompt.chat and self.pipe.has_chat_template)

    def run(self, ids: list[int], max_new_tokens: int) -> Outcome:
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, num_assistant_tokens=self.num_assistant_tokens or None)
        t0 = time.perf_counter()
        res = self.pipe.generate(ids, cfg)
        wall = (time.perf_counter() - t0) * 1e3
        m = res.metrics
        return Outcome(res.token_ids, res.text, m.ttft_ms, wall, m.target_steps, sum(m.draft_step_ms),
                       sum(m.draft_model_ms), sum(m.markov_head_ms), sum(m.sampling_ms))


class GenAIRunner:
    """openvino_genai.LLMPipeline on the same IR: the target alone, or its DFlash with the same draft."""

    def __init__(self, target: Path, draft: Path | None, device: str, precision: str, num_assistant_tokens: int) -> None:
        import openvino_genai as ov_genai

        props = compile_properties(device, precision)
        props.pop("PERFORMANCE_HINT", None)
        if draft is None:
            self.pipe = ov_genai.LLMPipeline(str(target), device, **props)
        else:
            sc = ov_genai.SchedulerConfig()
            sc.enable_prefix_caching = False  # DFlash CB/PA refuses prefix caching
            self.pipe = ov_genai.LLMPipeline(str(target), device, scheduler_config=sc,
                                             draft_model=ov_genai.draft_model(str(draft), device, **props), **props)
        self.tokenizer = self.pipe.get_tokenizer()
        self.num_assistant_tokens = num_assistant_tokens
        self.draft = draft

    def run(self, ids: list[int], max_new_tokens: int) -> Outcome:
        import openvino as ov
        import openvino_genai as ov_genai

        cfg = ov_genai.GenerationConfig(max_new_tokens=max_new_tokens)
        if self.draft is not None:
            cfg.num_assistant_tokens = self.num_assistant_tokens
        t0 = time.perf_counter()
        res = self.pipe.generate(ov.Tensor(np.asarray([ids], dtype=np.int64)), cfg)
        wall = (time.perf_counter() - t0) * 1e3
        tokens = [int(t) for t in res.tokens[0]]
        eos = self.tokenizer.get_eos_token_id()
        if tokens and tokens[-1] == eos:
            tokens = tokens[:-1]
        ttft = res.perf_metrics.get_ttft().mean
        if self.draft is not None:
            steps = len(res.extended_perf_metrics.main_model_metrics.raw_metrics.m_durations) - 1
        else:
            steps = len(tokens) - 1
        return Outcome(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), ttft, wall, max(steps, 0))


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def describe_machine(device: str) -> dict[str, str]:
    import openvino as ov
    import openvino_genai as ov_genai

    core = ov.Core()
    cpu = core.get_property("CPU", "FULL_DEVICE_NAME") if "CPU" in core.available_devices else "?"
    full = core.get_property(device, "FULL_DEVICE_NAME") if device in core.available_devices else device
    import os

    return {"machine": f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}",
            "device": f"{device} ({full})", "python": platform.python_version(),
            "openvino": ov.get_version(), "openvino_genai": ov_genai.get_version()}


def run_bench(target: Path, drafts: list[Path], dataset: str, prompts: int, max_new_tokens: int,
              device: str = "CPU", precision: str = "default", genai: bool = True,
              num_assistant_tokens: int | None = None, progress=None) -> list[Row]:
    """Run every configuration on every prompt; return one Row per configuration."""
    items = load_prompts(dataset, prompts)
    configs: list[tuple[Row, object]] = []
    base = EngineRunner(target, None, device, precision)
    configs.append((Row("target alone (this engine)", "engine", target.name, None, dataset, 0), base))
    if genai:
        configs.append((Row("target alone (openvino_genai)", "openvino_genai", target.name, None, dataset, 0),
                        GenAIRunner(target, None, device, precision, 0)))
    for d in drafts:
        eng = EngineRunner(target, d, device, precision)
        if num_assistant_tokens:
            eng.num_assistant_tokens = num_assistant_tokens
        n = eng.num_assistant_tokens
        configs.append((Row(f"DFlash {d.name} (this engine)", "engine", target.name, d.name, dataset, n), eng))
        if genai:
            configs.append((Row(f"DFlash {d.name} (openvino_genai)", "openvino_genai", target.name, d.name, dataset, n),
                            GenAIRunner(target, d, device, precision, n)))
    warm = base.encode(items[0])
    for _, runner in configs:
        runner.run(warm, 8)
    total = len(items) * len(configs)
    done = 0
    for prompt in items:
        ids = base.encode(prompt)
        reference: list[int] | None = None
        for row, runner in configs:
            out = runner.run(ids, max_new_tokens)
            if reference is None:
                reference = out.token_ids
            row.prompts += 1
            row.tokens += len(out.token_ids)
            row.target_steps += out.target_steps
            row.decode_ms += out.wall_ms - out.ttft_ms
            row.ttft_ms_total += out.ttft_ms
            row.draft_step_ms += out.draft_step_ms
            row.draft_model_ms += out.draft_model_ms
            row.markov_head_ms += out.markov_head_ms
            row.sampling_ms += out.sampling_ms
            diff = _first_difference(out.token_ids, reference)
            if diff is None:
                row.matches_target += 1
            else:
                row.first_differences.append(f"{prompt.id}@{diff}")
            done += 1
            if progress:
                progress(f"{row.config}: {prompt.id}", done / total)
    base_tpot = configs[0][0].tpot_ms
    rows = [row for row, _ in configs]
    for row in rows:
        row.speedup = base_tpot / row.tpot_ms if row.tpot_ms else 0.0
    return rows


def markdown_table(rows: list[Row]) -> str:
    head = ("| config | draft | target | dataset | num_assistant_tokens | tokens per step | speedup | tok/s | "
            "TPOT ms | TTFT ms | matches target | draft step ms | backbone ms | head ms | sampling ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        d = r.as_dict()
        lines.append(f"| {d['config']} | {d['draft'] or '-'} | {d['target']} | {d['dataset']} | "
                     f"{d['num_assistant_tokens'] or '-'} | {d['tokens_per_step']:.2f} | {d['speedup']:.2f}x | "
                     f"{d['tok_s']:.1f} | {d['tpot_ms']:.2f} | {d['ttft_ms']:.1f} | {d['matches_target']}/{d['prompts']} | "
                     f"{d['draft_step_ms']:.2f} | {d['draft_model_ms']:.2f} | {d['markov_head_ms']:.2f} | "
                     f"{d['sampling_ms']:.2f} |")
    return "\n".join(lines)


def csv_table(rows: list[Row]) -> str:
    buf = io.StringIO()
    dicts = [r.as_dict() for r in rows]
    w = csv.DictWriter(buf, fieldnames=list(dicts[0].keys()))
    w.writeheader()
    for d in dicts:
        d = dict(d, first_differences=";".join(d["first_differences"]))
        w.writerow(d)
    return buf.getvalue()


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="smoke", help="humaneval | mt-bench | a resources/prompts set | FILE.jsonl")
    p.add_argument("--prompts", type=int, default=4, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-assistant-tokens", type=int, default=None, help="candidates per step (default: block-1)")
    p.add_argument("--no-genai", action="store_true", help="skip the openvino_genai peers")
    p.add_argument("--extra-draft", action="append", default=[], help="another draft folder (repeatable)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--out", help="folder to write results.md / results.csv / results.json")


def run_cli(args: argparse.Namespace) -> int:
    from engine.cli import _progress_printer, _resolve_models

    target, draft = _resolve_models(args)
    drafts = ([draft] if draft else []) + [Path(x) for x in args.extra_draft]
    rows = run_bench(target, drafts, args.dataset, args.prompts, args.max_new_tokens, args.device, args.precision,
                     genai=not args.no_genai, num_assistant_tokens=args.num_assistant_tokens,
                     progress=_progress_printer())
    machine = describe_machine(args.device)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(markdown_table(rows) + "\n")
        (out / "results.csv").write_text(csv_table(rows))
        (out / "results.json").write_text(json.dumps({"machine": machine, "rows": [r.as_dict() for r in rows]},
                                                     indent=1))
    if args.json:
        print(json.dumps([r.as_dict() for r in rows]))
    else:
        print("\n".join(f"{k}: {v}" for k, v in machine.items()))
        print(f"precision: {args.precision}; {args.prompts} x {args.dataset} prompts, {args.max_new_tokens} new tokens\n")
        print(markdown_table(rows))
    return 0
