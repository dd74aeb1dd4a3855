"""Generation settings and their validation: every bad value is a ValueError naming the field."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

MAX_ASSISTANT_TOKENS = 100


@dataclass
class GenerationConfig:
    """Per-request settings. Greedy decoding; `num_assistant_tokens=None` uses the draft's block."""

    max_new_tokens: int = 256
    num_assistant_tokens: int | None = None
    stop_token_ids: set[int] = field(default_factory=set)
    stop_strings: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False

    def validate(self) -> "GenerationConfig":
        """Raise ValueError naming the first bad field; return self so calls can chain."""
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        if self.num_assistant_tokens is not None:
            _int_at_least("num_assistant_tokens", self.num_assistant_tokens, 1)
            if self.num_assistant_tokens > MAX_ASSISTANT_TOKENS:
                raise ValueError(
                    f"num_assistant_tokens={self.num_assistant_tokens} is above {MAX_ASSISTANT_TOKENS}: "
                    "use a value between 1 and the draft's block size minus one."
                )
        for t in self.stop_token_ids:
            _int_at_least("stop_token_ids", t, 0)
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                raise ValueError("stop_strings: every stop string must be a non-empty string.")
        return self

    def copy(self, **changes: object) -> "GenerationConfig":
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _int_at_least(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{name} is NaN: give a whole number >= {low}.")
        raise ValueError(f"{name}={value!r} is not a whole number: give a whole number >= {low}.")
    if value < low:
        raise ValueError(f"{name}={value} is below {low}: give a whole number >= {low}.")
