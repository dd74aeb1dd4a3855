"""First run of an installed DFlash Studio: put the embedded default model where the app looks.

The installed app has no torch/transformers/optimum, so it cannot run `engine.prepare` (GGUF ->
HF -> OpenVINO IR). Instead the bundle carries the finished IR folder that `dflash-studio prepare`
built at bundle-build time (SmolLM2-135M-Instruct, int8, with its completion marker). Its
`prepare` command (and the first `generate` / `bench` without --target, and the app's "Prepare
now") copies that folder into the user data folder (engine.paths.default_target_dir), checks every
file against the marker's sha256, and swaps it into place; from then on nothing but that folder is
needed, offline. A bundle built without the model (build.sh --no-default-model) says so and
explains the other ways instead of failing obscurely.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Callable

from engine import paths
from engine.errors import DFlashError, ModelFolderError
from engine.paths import check_writable
from engine.markers import MARKER, Notice, is_prepared, read_marker, set_aside_user_work

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]

NOT_BUNDLED = """\
This build of DFlash Studio does not carry the embedded default model, and building it needs
torch, transformers and optimum, which the installed app does not include.

Ways to get it:
  * install a DFlash Studio package built with the default model (installer/build.sh without
    --no-default-model), or
  * from a source checkout: `bash scripts/bootstrap.sh && .venv/bin/dflash-studio prepare`. It writes
    the model into the same user data folder ({folder}), which the installed app then uses, or
  * choose any OpenVINO target folder in the app's Session panel (docs/installer.md says what a
    folder needs).
"""


def bundle_root() -> Path:
    """The bundle's data folder (PyInstaller's _internal), or this checkout's build output."""
    if getattr(sys, "frozen", False):
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent))
    return Path(__file__).resolve().parents[1] / "build" / "installer"


def bundled_models_dir() -> Path:
    env = os.environ.get("DFLASH_BUNDLED_MODELS")
    return Path(env) if env else bundle_root() / "models"


def has_bundled_default() -> bool:
    """Whether this install carries the embedded default model to copy (the finished IR and its marker)."""
    return (bundled_models_dir() / paths.default_target_dir().name / MARKER).is_file()


class NotBundled(DFlashError):
    pass


def _copy_tree(src: Path, dest: Path, say: Progress, lo: float, hi: float, label: str) -> None:
    files = [f for f in sorted(src.rglob("*")) if f.is_file()]
    total = sum(f.stat().st_size for f in files) or 1
    done = 0
    for f in files:
        out = dest / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(f, "rb") as fi, open(out, "wb") as fo:
            while block := fi.read(8 << 20):
                fo.write(block)
                done += len(block)
                say(f"{label}: {done / 1e6:.0f} / {total / 1e6:.0f} MB", lo + (hi - lo) * done / total)
        shutil.copystat(f, out)


def _install_folder(src: Path, dest: Path, say: Progress, lo: float, hi: float, verify: bool) -> None:
    staging = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        _copy_tree(src, staging, say, lo, lo + (hi - lo) * 0.8, f"Copying {dest.name}")
        if verify:
            say(f"Checking {dest.name} against its checksums", lo + (hi - lo) * 0.85)
            if not is_prepared(staging):
                raise ModelFolderError(f"The copy of {src} does not match its completion marker: the bundle is "
                                       "damaged; reinstall DFlash Studio.")
        from engine.export.target import swap_into_place

        swap_into_place(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install_default(force: bool = False, progress: Progress | None = None, notice: Notice | None = None) -> Path:
    """Make the embedded default target (and any bundled drafts) ready in the user data folder.

    A target folder holding files a person changed is moved aside first, as `prepare` does."""
    say = progress or (lambda _m, _f: None)
    target = paths.default_target_dir()
    src_root = bundled_models_dir()
    src = src_root / target.name
    if not force and is_prepared(target):
        say(f"Already prepared: {target}", 1.0)
        _install_drafts(src_root, say)
        return target
    if not (src / MARKER).is_file():
        raise NotBundled(NOT_BUNDLED.format(folder=paths.models_dir()))
    check_writable(target.parent, "The models folder")
    say(f"Installing the bundled {target.name} into {target.parent}", 0.0)
    set_aside_user_work(target, notice or log.warning)
    _install_folder(src, target, say, 0.0, 0.95, verify=True)
    _install_drafts(src_root, say)
    say(f"Prepared {target}", 1.0)
    return target


def _install_drafts(src_root: Path, say: Progress) -> None:
    """Bundled drafts for the default target (drafts/<name>/ and best.txt), when there are any."""
    src = src_root / "drafts"
    if not src.is_dir():
        return
    dest = paths.default_drafts_dir()
    for d in sorted(p for p in src.iterdir() if p.is_dir()):
        if not (dest / d.name / "openvino_model.xml").is_file():
            _install_folder(d, dest / d.name, say, 0.95, 0.99, verify=(d / MARKER).is_file())
    best = src / "best.txt"
    if best.is_file() and not (dest / "best.txt").is_file():
        shutil.copy2(best, dest / "best.txt")


def bundled_weight_format() -> str | None:
    """The weight format of the bundled default model (the installed app carries only that one)."""
    return read_marker(bundled_models_dir() / paths.default_target_dir().name).get("weight_format")
