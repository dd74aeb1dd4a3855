"""What a history line may hold: every field's type and range, checked before a window uses it.

A history file is written by this app, but it is a file on disk: another version, a crash, a sync
tool or a person can leave a value the window cannot draw (`"ttft_ms": null`, `"updated": NaN`,
nested arrays a thousand deep). Everything read from a history line goes through these checks, so a
bad file is refused here with a message that names the line and the field, and is set aside as a
whole (app/chat/store.py); nothing past this point has to guess.
"""
from __future__ import annotations

import json
import math
from typing import Any

# Times are Unix seconds; anything outside 1970..2100 is not a time this app wrote (and 1e20 makes
# time.localtime overflow).
TIME_MIN, TIME_MAX = 0.0, 4102444800.0
MAX_DEPTH = 4  # a message line nests at most: line -> pieces -> [text, flag]
MAX_TITLE = 10_000
ID_CHARS = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.")
STATUSES = ("streaming", "done", "cancelled", "error", "interrupted")
ROLES = ("user", "assistant", "system")

# Per-message stats (app/worker.py writes them): name -> (kind, low, high).
_NUM, _INT, _STR = "number", "integer", "text"
STATS_FIELDS: dict[str, tuple[str, float | None, float | None]] = {
    "ttft_ms": (_NUM, 0.0, 1e9),
    "tpot_ms": (_NUM, 0.0, 1e9),
    "decode_tok_s": (_NUM, 0.0, 1e9),
    "tokens_per_step": (_NUM, 0.0, 1e6),
    "acceptance_rate": (_NUM, 0.0, 100.0),  # a fraction; old files may hold a percentage
    "target_steps": (_INT, 0, 1e12),
    "cached_tokens": (_INT, 0, 1e12),  # prompt tokens the prefix cache served
    "prefix_cache_mb": (_NUM, 0.0, 1e9),
    "tokens": (_INT, 0, 1e12),
    "markov_head_top_k": (_INT, 0, 1e9),
    "num_assistant_tokens": (_INT, 0, 1e9),
    "prompt_tokens": (_INT, 0, 1e12),
    "context_dropped_turns": (_INT, 0, 1e9),  # oldest turns left out of the prompt (engine fit_chat)
    "device": (_STR, None, None),
    "draft": (_STR, None, None),
    "source": (_STR, None, None),
    "decoding": (_STR, None, None),
    "variant": (_STR, None, None),
    "finish_reason": (_STR, None, None),
}


class HistoryFormatError(ValueError):
    """A history line holds a value the app cannot use; the message names the field."""


def _reject_constant(name: str) -> float:
    raise HistoryFormatError(f"{name} is not a number JSON allows")


def loads_line(text: str) -> Any:
    """json.loads without NaN / Infinity, with deep nesting refused instead of a RecursionError."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise HistoryFormatError(f"it nests deeper than {MAX_DEPTH} levels") from None
    if depth(obj) > MAX_DEPTH:
        raise HistoryFormatError(f"it nests deeper than {MAX_DEPTH} levels")
    return obj


def depth(obj: Any) -> int:
    """How deeply lists / objects nest (a scalar is 0), without recursion."""
    best = 0
    stack = [(obj, 1)] if isinstance(obj, (list, dict)) else []
    while stack:
        o, d = stack.pop()
        best = max(best, d)
        if d > MAX_DEPTH:
            return d
        for v in (o.values() if isinstance(o, dict) else o):
            if isinstance(v, (list, dict)):
                stack.append((v, d + 1))
    return best


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "text"
    if isinstance(v, list):
        return "a list"
    return "an object"


def number(v: Any, name: str, lo: float | None = None, hi: float | None = None, integer: bool = False) -> float:
    """A finite number (not a bool) within [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise HistoryFormatError(f"{name} is {_kind(v)}, not a number")
    if integer and not (isinstance(v, int) or float(v).is_integer()):
        raise HistoryFormatError(f"{name} is {v!r}, not a whole number")
    f = float(v)
    if not math.isfinite(f):
        raise HistoryFormatError(f"{name} is {v!r}, not a finite number")
    if (lo is not None and f < lo) or (hi is not None and f > hi):
        raise HistoryFormatError(f"{name} is {v!r}, outside {lo:g}..{hi:g}")
    return f


def text(v: Any, name: str, limit: int | None = None) -> str:
    if not isinstance(v, str):
        raise HistoryFormatError(f"{name} is {_kind(v)}, not text")
    if limit is not None and len(v) > limit:
        raise HistoryFormatError(f"{name} is {len(v)} characters long (at most {limit})")
    return v


def optional_text(v: Any, name: str) -> str | None:
    return None if v is None else text(v, name)


def timestamp(v: Any, name: str) -> float:
    return number(v, name, TIME_MIN, TIME_MAX)


def identifier(v: Any, name: str) -> str:
    s = text(v, name, 200)
    if not s or not set(s) <= ID_CHARS:
        raise HistoryFormatError(f"{name} {s!r} is not an id (letters, digits, - _ .)")
    return s


def one_of(v: Any, name: str, choices: tuple[str, ...]) -> str:
    if v not in choices:
        raise HistoryFormatError(f"{name} {v!r} is not one of {', '.join(choices)}")
    return v


def stats(v: Any) -> dict[str, Any] | None:
    """A message's stats: the known fields typed and in range, other fields plain scalars."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise HistoryFormatError(f"stats is {_kind(v)}, not an object")
    out: dict[str, Any] = {}
    for key, val in v.items():
        name = f"stats.{key}"
        spec = STATS_FIELDS.get(key)
        if key == "acceptance_by_position":
            if not isinstance(val, list):
                raise HistoryFormatError(f"{name} is {_kind(val)}, not a list")
            out[key] = [number(x, f"{name}[{i}]", 0.0, 1.0) for i, x in enumerate(val)]
        elif key in ("draft", "device") and val is None:
            out[key] = None
        elif spec is not None:
            kind, lo, hi = spec
            if kind == _STR:
                out[key] = text(val, name, 10_000)
            else:
                f = number(val, name, lo, hi, integer=kind == _INT)
                out[key] = int(f) if kind == _INT else f
        elif val is None or isinstance(val, (bool, str)):
            out[key] = val
        elif isinstance(val, (int, float)):
            out[key] = number(val, name)
        else:
            raise HistoryFormatError(f"{name} is {_kind(val)}; stats hold numbers and text only")
    return out


def pieces(v: Any, content: str) -> list[tuple[str, bool]]:
    """[text, from_draft] pairs that add up to the message's content."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise HistoryFormatError(f"pieces is {_kind(v)}, not a list")
    out: list[tuple[str, bool]] = []
    for i, p in enumerate(v):
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], bool)):
            raise HistoryFormatError(f"pieces[{i}] is not a [text, true/false] pair")
        out.append((p[0], p[1]))
    if out and "".join(t for t, _ in out) != content:
        raise HistoryFormatError("pieces do not add up to the message's content")
    return out
