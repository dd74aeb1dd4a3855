"""What the command-line tools share: the one-line progress bar.

engine/cli.py, engine/bench/cli.py and the bundle's prepare use it, so none imports another's
private helpers (the models to load come from engine/catalog.py's resolve_models).
"""
from __future__ import annotations

import sys
from typing import Callable

Progress = Callable[[str, "float | None"], None]


def progress_printer(quiet: bool = False) -> Progress:
    """A progress callback that draws one updating line on stderr."""
    def show(message: str, fraction: float | None = None) -> None:
        if quiet:
            return
        bar = ""
        if fraction is not None:
            filled = int(max(0.0, min(1.0, fraction)) * 30)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {fraction * 100:5.1f}% "
        print(f"\r{bar}{message[:80]:<80}", end="", file=sys.stderr, flush=True)
        if fraction is not None and fraction >= 1.0:
            print(file=sys.stderr)
    return show
