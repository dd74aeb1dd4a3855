"""Row invariance of the target: does a row's logits depend on what else shares its inference?

Greedy speculative output equals the target alone's only if the target's verify call (a window of
k rows, maybe beside other requests' rows) computes each row exactly as the target's own one-row
decode does. `dflash-studio row-invariance` checks that directly: it takes the target's greedy
continuation of a few prompts, scores the same positions in several call layouts and reports, per
compile setting, the largest logit difference from the one-row decode:

- `window-k`: the continuation in windows of k rows (a verify of k-1 candidates);
- `batch-k`: the same windows, each call shared with other requests (one decoding a row per call,
  one verifying 3-row windows, one prefilling a long prompt in chunks);
- `prefill-k`: the same windows, each call shared with a request prefilling a 160-row chunk (more rows than
  the target lets one call hold: the target splits the call, as the engine's calls are split);
- `chunked-c`: the prompt prefilled in chunks of c rows, then decoded a row per call;
- `recompute-c`: the prompt and the continuation fed in chunks of c rows, as a preempted request
  is recomputed (a chunk can hold prompt rows and generated rows).

Row 0 of every layout is the prompt's last row (the first token's logits). Generated positions
(the decode, the windows, a neighbour's decode and verify rows) are past the chunks' `prompt_rows`,
as the pipeline marks them; the setting's row mode (engine/models/paged_target.py) decides what that
means. docs/engine.md has the findings this measured.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import openvino as ov

from engine.models.paged_target import ROW_MODES, PagedTarget, SeqChunk
from engine.models.properties import compile_properties, row_mode
from engine.models.tokenizer import TextTokenizer
from engine.scheduler import SchedulerConfig

PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number (0, 1, 1, 2, ...).\"\"\"\n",
    "Explain in a few sentences why the sky is blue.",
)
NEIGHBOUR_PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
                    "The keeper has lived alone for thirty years and the message is addressed to him. ") * 3
_SEQ, _NEIGHBOURS = 0, (1, 2, 3)
_NEIGHBOUR_CAP = 400  # a neighbour starts over past this many tokens
_LONG_CHUNK = 160  # rows of the prefill a `prefill-k` window shares its call with
_LARGEST_CALL = SchedulerConfig.max_num_batched_tokens + SchedulerConfig.max_num_seqs  # the engine's default


@dataclass
class Setting:
    """Compile properties plus the paged target's row mode ("split", "padded", "plain")."""

    name: str
    properties: dict[str, str]
    rows: str
    max_call_rows: int = _LARGEST_CALL  # the largest call the target is told of (0: calls of any size, no probe)


@dataclass
class LayoutResult:
    layout: str
    max_abs_diff: float  # over every scored row and logit, against the one-row decode
    equal_rows: int  # rows bit-identical to the decode's
    rows: int
    argmax_differs: int  # rows whose argmax differs from the decode's
    ms_per_call: float  # wall time of this layout's calls (noisy on a shared machine)
    cpu_ms_per_call: float = 0.0  # process CPU time (all threads) of this layout's calls


@dataclass
class SettingResult:
    setting: Setting
    layouts: list[LayoutResult] = field(default_factory=list)
    decode_ms_per_call: float = 0.0
    decode_cpu_ms_per_call: float = 0.0
    vs_first_setting: float | None = None  # decode logits against the first setting's (same precision only)


def standard_settings(device: str = "CPU") -> list[Setting]:
    """The settings that locate the cause: the shipped modes, then one property changed at a time."""
    default = compile_properties(device, "default")
    old = {k: v for k, v in default.items() if k != "KEY_CACHE_QUANT_MODE"}
    f32 = compile_properties(device, "f32")
    mode = row_mode(device)
    out = [Setting("default", default, mode),
           Setting("default, padded rows", default, "padded"),
           Setting("default, plain rows", default, "plain"),
           Setting("before (u8 keys by channel, plain rows)", old, "plain"),
           Setting("default, u8 keys by channel", old, mode),
           Setting("default, f16 KV", {**default, "KV_CACHE_PRECISION": "f16"}, mode),
           Setting("default, f32 KV", {**default, "KV_CACHE_PRECISION": "f32"}, mode)]
    for group in ("0", "64", "128"):
        out.append(Setting(f"default, dynamic quantization group {group}",
                           {**default, "DYNAMIC_QUANTIZATION_GROUP_SIZE": group}, mode))
    out += [Setting("default, 1 thread", {**default, "INFERENCE_NUM_THREADS": "1"}, mode),
            Setting("default, 1 thread, plain rows", {**default, "INFERENCE_NUM_THREADS": "1"}, "plain"),
            Setting("f32", f32, mode),
            Setting("f32, padded rows", f32, "padded"),
            Setting("f32, plain rows", f32, "plain")]
    return out


class _Scorer:
    """Scores forced continuations on one compiled target, one layout at a time."""

    def __init__(self, target: PagedTarget, neighbour_ids: list[int]) -> None:
        self.t = target
        self.neighbour_ids = neighbour_ids
        self.calls = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def _infer(self, chunks: list[SeqChunk]) -> list[np.ndarray]:
        for c in chunks:
            self.t.blocks.grow(c.seq, c.past + len(c.ids))
        t0, c0 = time.perf_counter(), time.process_time()
        out = self.t.infer(chunks, want_logits=True)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        self.calls += 1
        return [np.array(x) for x in out.logits]

    def _prefill(self, prompt: list[int], chunk: int, first_logits: list[np.ndarray]) -> None:
        for s in range(0, len(prompt), chunk):
            part = prompt[s: s + chunk]
            last = s + len(part) == len(prompt)
            got = self._infer([SeqChunk(_SEQ, part, s, int(last))])
            if last:
                first_logits.append(got[0][-1])

    def run(self, prompt: list[int], ids: list[int], layout: str, k: int) -> np.ndarray:
        """Logits of the prompt's last row and of every row of `ids` (fed at prompt_len + i)."""
        rows: list[np.ndarray] = []
        p = len(prompt)
        self.calls, self.seconds, self.cpu_seconds = 0, 0.0, 0.0
        try:
            if layout == "recompute":
                self._recompute(prompt + ids, p, k, rows)
                return np.stack(rows)
            if layout == "chunked":
                self._prefill(prompt, k, rows)
                k = 1
            else:
                self._prefill(prompt, p, rows)
            neighbours = {seq: 0 for seq in _NEIGHBOURS} if layout == "batch" else None
            for s in range(0, len(ids), k):
                window = ids[s: s + k]
                chunks = [SeqChunk(_SEQ, window, p + s, len(window), prompt_rows=0)]
                if neighbours is not None:
                    chunks += self._neighbour_chunks(neighbours)
                if layout == "prefill":
                    long = [self.neighbour_ids[j % len(self.neighbour_ids)] for j in range(_LONG_CHUNK)]
                    self.t.blocks.release(_NEIGHBOURS[-1])
                    chunks.append(SeqChunk(_NEIGHBOURS[-1], long, 0, 1))
                rows.extend(self._infer(chunks)[0])
        finally:
            for seq in (_SEQ, *_NEIGHBOURS):
                self.t.blocks.release(seq)
        return np.stack(rows)

    def _recompute(self, feed: list[int], p: int, chunk: int, rows: list[np.ndarray]) -> None:
        """`feed` in chunks of `chunk` rows, the first p at prompt positions; the logits of row p-1 on."""
        s = 0
        while s < len(feed):
            n = min(chunk, len(feed) - s)
            wanted = max(0, s + n - max(s, p - 1))
            got = self._infer([SeqChunk(_SEQ, feed[s: s + n], s, wanted, prompt_rows=max(0, min(n, p - s)))])
            rows.extend(got[0])
            s += n

    def _neighbour_chunks(self, lengths: dict[int, int]) -> list[SeqChunk]:
        """A request decoding one row, one verifying 3 rows, one prefilling 48-row chunks."""
        chunks = []
        for seq, rows in zip(_NEIGHBOURS, (1, 3, 48)):
            if lengths[seq] + rows > _NEIGHBOUR_CAP:
                self.t.blocks.release(seq)
                lengths[seq] = 0
            at = lengths[seq]
            toks = [self.neighbour_ids[(at + j) % len(self.neighbour_ids)] for j in range(rows)]
            chunks.append(SeqChunk(seq, toks, at, min(rows, 3), prompt_rows=rows if rows == 48 else 0))
            lengths[seq] = at + rows
        return chunks


def greedy_continuation(target: PagedTarget, prompt: list[int], tokens: int) -> list[int]:
    """The target's own greedy tokens after `prompt` (one row per call): the positions to score."""
    target.blocks.grow(_SEQ, len(prompt))
    out = target.infer([SeqChunk(_SEQ, prompt, 0, 1)])
    ids = [int(out.next_ids[0][-1])]
    try:
        for i in range(tokens - 1):
            target.blocks.grow(_SEQ, len(prompt) + i + 1)
            out = target.infer([SeqChunk(_SEQ, [ids[-1]], len(prompt) + i, 1, prompt_rows=0)])
            ids.append(int(out.next_ids[0][0]))
    finally:
        target.blocks.release(_SEQ)
    return ids


def measure(target_dir: Path, settings: list[Setting], prompts: list[str], tokens: int = 32,
            rows: tuple[int, ...] = (2, 4, 8), chunks: tuple[int, ...] = (7, 32), device: str = "CPU",
            progress: Callable[[str], object] | None = None) -> list[SettingResult]:
    """Score the same positions in every layout under every setting (see the module docstring)."""
    core = ov.Core()
    tok = TextTokenizer(target_dir)
    encoded = [tok.encode(p) for p in prompts]
    neighbour = tok.encode(NEIGHBOUR_PROMPT)
    forced: list[list[int]] | None = None
    first_decode: dict[str, list[np.ndarray]] = {}
    results = []
    for setting in settings:
        if progress:
            progress(setting.name)
        target = PagedTarget(target_dir, core, device, setting.properties, rows=setting.rows, num_blocks=96,
                             max_call_rows=setting.max_call_rows)
        if forced is None:  # the first setting's greedy tokens are scored everywhere: the same positions
            forced = [greedy_continuation(target, p, tokens) for p in encoded]
        scorer = _Scorer(target, neighbour)
        ref = []
        decode_s, decode_cpu, decode_calls = 0.0, 0.0, 0
        for p, ids in zip(encoded, forced):
            ref.append(scorer.run(p, ids[:-1], "window", 1))
            decode_s, decode_cpu = decode_s + scorer.seconds, decode_cpu + scorer.cpu_seconds
            decode_calls += scorer.calls
        res = SettingResult(setting, decode_ms_per_call=1e3 * decode_s / max(1, decode_calls),
                            decode_cpu_ms_per_call=1e3 * decode_cpu / max(1, decode_calls))
        precision_key = _precision_key(setting.properties)
        if precision_key in first_decode:
            res.vs_first_setting = max(float(np.abs(a - b).max()) for a, b in zip(ref, first_decode[precision_key]))
        else:
            first_decode[precision_key] = ref
        plan = ([("window", k) for k in rows] + [("batch", k) for k in (1, *rows)] + [("prefill", max(rows))]
                + [("chunked", c) for c in chunks] + [("recompute", c) for c in chunks])
        for layout, k in plan:
            diff, equal, n, flips, secs, cpu, calls = 0.0, 0, 0, 0, 0.0, 0.0, 0
            for p, ids, r in zip(encoded, forced, ref):
                got = scorer.run(p, ids[:-1], layout, k)
                d = np.abs(got - r).max(axis=1)
                diff = max(diff, float(d.max()))
                equal += int(np.sum(d == 0))
                n += len(d)
                flips += int(np.sum(got.argmax(1) != r.argmax(1)))
                secs, cpu, calls = secs + scorer.seconds, cpu + scorer.cpu_seconds, calls + scorer.calls
            res.layouts.append(LayoutResult(f"{layout}-{k}", diff, equal, n, flips, 1e3 * secs / max(1, calls),
                                            1e3 * cpu / max(1, calls)))
        results.append(res)
        del target
    return results


def _precision_key(props: dict[str, str]) -> tuple:
    """Settings that differ only in threads or row mode are compared (their decode logits may differ)."""
    return tuple(sorted((k, v) for k, v in props.items() if k != "INFERENCE_NUM_THREADS"))


def format_results(results: list[SettingResult]) -> str:
    lines = ["| setting | layout | max abs logit diff | rows bit-identical | argmax differs | ms/call | CPU ms/call |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        extra = "" if r.vs_first_setting is None else f"; decode vs same properties above: {r.vs_first_setting:.3g}"
        lines.append(f"| {r.setting.name} | decode (reference{extra}) | 0 | all | 0 | {r.decode_ms_per_call:.1f} | "
                     f"{r.decode_cpu_ms_per_call:.1f} |")
        for lay in r.layouts:
            lines.append(f"| | {lay.layout} | {lay.max_abs_diff:.3g} | {lay.equal_rows}/{lay.rows} | "
                         f"{lay.argmax_differs} | {lay.ms_per_call:.1f} | {lay.cpu_ms_per_call:.1f} |")
    return "\n".join(lines)


def _parse_setting(text: str, device: str) -> Setting:
    """'name:KEY=VALUE,KEY=VALUE[,rows=MODE][,calls=N]' on top of the default properties (calls: the largest call
    the target is told of; 0 lets calls be of any size)."""
    name, _, body = text.partition(":")
    props = compile_properties(device, "default")
    rows = row_mode(device)
    calls = _LARGEST_CALL
    for item in filter(None, body.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--setting {text!r}: {item!r} is not KEY=VALUE (e.g. KV_CACHE_PRECISION=f16, "
                             "rows=plain).")
        if key == "rows":
            if value not in ROW_MODES:
                raise ValueError(f"--setting {text!r}: rows={value!r} is not one of {', '.join(ROW_MODES)}.")
            rows = value
        elif key == "calls":
            if not value.isdigit():
                raise ValueError(f"--setting {text!r}: calls={value!r} is not a whole number of rows (0: any size).")
            calls = int(value)
        else:
            props[key] = value
    return Setting(name or body, props, rows, calls)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target OpenVINO folder (default: the embedded SmolLM2)")
    p.add_argument("--device", default="CPU")
    p.add_argument("--setting", action="append", metavar="NAME:KEY=VALUE,...",
                   help="a setting on top of the default properties (rows=split|padded|plain: the row mode); "
                        "repeatable "
                        "(default: the standard sweep)")
    p.add_argument("--prompt", action="append", help="prompt text (repeatable; default: a code and a chat prompt)")
    p.add_argument("--tokens", type=int, default=32, help="greedy tokens scored per prompt")
    p.add_argument("--rows", type=int, nargs="+", default=[2, 4, 8], help="window sizes")
    p.add_argument("--chunks", type=int, nargs="+", default=[7, 32], help="prefill chunk sizes")
    p.add_argument("--json", action="store_true")


def run_cli(args: argparse.Namespace, target: Path) -> int:
    """`dflash-studio row-invariance` on `target` (engine/cli.py resolves the embedded default)."""
    import sys

    settings = ([_parse_setting(s, args.device) for s in args.setting] if args.setting
                else standard_settings(args.device))
    results = measure(target, settings, args.prompt or list(PROMPTS), args.tokens, tuple(args.rows),
                      tuple(args.chunks), args.device, progress=lambda m: print(f"scoring: {m}", file=sys.stderr))
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
    else:
        print(format_results(results))
    return 0
