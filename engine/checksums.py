"""The project's one sha256 and GGUF lookup: the prepare commands and the draft trainer verify the
same source files the same way, so a damaged download is refused with the same words everywhere."""
from __future__ import annotations

import hashlib
from pathlib import Path

from engine.errors import ModelFolderError

_BLOCK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (GGUFs are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def find_gguf(folder: Path | str) -> Path:
    """The one *.gguf file in `folder`; an error names what was found when there is not exactly one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"{folder} is not a folder: give the folder that holds the model's .gguf file.")
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() == ".gguf")
    if not found:
        raise ModelFolderError(f"{folder} holds no .gguf file.")
    if len(found) > 1:
        raise ModelFolderError(f"{folder} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}): "
                               "keep only the one to use.")
    return found[0]
