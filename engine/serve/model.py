"""The model a server serves: its id, context length and tokenizer (prompts are counted before they run).

The server tokenizes prompts itself (the target's tokenizer and chat template, as the engine
would) so it can refuse a prompt over the context with OpenAI's `context_length_exceeded` before
the engine sees it, and give the engine token ids.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from engine.context import context_length
from engine.models.tokenizer import TextTokenizer
from engine.serve.errors import bad_request

DEFAULT_CONTEXT = 2048  # when config.json says nothing (never the case for exported targets)


def served_context(target_dir: Path) -> int:
    """The target's context (engine/context.py reads it from config.json), DEFAULT_CONTEXT when it says none."""
    path = Path(target_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    return (context_length(cfg) if isinstance(cfg, dict) else None) or DEFAULT_CONTEXT


@dataclass
class ServedModel:
    """What /v1/models lists and what every request is counted against."""

    target_dir: Path
    draft_name: str | None
    tokenizer: TextTokenizer
    context: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def id(self) -> str:
        return self.target_dir.name

    def card(self) -> dict[str, object]:
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "dflash-studio",
                "max_model_len": self.context, "draft": self.draft_name}

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.tokenizer.has_chat_template:
            raise bad_request(f"{self.id} has no chat template: use /v1/completions with a text prompt.", "messages")
        text = self.tokenizer.chat_prompt(messages)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_text(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else []
        return list(prompt)

    def check_context(self, prompt_tokens: int, max_tokens: int | None, param: str) -> int:
        """The completion budget: `max_tokens`, or what the context leaves; 400 context_length_exceeded
        when the prompt (and the requested completion) do not fit."""
        if prompt_tokens == 0:
            raise bad_request("The prompt is empty: send some text.", param)
        room = self.context - prompt_tokens
        if room < 1 or (max_tokens is not None and max_tokens > room):
            asked = prompt_tokens + (max_tokens if max_tokens is not None else 1)
            where = "messages" if param == "messages" else "prompt"
            raise bad_request(
                f"This model's maximum context length is {self.context} tokens. However, you requested {asked} "
                f"tokens ({prompt_tokens} in the {where}, {asked - prompt_tokens} in the completion). Please "
                f"reduce the length of the {where} or the completion (max_tokens).", param,
                "context_length_exceeded")
        return max_tokens if max_tokens is not None else room

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def token_bytes(self, token_id: int) -> list[int]:
        table = self.tokenizer.byte_table
        if table is not None and 0 <= token_id < len(table):
            return list(table[token_id])
        return list(self.token_text(token_id).encode("utf-8"))


@lru_cache(maxsize=4)
def served_model(target_dir: str, draft_name: str | None) -> ServedModel:
    """One ServedModel per (target, draft); loading the tokenizer is the only cost."""
    folder = Path(target_dir)
    return ServedModel(folder, draft_name, TextTokenizer(folder), served_context(folder))
