"""File checksums and GGUF lookup shared by the whole project (prepare, inspect, training).

Standard library only, so the runtime engine, the installer and the training jobs on a machine
without OpenVINO can all use it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_BLOCK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (GGUFs are too large to read at once)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def find_gguf(folder: Path | str) -> Path | None:
    """The GGUF file a folder holds: the folder itself when it is a .gguf file, else the one *.gguf
    inside it (None when there is none). Several GGUFs are ambiguous: ValueError naming them."""
    folder = Path(folder)
    if folder.is_file():
        return folder if folder.suffix.lower() == ".gguf" else None
    found = sorted(p for p in folder.glob("*.gguf") if p.is_file())
    if len(found) > 1:
        raise ValueError(f"{folder} holds several GGUF files ({', '.join(p.name for p in found)}): name one of them")
    return found[0] if found else None
