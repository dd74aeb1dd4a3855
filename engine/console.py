"""What the command-line tools share: the one-line progress bar, the lines a person should read, and
stdout kept for the result alone.

engine/cli.py, engine/bench/cli.py and the bundled install use it, so none imports another's
private helpers (the models to load come from engine/catalog.py's resolve_models).
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator

Progress = Callable[[str, "float | None"], None]

_line_open = False  # a progress line is drawn on stderr without its newline yet


def progress_printer(quiet: bool = False) -> Progress:
    """A progress callback that draws one updating line on stderr."""
    def show(message: str, fraction: float | None = None) -> None:
        global _line_open
        if quiet:
            return
        bar = ""
        if fraction is not None:
            filled = int(max(0.0, min(1.0, fraction)) * 30)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {fraction * 100:5.1f}% "
        print(f"\r{bar}{message[:80]:<80}", end="", file=sys.stderr, flush=True)
        _line_open = True
        if fraction is not None and fraction >= 1.0:
            print(file=sys.stderr)
            _line_open = False
    return show


def say(message: str) -> None:
    """A line the person should read (a folder moved aside, a file kept), on stderr, not under a progress bar."""
    global _line_open
    print(("\n" if _line_open else "") + f"dflash-studio: {message}", file=sys.stderr, flush=True)
    _line_open = False


def end_line() -> None:
    """Close a progress line left open (before an error message)."""
    global _line_open
    if _line_open:
        print(file=sys.stderr)
        _line_open = False


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout meanwhile (libraries' tables and warnings, child processes) to
    stderr, so that stdout carries only the result: sys.stdout for Python's prints, file descriptor 1
    for what holds the old stream (a logging handler made at import) and for child processes."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all (a windowed app): nothing to protect
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
