"""What the command-line tools share: the one-line progress bar and the default models to load.

engine/cli.py and engine/bench/cli.py both use these, so neither imports the other's helpers.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from engine.errors import DFlashError

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


def resolve_models(target: str | None, draft: str | None) -> tuple[Path, Path | None]:
    """(target, draft) from the command line: the embedded default target when none is given, and then
    the best prepared draft unless `draft` says otherwise ('none': the target alone)."""
    if target:
        target_dir = Path(target)
    else:
        from engine.paths import default_target_dir
        from engine.prepare import is_prepared

        target_dir = default_target_dir()
        if not is_prepared(target_dir):
            raise DFlashError(f"The embedded default target is not prepared yet ({target_dir}): run "
                              "`dflash-studio prepare` first, or pass --target DIR.")
    if draft is None:
        from engine.paths import best_draft_dir

        return target_dir, (best_draft_dir() if not target else None)
    return target_dir, (None if draft.lower() == "none" else Path(draft))
