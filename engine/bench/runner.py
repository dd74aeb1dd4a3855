"""The bench: this engine and openvino_genai side by side on the same IR, the same prompts, one process.

One runner for `dflash-studio bench` and the app's comparison panel. A `BenchSpec` says what to
compare: the target alone (this engine, always: it is every speedup's baseline), the target alone
through openvino_genai, each draft in this engine once per num_assistant_tokens x markov_head_top_k
(K only for drafts with a Markov head) x decoding (greedy and/or sampled settings) x draft policy,
and, one request at a time, openvino_genai's own DFlash with the same draft where it can run (DFlash
v1 drafts without a head, greedy); configurations that cannot run are skipped with a note saying why.

Every configuration is driven the same way: its engine gets N requests in flight through
add_request / step (whenever one finishes the next prompt is added); a single request is N = 1.
- Without `concurrency` each prompt runs alone, and every configuration runs every prompt in turn
  (prompt-major order, so machine drift hits all alike), the order rotated by one each prompt: the
  configuration that always ran right after the target alone drafted ~0.6 ms a call slower than the
  next one of the same draft, and rotated the two are level (docs/benchmarks.md, "Symmetric int8");
  the peer is openvino_genai.LLMPipeline.
- With `concurrency` levels, for each N every configuration runs all prompts (level-major); the
  peer is ContinuousBatchingPipeline with the target alone, under the same scheduler budget.
One untimed warm-up (of N requests) per configuration comes first. engine/bench/report.py says how
each layout's figures are computed. Greedy outputs are compared token by token with this engine's
target alone (`matches_target`, first differences); sampled outputs are not (they match in
distribution, not token for token).

`progress(message, fraction)` reports as it goes; `cancel()` is asked between loads, prompts and
configurations, and before every step of this engine; a cancelled run returns what every
configuration finished (the prompts, or the levels).
"""
from __future__ import annotations

import os
import platform
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.api import Engine, load_engine
from engine.bench.datasets import Prompt, load_prompts
from engine.bench.peers import CBPeer, CBRunner, LLMPeer, LLMRunner
from engine.bench.report import ENGINE, GENAI, GENAI_CB, BatchRun, BenchResult, RequestRun, Row
from engine.bench.spec import (SCHEDULER_FIELDS, BenchSpec, Decoding, effective_scheduler, make_scheduler,
                               spec_command)
from engine.bench.turns import caching_label, check_turns, fresh_cache, per_setting, run_turns, turn_notes
from engine.config import GenerationConfig
from engine.draft_policy import DEFAULT_POLICY, make_policy
from engine.errors import ContextLengthError, DFlashError

__all__ = ["BenchResult", "BenchSpec", "Decoding", "Row", "run_bench", "describe_machine", "default_loader"]

Progress = Callable[[str, "float | None"], object]
Cancel = Callable[[], bool]
Loader = Callable[..., Engine]  # (target, draft, device=, precision=) -> an Engine (engine/api.py)

WARMUP_TOKENS = 8


def default_loader(target: Path, draft: Path | None, device: str = "CPU", precision: str = "default",
                   **kw: Any) -> Engine:
    return load_engine(target, draft, device=device, precision=precision, **kw)


def scheduler_loader(scheduler: Any | None, base: Loader | None = None) -> Loader:
    """A loader that passes `scheduler` on to the engine (unchanged when it is None)."""
    base = base or default_loader
    if scheduler is None:
        return base
    return lambda target, draft, device="CPU", precision="default": base(
        target, draft, device=device, precision=precision, scheduler=scheduler)


# ---- this engine --------------------------------------------------------------------------------
@dataclass
class _Live:
    prompt_id: str
    t_add: float
    rid: int
    t_first: float | None = None
    confidence_sum: float = 0.0
    confidence_n: int = 0


class EngineRunner:
    """This engine with one GenerationConfig: N requests in flight through add_request / step."""

    engine = ENGINE

    def __init__(self, pipe: Engine, config: GenerationConfig, draft_policy: str | None = None) -> None:
        self.pipe = pipe
        # The policy is each request's setting; its state (the costs it measured, the calibration of the draft's
        # confidence) is one per configuration, kept across its runs as in an app that runs for a while, and
        # swapped into the loaded engine (SpeculativePipeline.policy) so that several configurations share one load.
        self.config = config if draft_policy is None else config.copy(draft_policy=draft_policy)
        self.draft_policy = draft_policy
        self.policy_state = make_policy(draft_policy) if draft_policy else None
        self.prefix_caching: bool | None = None  # this configuration's setting (turns.per_setting); None: as loaded

    def encode(self, prompt: Prompt) -> list[int]:
        return self.pipe.encode_prompt(prompt.text, chat=prompt.chat and self.pipe.describe().has_chat_template)

    def run(self, items: list[tuple[str, list[int]]], concurrency: int, max_new_tokens: int,
            cancel: Cancel | None = None) -> BatchRun:
        pipe = self.pipe
        if self.policy_state is not None and getattr(pipe, "policy", None) is not None:
            pipe.policy = self.policy_state
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
            scheduled += len(pipe.last_step.requests)
            for ev in events:
                emitted += len(ev.tokens)
                lv = live.get(ev.request_id)
                if lv is None:
                    continue
                if ev.tokens and lv.t_first is None:
                    lv.t_first = now
                if ev.confidence:
                    lv.confidence_sum += float(sum(ev.confidence[: len(ev.drafted)]))
                    lv.confidence_n += min(len(ev.confidence), len(ev.drafted))
                if ev.finished:
                    done.append(self._finish(lv, ev.finish_reason or "", now))
                    del live[ev.request_id]
            if not events and live and not pipe.has_unfinished():
                raise DFlashError(f"the engine finished requests {sorted(live)} without a finishing event.")
            if not cancelled:
                top_up()
        return BatchRun(done, (time.perf_counter() - t0) * 1e3, steps, scheduled, emitted, cancelled)

    def _finish(self, lv: _Live, reason: str, now: float) -> RequestRun:
        res = self.pipe.result(lv.rid)
        m = res.metrics
        tokens = [int(t) for t in res.token_ids]
        t_first = lv.t_first if lv.t_first is not None else now
        return RequestRun(lv.prompt_id, tokens, res.text, (t_first - lv.t_add) * 1e3, (now - lv.t_add) * 1e3,
                          m.target_steps, m.decode_produced, m.drafted_total, m.accepted_total, m.preemptions,
                          m.verified_total, m.windows, sum(m.draft_step_ms), sum(m.draft_model_ms),
                          sum(m.markov_head_ms), sum(m.sampling_ms), sum(m.target_ms), lv.confidence_sum,
                          lv.confidence_n, str(res.finish_reason or reason))


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
    row: Row  # the template: names and settings, no requests yet
    runner: Any  # EngineRunner | peers.LLMRunner | peers.CBRunner
    decoding: Decoding
    runs: dict[int, BatchRun] = field(default_factory=dict)  # level -> what it did (per prompt: level 1, merged)
    turn_ttft_ms: list[list[float]] = field(default_factory=list)  # per finished prompt, the TTFT of each turn


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def run_bench(spec: BenchSpec, progress: Progress | None = None, cancel: Cancel | None = None,
              loader: Loader | None = None, machine: dict[str, str] | None = None) -> BenchResult:
    """Run every configuration of `spec` on every prompt (at every level); one Row per configuration (and level)."""
    spec.validate()
    levels = spec.levels
    loader = scheduler_loader(make_scheduler(spec.scheduler), loader)
    say = progress or (lambda _m, _f=None: None)
    stop = cancel or (lambda: False)
    items = load_prompts(spec.dataset, spec.prompts)
    if not items:
        raise DFlashError(f"The prompt set {spec.dataset!r} is empty.")
    check_turns(items, spec.turns)
    target = Path(spec.target)
    notes: list[str] = []
    configs: list[_Config] = []
    settings: dict[str, object] = {
        "target": target.name, "dataset": spec.dataset, "prompts": len(items), "max_new_tokens": spec.max_new_tokens,
        "device": spec.device, "precision": spec.precision, "turns": spec.turns,
        "prefix_caching": [caching_label(x) for x in spec.prefix_caching] if levels is None
        else [caching_label(False)]}
    load_before = _loadavg()
    if levels is None:
        settings["order"] = ("prompt-major, the configurations' order rotated by one each prompt, one request at a "
                             "time, one untimed warm-up per configuration")
    else:
        eff = effective_scheduler(spec.scheduler)
        settings.update(concurrency=levels, scheduler=", ".join(f"{k}={eff[k]}" for k in SCHEDULER_FIELDS),
                        order="level-major (for each N every configuration), N requests in flight through "
                              "add_request/step, one untimed warm-up batch per configuration")
        if spec.drafts and spec.genai_dflash:
            notes.append("openvino_genai's DFlash (LLMPipeline with a draft) has no rows here: the peer at N "
                         "requests is ContinuousBatchingPipeline with the target alone.")
        if levels[-1] > len(items):
            notes.append(f"concurrency {levels[-1]} > {len(items)} prompts: at most {len(items)} requests are in "
                         "flight.")
        if eff.get("max_num_seqs") and levels[-1] > int(eff["max_num_seqs"]):
            notes.append(f"concurrency {levels[-1]} > max_num_seqs={eff['max_num_seqs']}: the engine schedules at "
                         f"most {eff['max_num_seqs']} requests per step.")
    settings["command"] = spec_command(spec)
    done_prompts = 0

    def result(cancelled: bool) -> BenchResult:
        if levels is not None:
            settings["load_average"] = f"{load_before} / {_loadavg()}"
        rows = _aggregate(configs, levels or [1], [p.id for p in items], levels is None)
        return BenchResult(rows, notes + turn_notes(configs, spec.turns, done_prompts),
                           machine if machine is not None else describe_machine(spec.device),
                           settings, cancelled, done_prompts, len(items), levels is not None,
                           _reliability(configs))

    try:
        _plan(spec, target, loader, say, stop, notes, configs, settings)
    except _Cancelled:
        configs.clear()
        return result(True)

    # Warm-up: one short untimed run per configuration (also where the engine refuses a setting).
    say("warming up", None)
    encoder = configs[0].runner
    encoded = [(p.id, encoder.encode(p)) for p in items]
    check_prompts_fit(encoder.pipe, encoded, spec.max_new_tokens, spec.dataset)
    top = levels[-1] if levels else 1
    warm = encoded[: max(1, min(top, len(encoded)))]
    kept: list[_Config] = []
    for c in configs:
        if stop():
            configs[:] = kept
            return result(True)
        refused = (ValueError, DFlashError) if c.row.engine == ENGINE else Exception  # a peer's own errors
        try:
            fresh_cache(c.runner)
            c.runner.run(warm, len(warm), WARMUP_TOKENS)
        except refused as exc:
            if c.row.engine == ENGINE and c.row.draft is None:
                raise  # the baseline itself cannot run: nothing to compare with
            notes.append(f"{c.row.config}: skipped, {_one_line(exc)}")
            continue
        kept.append(c)
    configs[:] = kept

    cancelled = False
    if levels is None:
        total = len(items) * len(configs)
        done_runs = 0
        for i, (prompt, (pid, ids)) in enumerate(zip(items, encoded)):
            finished: list[tuple[_Config, BatchRun, list[float]]] = []
            for c in rotated(configs, i):
                if stop():
                    break
                say(f"{c.row.config}: prompt {pid}", done_runs / total)
                run, ttft = run_turns(c.runner, encoder, prompt, ids, spec.turns, spec.max_new_tokens, stop)
                if run.cancelled:
                    break
                finished.append((c, run, ttft))
                done_runs += 1
            if len(finished) < len(configs):
                cancelled = True
                break
            for c, run, ttft in finished:
                _merge(c, run)
                c.turn_ttft_ms.append(ttft)
            done_prompts += 1
    else:
        total = len(levels) * len(configs)
        done_runs = 0
        for n in levels:
            for c in configs:
                if stop():
                    cancelled = True
                    break
                say(f"N={n}: {c.row.config}", done_runs / total)
                fresh_cache(c.runner)
                run = c.runner.run(encoded, n, spec.max_new_tokens, stop)
                if run.cancelled:
                    cancelled = True
                    break
                c.runs[n] = run
                done_runs += 1
            if cancelled:
                break
        done_prompts = 0 if cancelled else len(items)
    say("cancelled" if cancelled else "done", None if cancelled else 1.0)
    return result(cancelled)


def rotated(items: list[Any], k: int) -> list[Any]:
    """`items` starting at index k (mod their count): each is first, and after each other, equally often."""
    k = k % len(items) if items else 0
    return items[k:] + items[:k]


def _reliability(configs: list[_Config]) -> dict[str, dict[str, dict]]:
    """Each draft configuration's calibration of its draft's confidence (drafts with a confidence head)."""
    out: dict[str, dict[str, dict]] = {}
    for c in configs:
        state = getattr(c.runner, "policy_state", None)
        cal = getattr(state, "calibration", None)
        if cal:
            out[c.row.config] = {("sampled" if sampled else "greedy"): v.reliability() for sampled, v in cal.items()}
    return out


def _merge(c: _Config, run: BatchRun) -> None:
    """Per prompt: a configuration's runs, one prompt each, as one run at level 1."""
    acc = c.runs.setdefault(1, BatchRun([], 0.0, 0, 0, 0))
    acc.requests += run.requests
    acc.wall_ms += run.wall_ms
    acc.steps += run.steps
    acc.scheduled += run.scheduled
    acc.emitted += run.emitted


def _plan(spec: BenchSpec, target: Path, loader: Loader, say: Progress, stop: Cancel, notes: list[str],
          configs: list[_Config], settings: dict[str, object]) -> None:
    """Load the engines and peers and list the configurations (skipping with a note what cannot run)."""
    def check() -> None:
        if stop():
            raise _Cancelled

    per_prompt = spec.levels is None
    ds = spec.dataset
    say(f"loading {target.name} (this engine)", None)
    base = loader(target, None, device=spec.device, precision=spec.precision)
    peer: LLMPeer | CBPeer | None = None
    peer_name = GENAI if per_prompt else GENAI_CB
    if spec.genai_target:
        check()
        say(f"loading {target.name} (openvino_genai{'' if per_prompt else ' ContinuousBatchingPipeline'})", None)
        try:
            if per_prompt:
                peer = LLMPeer(target, None, spec.device, spec.precision)
            else:
                peer = CBPeer(target, spec.device, spec.precision, effective_scheduler(spec.scheduler),
                              base.describe().kv_cache_tokens)
                settings["genai_scheduler"] = peer.describe()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot load is a note, not a failure
            notes.append(f"target alone ({peer_name}): skipped, it could not load: {_one_line(exc)}")
    drafts: list[tuple[Path, Engine]] = []
    for d in spec.drafts:
        check()
        say(f"loading {target.name} + {Path(d).name} (this engine)", None)
        try:
            drafts.append((Path(d), loader(target, Path(d), device=spec.device, precision=spec.precision)))
        except (DFlashError, ValueError) as exc:
            notes.append(f"{Path(d).name}: skipped, {_one_line(exc)}")
    genai_dflash: dict[Path, LLMPeer | None] = {}
    policies = spec.draft_policies or [DEFAULT_POLICY]

    for dec in spec.decodings:
        suffix = "" if dec.label == "greedy" else f", {dec.label}"
        base_name = f"target alone (this engine{suffix})"

        def row(config: str, engine: str, draft: str | None = None, n: int = 0, variant: str | None = None,
                k: int | None = None) -> Row:
            return Row(config, engine, target.name, draft, ds, n, variant, k, dec.label, dec.greedy, base_name,
                       None if per_prompt else 0)

        configs.append(_Config(row(base_name, ENGINE), EngineRunner(base, dec.config()), dec))
        if isinstance(peer, LLMPeer):
            configs.append(_Config(row(f"target alone ({GENAI}{suffix})", GENAI), LLMRunner(peer, 0, dec), dec))
        elif isinstance(peer, CBPeer):
            configs.append(_Config(row(f"target alone ({GENAI_CB}{suffix})", GENAI_CB), CBRunner(peer, dec), dec))
        for path, pipe in drafts:
            info = pipe.describe().draft
            variant, has_head = (info.variant, info.has_head) if info is not None else (None, False)

            ns = list(dict.fromkeys(spec.num_assistant_tokens))
            if has_head:
                ks = sorted({info.default_top_k if k is None else k for k in spec.markov_head_top_k}, reverse=True)
            else:
                ks = [None]
                if any(k is not None for k in spec.markov_head_top_k) and dec is spec.decodings[0]:
                    notes.append(f"{path.name}: has no Markov head, so markov_head_top_k does not apply "
                                 "(one row per num_assistant_tokens).")
            # A row that names no count drafts what the engine gives such a request under its policy.
            pairs = {(n or (info.candidates_for(policy) if info else 0), policy) for n in ns for policy in policies}
            counts = sorted({n for n, _ in pairs})
            for n in counts:  # one row per drafted count x K x policy, in the order of the drafted count
                for k in ks:
                    for policy in policies:
                        if (n, policy) not in pairs:
                            continue
                        label = (f"{path.name} ({variant or 'draft'}) n={n}" + ("" if k is None else f" K={k}")
                                 + ("" if policy == DEFAULT_POLICY else f", {policy}"))
                        cfg = dec.config(num_assistant_tokens=n or None, markov_head_top_k=k)
                        configs.append(_Config(row(f"{label} (this engine{suffix})", ENGINE, path.name, n, variant, k),
                                               EngineRunner(pipe, cfg, policy),
                                               dec))
                if not (per_prompt and spec.genai_dflash):
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
                        genai_dflash[path] = LLMPeer(target, path, spec.device, spec.precision)
                    except Exception as exc:  # noqa: BLE001
                        notes.append(f"{path.name} (openvino_genai DFlash): skipped, it could not load: "
                                     f"{_one_line(exc)}")
                        genai_dflash[path] = None
                dflash = genai_dflash[path]
                if dflash is None:
                    continue
                configs.append(_Config(row(f"{path.name} ({variant}) n={n} (openvino_genai DFlash{suffix})", GENAI,
                                           path.name, n, variant),
                                       LLMRunner(dflash, n, dec), dec))
    cached_peer: list[LLMPeer | None] = []

    def genai_cached(dec: Decoding) -> LLMRunner | None:
        """openvino_genai's target alone with its prefix caching on (multi-turn rows), loaded once."""
        if not cached_peer:
            say(f"loading {target.name} (openvino_genai, prefix caching on)", None)
            try:
                cached_peer.append(LLMPeer(target, None, spec.device, spec.precision, prefix_caching=True))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"target alone ({GENAI}, prefix caching on): skipped, it could not load: "
                             f"{_one_line(exc)}")
                cached_peer.append(None)
        return LLMRunner(cached_peer[0], 0, dec) if cached_peer[0] is not None else None

    if per_prompt:  # the rows at N requests run as loaded, without a prefix cache, as their CB peer
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


def check_prompts_fit(pipe: Engine, encoded: list[tuple[str, list[int]]], max_new_tokens: int, dataset: str) -> None:
    """Every prompt must fit the target's context and KV cache with max_new_tokens, checked before the
    run (a prompt that does not fit would otherwise stop it midway, its results lost)."""
    for pid, ids in encoded:
        try:
            pipe.check_fits(len(ids), max_new_tokens)
        except ContextLengthError as exc:
            raise ContextLengthError(f"Prompt {pid} of the {dataset} set: {exc}") from exc


def _aggregate(configs: list[_Config], levels: list[int], prompt_ids: list[str], per_prompt: bool) -> list[Row]:
    """One row per (level, configuration) that ran; matches against this engine's target alone (per decoding,
    at the lowest level it ran), speedup over its tok/s at the same level, vs CB over the peer's."""
    order = {pid: i for i, pid in enumerate(prompt_ids)}
    rows: list[Row] = []
    for n in levels:
        for c in configs:
            run = c.runs.get(n)
            if run is None:
                continue
            t = c.row
            reqs = sorted(run.requests, key=lambda r: order.get(r.prompt_id, len(order)))
            rows.append(Row(t.config, t.engine, t.target, t.draft, t.dataset, t.num_assistant_tokens, t.variant,
                            t.markov_head_top_k, t.decoding, t.greedy, t.baseline, None if per_prompt else n, reqs,
                            run.wall_ms, run.steps, run.scheduled, run.emitted))
    alone: dict[str, dict[str, list[int]]] = {}
    tok_s: dict[tuple[str, int | None], float] = {}
    peer_tok_s: dict[tuple[str, int | None], float] = {}
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
                if ref is None:
                    continue
                diff = _first_difference(q.token_ids, ref)
                if diff is None:
                    r.matches_target += 1
                else:
                    r.first_differences.append(f"{q.prompt_id}@{diff}")
        b = tok_s.get((r.decoding, r.concurrency))
        r.speedup = r.tok_s / b if b and r.tok_s else 0.0
        p = peer_tok_s.get((r.decoding, r.concurrency))
        r.vs_genai_cb = r.tok_s / p if p else None
    return rows
