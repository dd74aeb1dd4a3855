"""Why a draft does or does not fit a target, in words (asks the engine; never decides itself)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

DraftValidator = Callable[[str, str], list[str]]


def engine_draft_reasons(target_dir: str, draft_dir: str) -> list[str]:
    """The engine's reasons why `draft_dir` does not fit `target_dir` (empty list: it fits)."""
    if not target_dir:
        return ["Pick a target first: a draft is checked against its target."]
    if not Path(draft_dir).is_dir():
        return [f"The folder {draft_dir} does not exist."]
    if not Path(target_dir).is_dir():
        return [f"The target folder {target_dir} does not exist, so the draft cannot be checked."]
    try:
        from engine.models.draft import check_draft_fits
    except ImportError as e:
        return [f"The engine's draft check is not available ({e})."]
    try:
        return [str(r) for r in check_draft_fits(target_dir, draft_dir)]
    except Exception as e:  # noqa: BLE001 - an unreadable folder is a reason, not a crash
        return [f"The draft could not be read: {e}"]
