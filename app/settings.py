"""QSettings with typed reads, recent-folder lists and one place that decides where settings live.

With DFLASH_STUDIO_HOME set (tests, portable installs) settings go to an INI file inside it, next to
the history; otherwise to the platform's native store under "DFlash Studio".
"""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

ORG_NAME = "DFlash Studio"
APP_NAME = "DFlash Studio"
RECENT_LIMIT = 8

K_GEOMETRY = "window/geometry"
K_STATE = "window/state"
K_RECENT_TARGETS = "models/recent_targets"
K_RECENT_DRAFTS = "models/recent_drafts"
K_LAST_TARGET = "models/last_target"
K_LAST_DRAFT = "models/last_draft"  # "" means "no draft"
K_LAST_DEVICE = "models/last_device"
K_MAX_NEW_TOKENS = "generation/max_new_tokens"
K_NUM_ASSISTANT = "generation/num_assistant_tokens"  # 0 means "the draft's default"
K_DRAFT_POLICY = "generation/draft_policy"  # "adaptive" | "always" (engine/draft_policy.py)
K_MIN_NEW_TOKENS = "generation/min_new_tokens"
K_MARKOV_TOP_K = "generation/markov_head_top_k"  # -1 means "the draft's default"
K_DO_SAMPLE = "generation/do_sample"
K_DECODING_CUSTOM = "generation/decoding_custom"  # true once the person set decoding themselves
K_TEMPERATURE = "generation/temperature"
K_TOP_K = "generation/top_k"
K_TOP_P = "generation/top_p"
K_MIN_P = "generation/min_p"
K_SEED_ON = "generation/seed_fixed"
K_SEED = "generation/seed"
K_REPETITION_PENALTY = "generation/repetition_penalty"
K_PRESENCE_PENALTY = "generation/presence_penalty"
K_FREQUENCY_PENALTY = "generation/frequency_penalty"
K_STOP_STRINGS = "generation/stop_strings"
K_MORE_SETTINGS = "generation/more_shown"  # penalties, min new tokens, stop strings unfolded
K_COMPARE = "compare/"  # prefix of the comparison panel's settings
K_SYSTEM_PROMPT = "generation/system_prompt"
K_MARK_DRAFT = "chat/mark_draft_tokens"
K_LAST_CONVERSATION = "chat/last_conversation"
K_SERVER_HOST = "server/host"
K_SERVER_PORT = "server/port"
K_SERVER_API_KEY = "server/api_key"  # kept in the settings file in plain text, like a client's config
K_SERVER_MAX_QUEUE = "server/max_queue"


def open_settings(path: str | os.PathLike | None = None) -> QSettings:
    """Settings in `path` (INI), in $DFLASH_STUDIO_HOME/settings.ini, or the native store."""
    if path is None and os.environ.get("DFLASH_STUDIO_HOME"):
        path = Path(os.environ["DFLASH_STUDIO_HOME"]) / "settings.ini"
    if path is not None:
        s = QSettings(str(path), QSettings.Format.IniFormat)
    else:
        s = QSettings(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, ORG_NAME, APP_NAME)
    s.setFallbacksEnabled(False)
    return s


def get_str(s: QSettings, key: str, default: str = "") -> str:
    v = s.value(key, default)
    return v if isinstance(v, str) else default


def get_int(s: QSettings, key: str, default: int) -> int:
    v = s.value(key, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def get_float(s: QSettings, key: str, default: float) -> float:
    v = s.value(key, default)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return f if f == f else default


def get_bool(s: QSettings, key: str, default: bool) -> bool:
    v = s.value(key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    try:
        return bool(int(v))
    except (TypeError, ValueError):
        return default


def get_bytes(s: QSettings, key: str) -> QByteArray | None:
    v = s.value(key)
    return v if isinstance(v, QByteArray) and not v.isEmpty() else None


def get_list(s: QSettings, key: str) -> list[str]:
    """A stored string list; QSettings returns a bare string for one item and None for none."""
    v = s.value(key)
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    return [str(x) for x in v if x]


def push_recent(s: QSettings, key: str, value: str, limit: int = RECENT_LIMIT) -> list[str]:
    """Put `value` first in the recent list at `key` (no duplicates, at most `limit`)."""
    items = [x for x in get_list(s, key) if x != value]
    items.insert(0, value)
    items = items[:limit]
    s.setValue(key, items)
    return items
