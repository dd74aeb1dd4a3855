"""A chat's next turn as token ids: the ids the model generated for its replies, not a re-tokenised rendering.

A client sends the whole conversation every turn, as text (chat messages). Tokenising the rendered
history again can give other ids than the model produced (a reply's text tokenises differently at its
edges, or the template's special tokens merge with it), and then the prefix cache misses from the
first differing block. So the rendering of a finished request (its prompt text plus the text of its
reply) is remembered with its ids (prompt ids plus generated ids); a new prompt that begins with such a
rendering reuses those ids and only the rest (the end-of-turn tokens, the next user turn) is tokenised.
"""
from __future__ import annotations

from typing import Callable, Iterable


def extend_ids(text: str, known: Iterable[tuple[str, list[int]]],
               encode: Callable[[str], list[int]]) -> list[int] | None:
    """Ids for `text` from the longest known (text, ids) rendering it begins with, the rest encoded alone;
    None when none fits (the caller tokenises the whole text)."""
    best: tuple[str, list[int]] | None = None
    for seen, ids in known:
        if len(seen) <= len(text) and (best is None or len(seen) > len(best[0])) and text.startswith(seen):
            best = (seen, ids)
    if best is None or not best[0]:
        return None
    rest = text[len(best[0]):]
    return list(best[1]) + (encode(rest) if rest else [])
