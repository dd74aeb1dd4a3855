"""Completion markers of the folders `prepare` builds (and the installed app copies), and what a person
changed in them since.

A folder is used only when its marker (written last) lists files that all still match: anything
else is a partial or damaged build. What a person made in a built folder is never deleted by a
rebuild: USER_FILES (their draft_vocabulary.json) are recorded by name and carried over; any other
change or addition moves the folder aside first (`set_aside_user_work`), and the caller says where.
"""
from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from engine.checksums import sha256_file
from engine.export.target import package_versions
from engine.models.draft_vocab import VOCAB_FILE

MARKER = ".dflash-complete.json"
BUILDER = "engine.prepare/smollm2"
# Bump when the produced folders change in a way old ones should be rebuilt for.
BUILDER_VERSION = 1
Notice = Callable[[str], None]  # something the person should read (a folder moved aside, a file kept)
# Files a person makes in a prepared draft folder (`dflash-studio draft-vocab`): kept across rebuilds.
USER_FILES = (VOCAB_FILE,)
_VERSIONED = ("openvino", "openvino-tokenizers", "optimum-intel", "transformers", "torch", "gguf", "tokenizers")


def is_prepared(path: Path | str, *, verify_checksums: bool = True) -> bool:
    """True only if `path` has a valid completion marker and every listed file still matches.

    With verify_checksums=False only sizes are compared (fast; for frequent polling).
    """
    return _marker_problem(Path(path), verify_checksums=verify_checksums) is None


def write_marker(folder: Path, extra: dict[str, Any] | None = None, user_files: Iterable[str] = ()) -> Path:
    """Record every file's size and sha256; written last, atomically (tmp file + rename).

    `user_files` are the person's (a draft_vocabulary.json they wrote): recorded by name, not listed,
    so that changing them never makes the folder look damaged and a rebuild carries them over."""
    mine = sorted(set(user_files))
    files = {}
    for f in sorted(_listed_files(folder)):
        rel = f.relative_to(folder).as_posix()
        if rel not in mine:
            files[rel] = {"size": f.stat().st_size, "sha256": sha256_file(f)}
    marker = {
        "builder": BUILDER,
        "builder_version": BUILDER_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(_VERSIONED),
        **{k: v for k, v in (extra or {}).items() if k != "user_files"},
        **({"user_files": mine} if mine else {}),
        "files": files,
    }
    tmp = folder / f"{MARKER}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_text(json.dumps(marker, indent=2), encoding="utf-8")
    os.replace(tmp, folder / MARKER)
    return folder / MARKER


def read_marker(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _marker_problem(folder: Path, *, verify_checksums: bool) -> str | None:
    """Why `folder` is not a finished build, or None when it is."""
    if not folder.is_dir():
        return "no folder"
    marker = read_marker(folder)
    if not marker:
        return "no (readable) completion marker: partial build"
    if marker.get("builder") != BUILDER or marker.get("builder_version") != BUILDER_VERSION:
        return f"built by {marker.get('builder')} v{marker.get('builder_version')}, need {BUILDER} v{BUILDER_VERSION}"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return "marker lists no files"
    for rel, info in files.items():
        f = folder / rel
        try:
            if not f.is_file() or f.stat().st_size != int(info["size"]):
                return f"{rel} is missing or has another size"
            if verify_checksums and sha256_file(f) != info["sha256"]:
                return f"{rel} does not match its checksum"
        except (OSError, KeyError, TypeError, ValueError):
            return f"{rel}: unreadable marker entry"
    return None


def _listed_files(folder: Path) -> Iterable[Path]:
    for f in folder.rglob("*"):
        if f.is_file() and not f.name.startswith(MARKER):
            yield f


def record_user_file(folder: Path, rel: str) -> bool:
    """After a person wrote `rel` (one of USER_FILES) into a prepared folder: mark the folder again with
    that file as theirs, so it stays prepared and prepare keeps the file. False when the folder has no
    valid marker or holds other changes (prepare then decides, and keeps the file)."""
    changes = folder_changes(Path(folder))
    if changes is None or rel not in USER_FILES or changes.missing or changes.broken:
        return False
    marker = read_marker(Path(folder))
    extra = {k: v for k, v in marker.items() if k not in ("builder", "builder_version", "created", "versions", "files")}
    write_marker(Path(folder), extra=extra, user_files=[*changes.recorded, *changes.edited, rel])
    return True


@dataclass
class FolderChanges:
    """How a built folder differs from its completion marker (paths relative to the folder)."""

    changed: list[str]  # listed, but another size or checksum
    missing: list[str]  # listed, gone
    added: list[str]  # not listed (nor recorded): put there after the build
    recorded: list[str]  # the marker's user_files that are there: the person's, kept across rebuilds

    @property
    def edited(self) -> list[str]:
        """USER_FILES the person changed or added since the build (not recorded yet)."""
        return [r for r in self.changed + self.added if r in USER_FILES]

    @property
    def broken(self) -> list[str]:
        """Built files that changed (other than USER_FILES): the build no longer holds, it is made again."""
        return [r for r in self.changed if r not in USER_FILES]

    @property
    def others(self) -> list[str]:
        """The person's files that a rebuild cannot carry over: the folder is moved aside first."""
        return [r for r in self.changed + self.added if r not in USER_FILES]


def folder_changes(folder: Path) -> FolderChanges | None:
    """The folder's differences from its marker; None when there is no folder or no readable marker
    (a partial build of ours: nothing in it is a person's)."""
    marker = read_marker(folder) if folder.is_dir() else {}
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return None
    changed, missing = [], []
    for rel, info in files.items():
        f = folder / rel
        try:
            if not f.is_file():
                missing.append(rel)
            elif f.stat().st_size != int(info["size"]) or sha256_file(f) != info["sha256"]:
                changed.append(rel)
        except (OSError, KeyError, TypeError, ValueError):
            changed.append(rel)
    recorded = [r for r in marker.get("user_files") or [] if isinstance(r, str) and (folder / r).is_file()]
    added = sorted(set(f.relative_to(folder).as_posix() for f in _listed_files(folder)) - set(files) - set(recorded))
    return FolderChanges(changed, missing, added, recorded)


def set_aside_user_work(folder: Path, notice: Notice, keep: Iterable[str] = ()) -> dict[str, bytes]:
    """Before `folder` is rebuilt: nothing a person changed or added in it is lost. Returns the `keep`
    files that are theirs (for the new build to carry); when anything else is theirs, the whole folder
    is first renamed aside and `notice` says where."""
    changes = folder_changes(folder)
    if changes is None:
        return {}
    keep = set(keep)
    carried = {rel: (folder / rel).read_bytes() for rel in set(changes.edited) | set(changes.recorded) if rel in keep}
    if changes.others:
        aside = aside_path(folder)
        os.replace(folder, aside)
        listed = ", ".join(changes.others[:3]) + (f" and {len(changes.others) - 3} more" if len(changes.others) > 3 else "")
        notice(f"{folder} held files that differ from what prepare built ({listed}): moved it to {aside} so that "
               "nothing of yours is lost (delete that folder when you do not need it), then built it again.")
    return carried


def aside_path(folder: Path) -> Path:
    """A visible sibling name (not cleaned up as a stale staging folder) that does not exist yet."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = folder.with_name(f"{folder.name}.yours-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = folder.with_name(f"{folder.name}.yours-{stamp}-{n}")
    return aside
