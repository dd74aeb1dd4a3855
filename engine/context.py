"""A target's context length, the up-front check of a request against it, and fitting a chat into it.

Positions past the length a model was trained for give garbage (and a prompt that long takes
minutes to prefill on a CPU), so a request whose prompt plus max_new_tokens exceeds the context is
refused before any work, with the numbers and what to change. A chat that has outgrown the context
keeps its system prompt and newest turns: `fit_chat` says how many of the oldest turns to leave out.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from engine.errors import ContextLengthError

# config.json keys that hold the trained context, by model family (first found wins).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                "max_seq_len")
Message = Mapping[str, str]


def context_length(config: Mapping[str, Any]) -> int | None:
    """The context a target was trained for, from its config.json (or the text model's config inside
    a multimodal one); None when the config does not say."""
    for section in (config, config.get("text_config"), config.get("llm_config")):
        if not isinstance(section, Mapping):
            continue
        for key in CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def check_fits_context(prompt_tokens: int, max_new_tokens: int, context: int | None, model: str) -> None:
    """Raise ContextLengthError when prompt + max_new_tokens does not fit `context` tokens."""
    if context is None or prompt_tokens + max_new_tokens <= context:
        return
    total = prompt_tokens + max_new_tokens
    where = f"{model}'s context of {context:,} tokens (its config.json)"
    if max_new_tokens >= context:
        raise ContextLengthError(
            f"max_new_tokens={max_new_tokens:,} alone is more than {where}: lower max_new_tokens "
            f"(--max-new-tokens) below {context:,}, to at most {max(1, context - prompt_tokens):,} for this "
            f"{prompt_tokens:,}-token prompt.")
    if prompt_tokens >= context:
        raise ContextLengthError(
            f"The prompt is {prompt_tokens:,} tokens, longer than {where}: shorten it by at least "
            f"{total - context:,} tokens (to {context - max_new_tokens:,} tokens with max_new_tokens="
            f"{max_new_tokens:,}).")
    raise ContextLengthError(
        f"The prompt ({prompt_tokens:,} tokens) plus max_new_tokens ({max_new_tokens:,}) is {total:,} tokens, "
        f"more than {where}: lower max_new_tokens (--max-new-tokens) to {context - prompt_tokens:,} or less, "
        f"or shorten the prompt by {total - context:,} tokens.")


def fit_chat(messages: Sequence[Message], count_tokens: Callable[[list[Message]], int], context: int | None,
             max_new_tokens: int) -> tuple[list[Message], int]:
    """(the messages that fit, how many of the oldest turns were left out).

    The leading system messages and the newest turn are always kept; a turn is a user message with
    the replies after it. When even that does not fit, every older turn is left out and the request
    itself then fails with ContextLengthError (the newest message alone is too long).
    `count_tokens` gives the prompt length of a message list (the chat template applied)."""
    messages = list(messages)
    if context is None or not messages:
        return messages, 0
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    starts = [i for i in range(head, len(messages)) if messages[i].get("role") == "user" or i == head]
    if len(starts) <= 1:
        return messages, 0

    def kept(dropped: int) -> list[Message]:
        return messages[:head] + messages[starts[dropped]:]

    def fits(dropped: int) -> bool:
        return count_tokens(kept(dropped)) + max_new_tokens <= context

    if fits(0):
        return messages, 0
    lo, hi = 1, len(starts) - 1  # the fewest dropped turns that fit lies in [lo, hi] (hi: the newest turn alone)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return kept(lo), lo
