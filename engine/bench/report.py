"""What a bench run measured, and how it is written: rows, Markdown, CSV and JSON.

Every configuration's requests are kept as `RequestRun`s; a `Row` derives its figures from them.
Two layouts read the same rows:

- per prompt (no `--concurrency`): each prompt ran alone, so TPOT = (wall - TTFT) / (tokens - 1)
  summed over the prompts, tok/s = 1000 / TPOT, and the speedup is the TPOT of this engine's target
  alone with the same decoding over the row's;
- per level (`--concurrency N ...`): N requests were in flight, so tok/s is the aggregate (all
  tokens / the batch's wall time), TPOT and TTFT are means (with p50, p90) over the requests, and
  the speedup is the aggregate tok/s over this engine's target alone's at the same N and decoding.

Both: tokens per step = tokens the request's target steps produced (a final EOS included) / those
steps; num_assistant_tokens is the count the draft proposes per window, "verified" the mean count
the target checked (the adaptive draft policy checks fewer where they do not pay), acceptance =
accepted / verified; the draft and target timings are per target step, the step's one shared
inference each.
"""
from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ENGINE = "engine"
GENAI = "openvino_genai"
GENAI_CB = "openvino_genai CB"


@dataclass
class RequestRun:
    """One request of one configuration: its output and what it took."""

    prompt_id: str
    token_ids: list[int]
    text: str
    ttft_ms: float  # add_request -> end of the step that gave its first token
    e2e_ms: float  # add_request -> end of the step that finished it
    target_steps: int = 0  # decode steps after the prefill
    produced: int = 0  # tokens those steps produced, a final EOS included
    drafted: int = 0  # candidates the draft proposed
    accepted: int = 0
    preemptions: int = 0
    verified: int = 0  # candidates the target checked
    windows: int = 0  # validation windows closed
    draft_step_ms: float = 0.0  # sums over the request's steps (of the step's shared inferences, when batched)
    draft_model_ms: float = 0.0
    markov_head_ms: float = 0.0
    sampling_ms: float = 0.0
    target_ms: float = 0.0
    confidence_sum: float = 0.0
    confidence_n: int = 0
    finish_reason: str = ""

    @property
    def decode_tokens(self) -> int:
        return max(len(self.token_ids) - 1, 0)

    @property
    def tpot_ms(self) -> float | None:
        """(finish - first token) / (tokens - 1); None with fewer than 2 tokens."""
        n = len(self.token_ids)
        return (self.e2e_ms - self.ttft_ms) / (n - 1) if n > 1 else None


@dataclass
class BatchRun:
    """One call of a runner: its requests and what the driver loop counted."""

    requests: list[RequestRun]
    wall_ms: float
    steps: int  # step() calls
    scheduled: int  # requests scheduled, summed over the steps
    emitted: int  # tokens the events carried, summed over the steps
    cancelled: bool = False


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else 0.0


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _count(xs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


@dataclass
class Row:
    """One configuration (at one level of concurrency, or each prompt alone when `concurrency` is None)."""

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
    baseline: str = ""  # this engine's target alone with the same decoding (speedup and matches)
    concurrency: int | None = None  # None: the per-prompt layout (each prompt alone, prompt-major)
    requests: list[RequestRun] = field(default_factory=list)
    wall_ms: float = 0.0  # the batch's wall time (per level)
    pipeline_steps: int = 0
    scheduled: int = 0
    emitted: int = 0
    matches_target: int | None = 0  # None: not compared (sampled)
    first_differences: list[str] = field(default_factory=list)
    speedup: float = 0.0
    vs_genai_cb: float | None = None

    @property
    def per_prompt(self) -> bool:
        return self.concurrency is None

    def _sum(self, name: str) -> float:
        return sum(getattr(r, name) for r in self.requests)

    @property
    def prompts(self) -> int:
        return len(self.requests)

    @property
    def tokens(self) -> int:
        """All generated tokens (each request's output, a final EOS not counted)."""
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def decode_tokens(self) -> int:
        return sum(r.decode_tokens for r in self.requests)

    @property
    def target_steps(self) -> int:
        return sum(r.target_steps for r in self.requests)

    @property
    def produced(self) -> int:
        return sum(r.produced for r in self.requests)

    @property
    def decode_ms(self) -> float:
        """Wall time after the first token, summed over the requests."""
        return sum(max(r.e2e_ms - r.ttft_ms, 0.0) for r in self.requests)

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.requests)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.requests)

    @property
    def verified(self) -> int:
        return sum(r.verified for r in self.requests)

    @property
    def mean_verified(self) -> float | None:
        """Candidates the target checked per window (None without windows)."""
        windows = sum(r.windows for r in self.requests)
        return self.verified / windows if windows else None

    @property
    def draft_model_ms(self) -> float:
        return self._sum("draft_model_ms")

    @property
    def markov_head_ms(self) -> float:
        return self._sum("markov_head_ms")

    @property
    def tokens_per_step(self) -> float:
        """Tokens per target step after the prefill (accepted drafts + the target's own, a final EOS included)."""
        steps = self.target_steps
        return self.produced / steps if steps else 0.0

    @property
    def tpots(self) -> list[float]:
        return [t for t in (r.tpot_ms for r in self.requests) if t is not None]

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft_ms for r in self.requests]

    @property
    def tpot_ms(self) -> float:
        """Per prompt: (wall - TTFT) / (tokens - 1) summed over the prompts; per level: the requests' mean."""
        if self.per_prompt:
            return self.decode_ms / self.decode_tokens if self.decode_tokens else 0.0
        return _mean(self.tpots)

    @property
    def tok_s(self) -> float:
        """Per prompt: 1000 / TPOT; per level: all generated tokens / wall time of the whole batch."""
        if self.per_prompt:
            return 1e3 / self.tpot_ms if self.tpot_ms else 0.0
        return 1e3 * self.tokens / self.wall_ms if self.wall_ms else 0.0

    @property
    def ttft_ms(self) -> float:
        return _mean(self.ttfts)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / verified candidates."""
        return self.accepted / self.verified if self.verified else None

    def _per_step(self, name: str) -> float:
        return round(self._sum(name) / max(self.target_steps, 1), 3)

    def as_dict(self) -> dict[str, object]:
        """The row's JSON object (and CSV columns) in its layout."""
        rate = self.acceptance_rate
        acceptance = None if rate is None else round(rate, 4)
        verified = None if self.mean_verified is None else round(self.mean_verified, 3)
        target_ms = self._per_step("target_ms") if self.engine == ENGINE else None
        if self.per_prompt:
            conf_n = sum(r.confidence_n for r in self.requests)
            return {
                "config": self.config, "engine": self.engine, "target": self.target, "draft": self.draft,
                "variant": self.variant, "dataset": self.dataset, "num_assistant_tokens": self.num_assistant_tokens,
                "mean_verified": verified,
                "markov_head_top_k": self.markov_head_top_k, "decoding": self.decoding, "prompts": self.prompts,
                "tokens": self.tokens, "target_steps": self.target_steps,
                "tokens_per_step": round(self.tokens_per_step, 3), "tpot_ms": round(self.tpot_ms, 3),
                "tok_s": round(self.tok_s, 2), "speedup": round(self.speedup, 3), "baseline": self.baseline,
                "ttft_ms": round(self.ttft_ms, 2),
                "matches_target": self.matches_target, "first_differences": self.first_differences[:5],
                "acceptance_rate": acceptance,
                "confidence": round(self._sum("confidence_sum") / conf_n, 4) if conf_n else None,
                "draft_step_ms": self._per_step("draft_step_ms"), "draft_model_ms": self._per_step("draft_model_ms"),
                "markov_head_ms": self._per_step("markov_head_ms"), "sampling_ms": self._per_step("sampling_ms"),
                "target_ms": target_ms,
            }
        tp, tt = self.tpots, self.ttfts
        steps = self.pipeline_steps
        return {
            "config": self.config, "engine": self.engine, "target": self.target, "draft": self.draft,
            "variant": self.variant, "dataset": self.dataset, "concurrency": self.concurrency,
            "num_assistant_tokens": self.num_assistant_tokens, "mean_verified": verified,
            "markov_head_top_k": self.markov_head_top_k,
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
            "acceptance_rate": acceptance,
            "preemptions": sum(r.preemptions for r in self.requests),
            "step_ms": round(self.wall_ms / steps, 3) if steps else 0.0,
            # Per target step of a request, averaged over the requests' steps: with batching these are the
            # times of the step's ONE shared draft stage / target inference, not a request's share of them.
            "draft_step_ms": self._per_step("draft_step_ms"), "draft_model_ms": self._per_step("draft_model_ms"),
            "markov_head_ms": self._per_step("markov_head_ms"), "target_ms": target_ms,
            "finish_reasons": _count([r.finish_reason for r in self.requests]),
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
    per_level: bool = False  # the rows are per level of concurrency (--concurrency)
    # per configuration with a confidence head: "greedy" / "sampled" -> the adaptive policy's calibration counts
    # (engine.draft_policy.Calibration.reliability; engine/bench/reliability.py plots them)
    reliability: dict[str, dict[str, dict]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"machine": self.machine, "settings": self.settings, "notes": self.notes,
                                  "cancelled": self.cancelled}
        if not self.per_level:
            out["prompts_done"] = self.prompts_done
        out["rows"] = [r.as_dict() for r in self.rows]
        if self.reliability:
            out["reliability"] = self.reliability
        return out

    def header_lines(self) -> list[str]:
        s = self.settings
        lines = [f"{k}: {v}" for k, v in self.machine.items()]
        if not self.per_level:
            lines.append(f"precision: {s.get('precision')}; {self.prompts_done} x {s.get('dataset')} prompts, "
                         f"{s.get('max_new_tokens')} new tokens"
                         + (f" (cancelled after {self.prompts_done} of {self.prompts_planned} prompts)"
                            if self.cancelled else ""))
        else:
            lines.append(f"precision: {s.get('precision')}; {s.get('prompts')} x {s.get('dataset')} prompts, "
                         f"{s.get('max_new_tokens')} new tokens, concurrency {s.get('concurrency')}"
                         + (" (cancelled)" if self.cancelled else ""))
            lines.append(f"scheduler (this engine): {s.get('scheduler')}")
            if s.get("genai_scheduler"):
                lines.append(f"scheduler ({GENAI_CB}): {s['genai_scheduler']}")
            if s.get("load_average"):
                lines.append(f"load average (1 min) before / after: {s['load_average']}")
        if s.get("command"):
            lines.append(f"command: {s['command']}")
        return lines

    def markdown(self) -> str:
        out = self.header_lines() + ["", markdown_table(self.rows, self.per_level)]
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"

    def csv(self) -> str:
        return csv_table(self.rows)


# ---- tables -----------------------------------------------------------------------------------
PROMPT_COLUMNS = ("config", "draft", "variant", "target", "dataset", "num_assistant_tokens", "verified",
                  "markov_head_top_k", "decoding", "tokens per step", "speedup", "tok/s", "TPOT ms", "TTFT ms", "matches target",
                  "acceptance", "draft step ms", "backbone ms", "head ms", "sampling ms")
LEVEL_COLUMNS = ("config", "concurrency", "decoding", "prompts", "tokens", "wall s", "aggregate tok/s",
                 "vs target alone", "vs genai CB", "TPOT ms mean", "TPOT p50", "TPOT p90", "TTFT ms mean",
                 "TTFT p50", "TTFT p90", "tokens per step", "verified", "tokens per pipeline step", "requests per step",
                 "step ms", "target ms", "draft ms", "matches target", "acceptance", "preemptions")


def _matches(d: dict[str, object]) -> str:
    return "n/a (sampled)" if d["matches_target"] is None else f"{d['matches_target']}/{d['prompts']}"


def _acceptance(d: dict[str, object]) -> str:
    return "-" if d["acceptance_rate"] is None else f"{100 * d['acceptance_rate']:.0f}%"


def _verified(d: dict[str, object]) -> str:
    return "-" if d.get("mean_verified") is None else f"{d['mean_verified']:.2f}"


def _prompt_line(d: dict) -> str:
    k = "-" if d["markov_head_top_k"] is None else str(d["markov_head_top_k"])
    return (f"| {d['config']} | {d['draft'] or '-'} | {d['variant'] or '-'} | {d['target']} | {d['dataset']} | "
            f"{d['num_assistant_tokens'] or '-'} | {_verified(d)} | {k} | {d['decoding']} | {d['tokens_per_step']:.2f} | "
            f"{d['speedup']:.2f}x | {d['tok_s']:.1f} | {d['tpot_ms']:.2f} | {d['ttft_ms']:.1f} | "
            f"{_matches(d)} | {_acceptance(d)} | {d['draft_step_ms']:.2f} | {d['draft_model_ms']:.2f} | "
            f"{d['markov_head_ms']:.2f} | {d['sampling_ms']:.2f} |")


def _level_line(d: dict) -> str:
    vs = "-" if d["vs_genai_cb"] is None else f"{d['vs_genai_cb']:.2f}x"
    target = "-" if d["target_ms"] is None else format(d["target_ms"], ".1f")
    return (f"| {d['config']} | {d['concurrency']} | {d['decoding']} | {d['prompts']} | {d['tokens']} | "
            f"{d['wall_ms'] / 1e3:.2f} | {d['tok_s']:.1f} | {d['speedup']:.2f}x | {vs} | "
            f"{d['tpot_ms']:.2f} | {d['tpot_p50_ms']:.2f} | {d['tpot_p90_ms']:.2f} | {d['ttft_ms']:.1f} | "
            f"{d['ttft_p50_ms']:.1f} | {d['ttft_p90_ms']:.1f} | {d['tokens_per_step']:.2f} | {_verified(d)} | "
            f"{d['tokens_per_pipeline_step']:.2f} | {d['requests_per_step']:.2f} | {d['step_ms']:.1f} | "
            f"{target} | {d['draft_step_ms']:.1f} | {_matches(d)} | {_acceptance(d)} | {d['preemptions']} |")


def markdown_table(rows: list[Row], per_level: bool = False) -> str:
    columns, line = (LEVEL_COLUMNS, _level_line) if per_level else (PROMPT_COLUMNS, _prompt_line)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [line(r.as_dict()) for r in rows]
    return "\n".join(lines)


def csv_table(rows: list[Row]) -> str:
    dicts = [r.as_dict() for r in rows]
    if not dicts:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dicts[0].keys()))
    w.writeheader()
    for d in dicts:
        flat = dict(d, first_differences=";".join(d["first_differences"]))
        if "finish_reasons" in d:
            flat["finish_reasons"] = ";".join(f"{k}={v}" for k, v in d["finish_reasons"].items())
        w.writerow(flat)
    return buf.getvalue()


def write_reports(result: BenchResult, folder: Path) -> None:
    """results.md, results.csv and results.json in `folder` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.md").write_text(result.markdown())
    (folder / "results.csv").write_text(result.csv())
    (folder / "results.json").write_text(json.dumps(result.as_dict(), indent=1))


def print_report(result: BenchResult, as_json: bool) -> None:
    """The Markdown report on stdout; with `as_json` the rows as a JSON list there and the header on stderr."""
    if as_json:
        print("\n".join(result.header_lines() + [f"note: {n}" for n in result.notes]), file=sys.stderr)
        print(json.dumps([r.as_dict() for r in result.rows]))
    else:
        print(result.markdown())
