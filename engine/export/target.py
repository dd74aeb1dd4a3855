"""Hugging Face causal LM folder -> OpenVINO target IR folder the engine and openvino_genai load.

The export is optimum-intel's (stateful, text-generation-with-past, openvino_tokenizers IRs with
the chat template), plus the `hidden_states_decoder_layers` rt_info that optimum writes only for
Qwen3-like types: DFlash drafts need the target's decoder-layer outputs, and writing them here
for Llama/Qwen2 means the IR is self-describing. torch/optimum/nncf are imported inside the
functions: the runtime engine imports this module's checks without the export extra installed.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from engine.errors import ModelFolderError

log = logging.getLogger(__name__)

WEIGHT_FORMATS = ("int4", "int8", "fp16", "fp32")
TASK = "text-generation-with-past"
EXPORT_INFO_FILE = "dflash_export.json"

# Families whose blocks are pre-norm with two residual Adds per layer: the graph search in
# engine.models.hidden_taps is known to work for these, so a failure there is an error.
ANNOTATED_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"})

# What a target folder must hold, and why each file matters (for the error message).
REQUIRED_FILES = {
    "openvino_model.xml": "the model graph",
    "openvino_model.bin": "the model weights",
    "openvino_tokenizer.xml": "the tokenizer (openvino_tokenizers)",
    "openvino_detokenizer.xml": "the detokenizer (openvino_tokenizers)",
    "config.json": "the model configuration",
}

# optimum's own default for `--weight-format int4` when a model has no tuned config, plus the
# group-size fallback its tuned configs use: SmolLM2's 576 input channels are not a multiple of
# 128 and nncf refuses by default (those layers get the largest group size that fits, e.g. 64).
_INT4_CONFIG = {"bits": 4, "ratio": 1.0, "sym": False, "group_size": 128, "all_layers": None, "group_size_fallback": "adjust"}
_INT8_CONFIG = {"bits": 8, "sym": False}


def check_target_folder(path: Path | str) -> None:
    """Raise ModelFolderError naming the first missing/empty file and how to get a good folder."""
    path = Path(path)
    fix = (
        "Export it again from its Hugging Face folder (`dflash-studio export --kind target --input HF_DIR "
        "--output DIR`), or run "
        "`dflash-studio prepare` for the embedded default target."
    )
    if not path.is_dir():
        raise ModelFolderError(f"Target folder {path} does not exist or is not a folder. {fix}")
    for name, what in REQUIRED_FILES.items():
        f = path / name
        if not f.is_file():
            raise ModelFolderError(f"Target folder {path} has no {name} ({what}). {fix}")
        if f.stat().st_size == 0:
            raise ModelFolderError(f"Target folder {path}: {name} ({what}) is empty, the export was cut short. {fix}")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"Target folder {path}: config.json is not valid JSON ({exc}). {fix}") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelFolderError(f"Target folder {path}: config.json has no model_type. {fix}")


def export_target(
    hf_dir: Path,
    out_dir: Path,
    weight_format: str = "int8",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Export `hf_dir` to `out_dir` and return out_dir.

    Works in a hidden sibling folder and renames it into place only when complete, so a crash
    never leaves a half-written out_dir (an existing out_dir is replaced only at the very end).
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    say = progress or (lambda _msg: None)
    weight_format = weight_format or "int8"  # the CLI passes None for "the default"
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}: use one of {', '.join(WEIGHT_FORMATS)}.")
    config = _read_hf_config(hf_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        say(f"Converting {hf_dir.name} to OpenVINO ({weight_format} weights)")
        _run_optimum_export(hf_dir, staging, weight_format)
        xml = staging / "openvino_model.xml"
        if not xml.is_file():
            raise ModelFolderError(f"optimum-intel wrote no openvino_model.xml for {hf_dir}; see its log above.")
        layers = _finish_ir(xml, config, weight_format, say)
        _ensure_chat_template(staging, hf_dir)
        check_target_folder(staging)
        info = {
            "weight_format": weight_format,
            "task": TASK,
            "source": str(hf_dir),
            "model_type": config.get("model_type"),
            "num_hidden_layers": config.get("num_hidden_layers"),
            "hidden_size": config.get("hidden_size"),
            "annotated_layers": layers,
            "versions": package_versions(),
        }
        (staging / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2), encoding="utf-8")
        say(f"Moving the finished export to {out_dir}")
        swap_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _read_hf_config(hf_dir: Path) -> dict:
    cfg = hf_dir / "config.json"
    if not cfg.is_file():
        raise ModelFolderError(
            f"{hf_dir} is not a Hugging Face model folder (no config.json). Point to the folder that holds "
            "config.json, the weights (*.safetensors) and the tokenizer files."
        )
    try:
        return json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelFolderError(f"{cfg} is not valid JSON ({exc}).") from exc


def _run_optimum_export(hf_dir: Path, out: Path, weight_format: str) -> None:
    """optimum-intel's stateful export with tokenizer conversion, weights kept float here.

    int8/int4 compression runs afterwards in _finish_ir (what optimum-cli does in a second pass).
    """
    from optimum.exporters.openvino import main_export
    from optimum.intel.openvino.configuration import OVConfig

    dtype = weight_format if weight_format in ("fp16", "fp32") else "fp32"
    main_export(
        str(hf_dir),
        output=out,
        task=TASK,
        ov_config=OVConfig(dtype=dtype),
        stateful=True,
        convert_tokenizer=True,
        local_files_only=True,
        library_name="transformers",
    )


def _finish_ir(xml: Path, config: dict, weight_format: str, say: Callable[[str], None]) -> int:
    """Compress weights (int8/int4) and add the hidden-state annotation; return the layer count."""
    import openvino as ov

    from engine.models import hidden_taps

    core = ov.Core()
    model = core.read_model(xml)
    changed = False
    if weight_format in ("int8", "int4"):
        # The same call and defaults optimum-cli's --weight-format uses (private, pinned 2.2.0).
        from optimum.intel.openvino.quantization import _weight_only_quantization

        say(f"Compressing weights to {weight_format}")

        model = _weight_only_quantization(model, dict(_INT8_CONFIG if weight_format == "int8" else _INT4_CONFIG))
        changed = True

    say("Locating decoder-layer outputs (hidden_states_decoder_layers)")
    n_layers = config.get("num_hidden_layers")
    model_type = config.get("model_type", "")
    existing = hidden_taps.read_annotation(model)
    found = 0
    if existing is not None:
        # optimum annotated it (Qwen3 family): keep it, but it must resolve in this graph.
        found = len(hidden_taps.find_decoder_layer_outputs(model))
        try:
            searched = hidden_taps.annotation_for(hidden_taps.search_decoder_layer_outputs(model, num_layers=n_layers))
            if json.loads(searched) != existing:
                log.warning("optimum's %s differs from the graph search; keeping optimum's.", hidden_taps.RT_INFO_KEY)
        except hidden_taps.HiddenTapError as exc:
            log.warning("Graph search disagrees with optimum's annotation: %s", exc)
    else:
        try:
            found = len(hidden_taps.annotate(model, num_layers=n_layers))
            changed = True
        except hidden_taps.HiddenTapError as exc:
            if model_type in ANNOTATED_FAMILIES:
                raise ModelFolderError(
                    f"Could not locate the decoder-layer outputs of this {model_type} export ({exc}); "
                    "DFlash drafts could not read its hidden states."
                ) from exc
            log.warning("No %s annotation for model_type %r: %s", hidden_taps.RT_INFO_KEY, model_type, exc)

    if changed:
        tmp_xml = xml.with_name("openvino_model.annotated.xml")
        ov.save_model(model, tmp_xml, compress_to_fp16=False)
        del model
        gc.collect()  # the old .bin is memory-mapped until the model is gone (Windows refuses the rename)
        os.replace(tmp_xml, xml)
        os.replace(tmp_xml.with_suffix(".bin"), xml.with_suffix(".bin"))
    return found


def _ensure_chat_template(out: Path, hf_dir: Path) -> None:
    """openvino_genai applies the template stored in the tokenizer IR; refuse an export that lost it."""
    import openvino as ov
    import openvino_tokenizers  # noqa: F401  (registers the tokenizer ops so read_model works)

    has_template = (hf_dir / "chat_template.jinja").is_file()
    cfg = hf_dir / "tokenizer_config.json"
    if not has_template and cfg.is_file():
        has_template = bool(json.loads(cfg.read_text(encoding="utf-8")).get("chat_template"))
    tok_xml = out / "openvino_tokenizer.xml"
    if not has_template or not tok_xml.is_file():
        return
    model = ov.Core().read_model(tok_xml)
    if not model.has_rt_info("chat_template") or not model.get_rt_info("chat_template").astype(str):
        raise ModelFolderError(
            f"The tokenizer of {hf_dir} has a chat template but the converted openvino_tokenizer.xml lost it."
        )


def swap_into_place(staging: Path, out_dir: Path) -> None:
    """Rename staging to out_dir; an old out_dir is moved aside first and deleted after."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out_dir, old)
    try:
        os.replace(staging, out_dir)
    except BaseException:
        if old is not None:
            os.replace(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def package_versions(
    dists: tuple[str, ...] = ("openvino", "openvino-tokenizers", "optimum-intel", "transformers", "torch", "nncf"),
) -> dict[str, str]:
    """Installed versions of the packages that shape an export (recorded next to it)."""
    from importlib import metadata

    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out
