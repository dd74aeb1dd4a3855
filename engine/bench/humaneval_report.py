"""HumanEval pass@1 results: one scored sample per (problem, mode, configuration), one row per (mode,
configuration), and the markdown / JSON they are printed and written as."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Sample:
    task_id: str
    mode: str  # completion | chat
    config: str  # "target alone" or the draft's folder name
    completion: str  # what the checker appended to the problem's prompt
    answer: str  # the model's text as generated
    token_ids: list[int]
    finish_reason: str  # stop | eos | length
    e2e_ms: float
    target_steps: int = 0
    produced: int = 0
    drafted: int = 0
    accepted: int = 0
    passed: bool = False
    result: str = ""  # the checker's: "passed", "failed: ...", "timed out"


def aggregate(samples: list[Sample], modes: list[str], labels: list[str], baseline: str) -> list[dict[str, Any]]:
    """Per (mode, configuration): pass@1 and its counts, speed, and agreement with the target alone."""
    rows = []
    for mode in modes:
        base = {s.task_id: s for s in samples if s.mode == mode and s.config == baseline}
        for label in labels:
            mine = [s for s in samples if s.mode == mode and s.config == label]
            if not mine:
                continue
            tokens = sum(len(s.token_ids) for s in mine)
            seconds = sum(s.e2e_ms for s in mine) / 1e3
            steps = sum(s.target_steps for s in mine)
            drafted = sum(s.drafted for s in mine)
            row: dict[str, Any] = {
                "mode": mode, "config": label, "problems": len(mine), "passed": sum(s.passed for s in mine),
                "pass_at_1": round(100.0 * sum(s.passed for s in mine) / len(mine), 1),
                "timed_out": sum(s.result == "timed out" for s in mine),
                "cut_at_max_new_tokens": sum(s.finish_reason == "length" for s in mine),
                "tokens": tokens, "tok_s": round(tokens / seconds, 1) if seconds else None,
                "tokens_per_step": round(sum(s.produced for s in mine) / steps, 2) if steps else None,
                "acceptance": round(sum(s.accepted for s in mine) / drafted, 3) if drafted else None,
                "minutes": round(seconds / 60, 1)}
            if label != baseline:
                pairs = [(s, base[s.task_id]) for s in mine if s.task_id in base]
                row["same_text_as_target_alone"] = f"{sum(s.answer == b.answer for s, b in pairs)}/{len(pairs)}"
                # At a stop string the engine keeps the tokens of the step that completed it (a speculative
                # step may hold one or more past the cut), so ids can differ where the texts are equal.
                row["same_tokens_as_target_alone"] = f"{sum(s.token_ids == b.token_ids for s, b in pairs)}/{len(pairs)}"
                row["same_verdict_as_target_alone"] = f"{sum(s.passed == b.passed for s, b in pairs)}/{len(pairs)}"
                row["first_differences"] = [s.task_id for s, b in pairs if s.answer != b.answer][:5]
            rows.append(row)
    return rows


COLUMNS = (("mode", "mode"), ("config", "configuration"), ("passed", "passed"), ("problems", "of"),
           ("pass_at_1", "pass@1 %"), ("timed_out", "timed out"), ("cut_at_max_new_tokens", "hit max_new_tokens"),
           ("tok_s", "tok/s"), ("tokens_per_step", "tokens/step"), ("acceptance", "acceptance"),
           ("same_text_as_target_alone", "same text as target alone"),
           ("same_tokens_as_target_alone", "same tokens"), ("minutes", "minutes"))


def markdown(result: dict[str, Any], command: str | None = None) -> str:
    st = result["settings"]
    lines = [f"HumanEval pass@1, {st['target']}, {st['problems']} problems, greedy, max_new_tokens "
             f"{st['max_new_tokens']}, precision {st['precision']}, device {st['device']}; scored by "
             f"{st['checker']} (timeout {st['timeout']:g} s); {st['run_minutes']} min in all.", ""]
    if command:
        lines += [f"`{command}`", ""]
    lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for r in result["rows"]:
        lines.append("| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k, _ in COLUMNS) + " |")
    diffs = [f"{r['mode']}, {r['config']}: {', '.join(r['first_differences'])}" for r in result["rows"]
             if r.get("first_differences")]
    if diffs:
        lines += ["", "Texts that differ from the target alone's (first 5): " + "; ".join(diffs)]
    return "\n".join(lines) + "\n"


def write_results(result: dict[str, Any], out: Path, command: str | None = None) -> None:
    """results.md and results.json (settings and rows); the samples are in samples.jsonl already."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(markdown(result, command), encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"settings": result["settings"], "rows": result["rows"],
                                                  "command": command}, indent=1), encoding="utf-8")


def as_json(result: dict[str, Any], with_samples: bool = False) -> str:
    doc = {"settings": result["settings"], "rows": result["rows"]}
    if with_samples:
        doc["samples"] = [asdict(s) for s in result["samples"]]
    return json.dumps(doc, ensure_ascii=False)
