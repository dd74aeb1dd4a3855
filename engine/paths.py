"""Where the app keeps models, history and caches: a per-user data folder, never the repo."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "dflash-studio"


def user_data_dir() -> Path:
    """Root of everything the app writes; DFLASH_STUDIO_HOME overrides it (tests, portable installs)."""
    override = os.environ.get("DFLASH_STUDIO_HOME")
    root = Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
    return root


def models_dir() -> Path:
    d = user_data_dir() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_target_dir() -> Path:
    """The embedded default target (SmolLM2-135M-Instruct) as prepared by `dflash-studio prepare`."""
    return models_dir() / "SmolLM2-135M-Instruct-ov"


def default_drafts_dir() -> Path:
    """Drafts shipped in resources/ and exported for the embedded default target by `prepare`."""
    d = models_dir() / "drafts"
    d.mkdir(parents=True, exist_ok=True)
    return d


def best_draft_dir() -> Path | None:
    """The draft `prepare` marked best for the embedded default target (drafts/best.txt), if exported."""
    d = default_drafts_dir()
    best = d / "best.txt"
    if best.is_file():
        folder = d / best.read_text(encoding="utf-8").strip()
        if (folder / "openvino_model.xml").is_file():
            return folder
    return None


def history_dir() -> Path:
    d = user_data_dir() / "history"
    d.mkdir(parents=True, exist_ok=True)
    return d


def check_writable(folder: Path | str, what: str = "The output folder") -> Path:
    """Create `folder` if needed and prove that a file can be written in it, before long work is spent
    on what goes there. Writing a probe file catches what permission bits do not (a read-only mount, an
    immutable folder, a file where a folder should be, a full disk)."""
    from engine.errors import OutputFolderError

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dflash-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OutputFolderError(f"{what} {folder} cannot be written ({reason}): choose a folder you can write "
                                "to, or fix its permissions.") from exc
    return folder
