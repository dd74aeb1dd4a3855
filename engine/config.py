"""Generation settings and their validation: every bad value is a ValueError naming the field."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from engine.draft_policy import check_policy

MAX_ASSISTANT_TOKENS = 100


@dataclass
class GenerationConfig:
    """Per-request settings. `num_assistant_tokens=None` uses the draft's block size minus one.

    Greedy unless `do_sample`; sampled requests are verified by exact rejection sampling, so
    speculative output has the same distribution as the target alone's (engine/sampling/).
    """

    max_new_tokens: int = 256
    min_new_tokens: int = 0
    num_assistant_tokens: int | None = None
    markov_head_top_k: int | None = None  # drafts with a Markov head: K of the scorer, 0 = dense walk
    draft_policy: str | None = None  # "adaptive" | "always" (engine/draft_policy.py); None: the engine's setting
    stop_token_ids: set[int] = field(default_factory=set)
    stop_strings: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and output (HF rule)
    presence_penalty: float = 0.0  # subtracted once from tokens already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    rng_seed: int | None = None
    num_beams: int = 1  # accepted only as 1: beam search is not speculative decoding
    num_return_sequences: int = 1  # accepted only as 1

    def validate(self) -> "GenerationConfig":
        """Raise ValueError naming the first bad field; return self so calls can chain."""
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _int_at_least("min_new_tokens", self.min_new_tokens, 0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens={self.min_new_tokens} is more than max_new_tokens={self.max_new_tokens}: "
                             "a reply cannot be longer than its limit; lower min_new_tokens or raise max_new_tokens.")
        if self.num_beams != 1:
            raise ValueError(f"num_beams={self.num_beams}: beam search is not supported with speculative "
                             "decoding; use num_beams=1 (greedy or sampling).")
        if self.num_return_sequences != 1:
            raise ValueError(f"num_return_sequences={self.num_return_sequences}: parallel sampling is not "
                             "supported; send the request several times instead.")
        _float_in("temperature", self.temperature, 0.0, math.inf, low_open=True)
        _float_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _float_in("min_p", self.min_p, 0.0, 1.0)
        _float_in("repetition_penalty", self.repetition_penalty, 0.0, math.inf, low_open=True)
        _float_in("presence_penalty", self.presence_penalty, 0.0, math.inf)
        _float_in("frequency_penalty", self.frequency_penalty, 0.0, math.inf)
        _int_at_least("top_k", self.top_k, 0)
        if self.markov_head_top_k is not None:
            _int_at_least("markov_head_top_k", self.markov_head_top_k, 0)
        if self.draft_policy is not None:
            check_policy(self.draft_policy)
        if self.rng_seed is not None:
            _int_at_least("rng_seed", self.rng_seed, 0)
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


def _float_in(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} is not a number.")
    if math.isnan(value):
        raise ValueError(f"{name} is NaN: give a number.")
    below = value <= low if low_open else value < low
    if below or value > high:
        left = "(" if low_open else "["
        raise ValueError(f"{name}={value} is outside {left}{low}, {high}].")


def _int_at_least(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{name} is NaN: give a whole number >= {low}.")
        raise ValueError(f"{name}={value!r} is not a whole number: give a whole number >= {low}.")
    if value < low:
        raise ValueError(f"{name}={value} is below {low}: give a whole number >= {low}.")
