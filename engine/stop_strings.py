"""Stop strings on streamed text: what of a request's decoded text may be shown, and where it ends.

Text that could be the start of a stop string is held back until a later token completes or rules
out the match, so text once streamed is never taken back; a stop string therefore always lies in
the part not shown yet. The pipeline decodes each step's tokens and hands the pieces here.
"""
from __future__ import annotations

from typing import Sequence

from engine.events import TextPiece


class StopStrings:
    """One request's text release: the decoded pieces not shown yet, and the stop strings to look for."""

    def __init__(self, stop_strings: Sequence[str], include_in_output: bool = False) -> None:
        self.stop_strings = list(stop_strings)
        self.include_in_output = include_in_output
        self.held: list[TextPiece] = []
        self.shown = 0  # characters of the request's text released so far

    def release(self, text: str, pieces: list[TextPiece], ending: bool) -> tuple[list[TextPiece], int | None]:
        """Take the step's decoded `pieces` (`text`: the request's whole decoded text, them included).

        Returns the pieces to show now and, when a stop string completed, where the text ends (else
        None). With `ending` (the request ends this step for another reason) nothing is held back."""
        self.held.extend(pieces)
        end = len(text)
        stop = self._stop_end(text) if self.stop_strings else None
        if stop is not None:
            end = stop
        elif self.stop_strings and not ending:
            end -= self._partial(text)  # wait for the next token
        out = _take_pieces(self.held, end - self.shown)
        self.shown = end
        if stop is not None or ending:
            self.held = []
        return out, stop

    def flush(self, text: str) -> list[TextPiece]:
        """Text held back for a possible stop string, released when the request ends otherwise."""
        pieces, self.held, self.shown = self.held, [], len(text)
        return pieces

    def _stop_end(self, text: str) -> int | None:
        """Where the text ends if a stop string completed after what was shown, else None."""
        best: int | None = None
        for s in self.stop_strings:
            idx = text.find(s, self.shown)
            if idx >= 0:
                end = idx + len(s) if self.include_in_output else idx
                best = end if best is None else min(best, end)
        return best

    def _partial(self, text: str) -> int:
        """Length of the longest unshown tail of `text` that is the start of a stop string (held back)."""
        tail = text[self.shown:]
        for n in range(min(len(tail), max(map(len, self.stop_strings)) - 1), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.stop_strings):
                return n
        return 0


def _take_pieces(held: list[TextPiece], count: int) -> list[TextPiece]:
    """Remove and return the first `count` characters of the held pieces."""
    out: list[TextPiece] = []
    while count > 0 and held:
        p = held[0]
        if len(p.text) <= count:
            out.append(held.pop(0))
            count -= len(p.text)
        else:
            out.append(TextPiece(p.text[:count], p.from_draft))
            held[0] = TextPiece(p.text[count:], p.from_draft)
            count = 0
    return out
