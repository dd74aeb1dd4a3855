"""Reading a model folder's files so that a bad file is a ModelFolderError naming it, not a traceback.

A person can break a folder in many ways (a zero-byte IR from a full disk, an XML that is not an
IR, a config.json holding a list, a path to a file where a folder belongs). OpenVINO answers those
with a RuntimeError that names no fix, and json with a message that names no file; these helpers
turn them into errors that say which file is wrong and what to do (`fix`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openvino as ov

from engine.errors import ModelFolderError


def check_folder(path: Path, what: str, fix: str) -> Path:
    """`path` must be a folder: a missing path and a file are told apart (a file is often the model
    file itself, so the message names its parent)."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.exists():
        raise ModelFolderError(f"{what} {path} is a file, not a folder: give the folder that holds it "
                               f"({path.parent}), or {fix}")
    raise ModelFolderError(f"{what} {path} does not exist: {fix}")


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object (config.json, generation_config.json, ...)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFolderError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): {fix}") from exc
    except json.JSONDecodeError as exc:
        raise ModelFolderError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}): "
                               f"{fix}") from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path} holds a JSON {type(data).__name__}, not an object with named settings: "
                               f"{fix}")
    return data


def read_optional_json_object(path: Path, fix: str) -> dict[str, Any]:
    """read_json_object, or {} when the file is absent."""
    return read_json_object(path, fix) if Path(path).is_file() else {}


def read_ir(core: ov.Core, path: Path, fix: str) -> ov.Model:
    """core.read_model with a message that names the file and says whether it is empty or damaged."""
    path = Path(path)
    if not path.is_file():
        raise ModelFolderError(f"{path} is missing: {fix}")
    size = path.stat().st_size
    weights = path.with_suffix(".bin")
    if size == 0:
        raise ModelFolderError(f"{path} is empty (0 bytes; a copy or export that did not finish): {fix}")
    if weights.is_file() and weights.stat().st_size == 0:
        raise ModelFolderError(f"{weights} is empty (0 bytes; a copy or export that did not finish): {fix}")
    try:
        return core.read_model(path)
    except RuntimeError as exc:
        raise ModelFolderError(f"{path} ({size:,} bytes) is not a readable OpenVINO IR ({openvino_reason(exc)}): "
                               f"{fix}") from exc


def openvino_reason(exc: BaseException) -> str:
    """The telling line of an OpenVINO error (theirs start with 'Exception from <file>:' lines)."""
    lines = [x.strip() for x in str(exc).strip().splitlines() if x.strip()]
    lines = [x for x in lines if not x.startswith("Exception from ")] or lines
    text = lines[-1] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
