"""What a folder someone wants to import holds, read from its files only (no torch, no Qt).

`inspect_hf_folder(path)` looks at a Hugging Face checkpoint folder and says whether it is a target
(a causal LM optimum-intel can export), a draft (DFlash v1, DSpark with or without a Markov head,
DFlash v2) or nothing this app can convert, and why, in words that say what to do. It reads
config.json, the safetensors headers (tensor names and shapes, not the weights) and the tokenizer
files; it never imports torch, transformers or optimum, so the app can call it on the GUI thread.

`check_hf_draft(info, target_dir)` is the cheap, config-level pre-export check of a draft checkpoint
against an exported target (vocabulary and tokenizer, hidden size, tapped layers, head weights). The
engine's own check (`engine.models.draft.check_draft_fits`) runs on the exported folder afterwards;
the rules here mirror it so a checkpoint it would refuse is refused before minutes of exporting.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from engine.checksums import gguf_files, sha256_file

# Draft architectures (config.json architectures[0]) -> variant. The exporters define the same
# names (engine.drafts.dflash_v1.DFLASH_V1_ARCH, dspark.DSPARK_ARCH, dflash2.DFLASH2_ARCH); they
# import torch, so the names are repeated here and a test keeps them equal.
DRAFT_ARCHS = {
    "DFlashDraftModel": "dflash_v1",
    "Qwen3DSparkModel": "dspark",
    "DFlash2DraftModel": "dflash_v2",
}
VARIANT_LABELS = {"dflash_v1": "DFlash v1", "dspark": "DSpark", "dflash_v2": "DFlash v2"}

KIND_TARGET = "target"  # a HF causal LM folder: export with --kind target
KIND_DRAFT = "draft"  # a HF draft checkpoint: export with --kind draft
KIND_OPENVINO_TARGET = "openvino-target"  # already exported: add it directly
KIND_OPENVINO_DRAFT = "openvino-draft"
KIND_NONE = "none"  # nothing usable; `reason` says what is missing and what to do

# Weight formats each exporter writes (engine.export.target.WEIGHT_FORMATS, engine.export.draft.WEIGHT_FORMATS)
# and the app's default for each kind: int8 targets (the CLI's default), int8 drafts (what `prepare`
# exports SmolLM2's shipped drafts in: a draft call reads half the bytes of fp16; Qwen2.5-Coder's are int4).
TARGET_WEIGHT_FORMATS = ("int4", "int8", "fp16", "fp32")
DRAFT_WEIGHT_FORMATS = ("int8", "int4", "fp16", "fp32")
DEFAULT_WEIGHT_FORMAT = {KIND_TARGET: "int8", KIND_DRAFT: "int8"}

# model_type values optimum-intel 2.2.0 exports to OpenVINO for "text-generation-with-past"
# (TasksManager, exporter="openvino"; tests/engine/test_inspect_folder.py compares with the installed one).
# Read from a list rather than asking optimum: importing it takes seconds and pulls in torch.
OPTIMUM_TEXT_GENERATION_TYPES = frozenset({
    "afmoe", "aquila", "arcee", "arctic", "baichuan", "bart", "bigbird_pegasus", "biogpt", "bitnet",
    "blenderbot", "blenderbot-small", "bloom", "chatglm", "codegen", "cohere", "cohere2", "dbrx", "deci",
    "deepseek", "deepseek_v2", "deepseek_v3", "exaone", "exaone4", "falcon", "falcon_mamba", "gemma",
    "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "glm", "glm4", "gpt2",
    "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granitemoe",
    "granitemoehybrid", "hunyuan_v1_dense", "internlm", "internlm2", "jais", "lfm2", "lfm2_moe", "llama",
    "llama4", "llama4_text", "llava-qwen2", "maira2", "mamba", "marian", "mbart", "minicpm", "minicpm3",
    "mistral", "mixtral", "mpt", "muse_glimmer_text", "olmo", "olmo2", "opt", "orion", "ouro", "pegasus",
    "persimmon", "phi", "phi3", "phimoe", "qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_5_moe_text",
    "qwen3_5_text", "qwen3_moe", "qwen3_next", "qwen3_omni_moe_talker_text", "qwen3_omni_moe_text",
    "qwen3_vl_text", "smollm3", "stablelm", "starcoder2", "xglm", "xverse", "zamba2",
})
# Decoder-only heads this engine runs (the export task is text-generation-with-past).
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
EXPORT_PACKAGES = ("torch", "transformers", "optimum.intel", "nncf", "safetensors")
EXPORT_EXTRA_HINT = "pip install 'dflash-studio[export]'"


@dataclass
class FolderInfo:
    """What `inspect_hf_folder` found. `kind` says what to do with it; `reason` why not (KIND_NONE)."""

    path: Path
    kind: str = KIND_NONE
    title: str = ""  # one line: "Qwen3 target (Qwen3ForCausalLM)", "DSpark draft with a gated Markov head"
    reason: str = ""  # KIND_NONE / OpenVINO kinds: what is wrong or what to do instead
    notes: list[str] = field(default_factory=list)  # worth knowing, not blocking
    config: dict[str, Any] = field(default_factory=dict)
    # targets
    architecture: str | None = None
    model_type: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    optimum_exportable: bool | None = None
    has_chat_template: bool | None = None
    # drafts
    variant: str | None = None  # dflash_v1 | dspark | dflash_v2
    head_type: str | None = None  # none | vanilla | gated | selector
    markov_rank: int | None = None
    block_size: int | None = None
    draft_tokens: int | None = None  # candidates per step at most
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    num_target_layers: int | None = None
    num_draft_layers: int | None = None
    tensors: dict[str, list[int]] = field(default_factory=dict)  # safetensors names -> shapes
    weights_bytes: int = 0

    @property
    def usable(self) -> bool:
        """Something the exporter can convert."""
        return self.kind in (KIND_TARGET, KIND_DRAFT)

    @property
    def already_exported(self) -> bool:
        return self.kind in (KIND_OPENVINO_TARGET, KIND_OPENVINO_DRAFT)

    @property
    def model_kind(self) -> str | None:
        """"target" or "draft" (HF or OpenVINO), None when the folder holds neither."""
        return {KIND_TARGET: "target", KIND_OPENVINO_TARGET: "target",
                KIND_DRAFT: "draft", KIND_OPENVINO_DRAFT: "draft"}.get(self.kind)

    def rows(self) -> list[tuple[str, str]]:
        """Label / value pairs describing the folder (what the import dialog shows)."""
        out: list[tuple[str, str]] = []
        if self.kind == KIND_TARGET:
            out.append(("Architecture", f"{self.architecture} (model_type {self.model_type})"))
            out.append(("Shape", f"{_n(self.num_layers)} layers, hidden size {_n(self.hidden_size)}, "
                                 f"vocabulary {_n(self.vocab_size)}"))
            out.append(("Chat", "chat template (instruct model)" if self.has_chat_template
                        else "no chat template: the app continues plain text"))
            out.append(("Export", "optimum-intel exports this architecture" if self.optimum_exportable
                        else "optimum-intel does not list this architecture"))
        elif self.kind == KIND_DRAFT:
            out.append(("Variant", self.title))
            out.append(("Block", f"block size {_n(self.block_size)} (up to {_n(self.draft_tokens)} draft tokens "
                                 "per step)"))
            out.append(("Target layers", f"taps {self.target_layer_ids}"
                        + (f" (trained for a target with {self.num_target_layers} layers)"
                           if self.num_target_layers else "")))
            layers = "1 draft layer" if self.num_draft_layers == 1 else f"{_n(self.num_draft_layers)} draft layers"
            out.append(("Shape", f"{layers}, hidden size {_n(self.hidden_size)}, "
                                 f"vocabulary {_n(self.vocab_size)}, mask token id {_n(self.mask_token_id)}"))
        if self.weights_bytes:
            out.append(("Weights", _size(self.weights_bytes)))
        return out


def _n(v: Any) -> str:
    return "?" if v is None else str(v)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ------------------------------------------------------------------------------------------------
# Reading files
# ------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def safetensors_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a .safetensors file's JSON header (the weights are not read)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError("the file is shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise ValueError("the header length is not plausible")
        header = json.loads(f.read(n))
    return {k: list(v.get("shape", [])) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _weights(folder: Path) -> tuple[list[Path], list[Path], str | None]:
    """(safetensors files, pytorch .bin files, a problem) — the problem names missing shards."""
    problem = None
    st = sorted(folder.glob("*.safetensors"))
    pt = sorted(p for p in folder.glob("*.bin") if p.name.startswith("pytorch_model"))
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            try:
                shards = sorted(set((_read_json(index).get("weight_map") or {}).values()))
            except (OSError, ValueError) as exc:
                problem = f"{index_name} cannot be read ({exc})"
                continue
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                problem = (f"{len(missing)} of the {len(shards)} weight files listed in {index_name} are missing "
                           f"({', '.join(missing[:3])}{'…' if len(missing) > 3 else ''}): the download is incomplete")
    empty = [p.name for p in st + pt if p.stat().st_size == 0]
    if empty and not problem:
        problem = f"{', '.join(empty[:3])} is empty: the download is incomplete"
    return st, pt, problem


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            return bool(_read_json(cfg).get("chat_template"))
        except (OSError, ValueError):
            return False
    return False


def _has_tokenizer(folder: Path) -> bool:
    return ((folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()
            or ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())
            or (folder / "vocab.txt").is_file())


def _text_field(cfg: Mapping[str, Any], key: str) -> Any:
    """A top-level config field, else the same field of text_config (multimodal wrappers)."""
    if cfg.get(key) is not None:
        return cfg[key]
    sub = cfg.get("text_config")
    return sub.get(key) if isinstance(sub, Mapping) else None


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _norm_type(model_type: str) -> str:
    return model_type.replace("-", "_")


def optimum_can_export(model_type: str | None) -> bool:
    """Whether optimum-intel (the pinned version) lists model_type for OpenVINO text generation."""
    if not model_type:
        return False
    known = {_norm_type(t) for t in OPTIMUM_TEXT_GENERATION_TYPES}
    return _norm_type(model_type) in known


def export_unavailable_reason() -> str | None:
    """Why `dflash-studio export` cannot run from this installation, or None when it can."""
    if getattr(sys, "frozen", False):
        return ("This installed app carries the runtime only, not the exporter (torch, optimum-intel). Run "
                f"`dflash-studio export` from a Python environment with {EXPORT_EXTRA_HINT}, then add the folder.")
    missing = [m for m in EXPORT_PACKAGES if _find_spec(m) is None]
    if missing:
        return (f"Exporting needs {', '.join(missing)}, which this Python environment lacks: "
                f"{EXPORT_EXTRA_HINT}.")
    return None


def _find_spec(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------
# The inspection
# ------------------------------------------------------------------------------------------------
def inspect_hf_folder(path: Path | str) -> FolderInfo:
    """Say what a folder holds (see the module docstring); never raises for a bad folder."""
    path = Path(path).expanduser()
    info = FolderInfo(path=path)
    if not path.exists():
        info.reason = f"{path} does not exist."
        return info
    if not path.is_dir():
        info.reason = (f"{path.name} is a file. Choose the folder that holds config.json and the weights "
                       "(*.safetensors), not a file inside it.")
        return info
    if (path / "openvino_model.xml").is_file():
        return _openvino_folder(info)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        info.reason = _why_no_config(path)
        return info
    try:
        cfg = _read_json(cfg_path)
        if not isinstance(cfg, dict):
            raise ValueError("it is not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        info.reason = f"config.json cannot be read ({exc}). Download the model again."
        return info
    info.config = cfg
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    info.architecture = arch
    info.model_type = cfg.get("model_type")
    if arch in DRAFT_ARCHS:
        return _draft_folder(info, DRAFT_ARCHS[arch])
    return _target_folder(info)


def _why_no_config(path: Path) -> str:
    """A folder without config.json: say what it looks like instead, and where to point."""
    snapshots = sorted(p.parent for p in path.glob("snapshots/*/config.json"))
    if snapshots:
        return ("This is a Hugging Face cache folder: the model files are in "
                f"{snapshots[-1].relative_to(path)}. Choose that folder.")
    subs = sorted(p.parent.name for p in path.glob("*/config.json"))
    if subs:
        return (f"No config.json here, but these subfolders hold one: {', '.join(subs[:5])}"
                f"{'…' if len(subs) > 5 else ''}. Choose one of them.")
    if gguf_files(path):
        return ("This folder holds GGUF files (llama.cpp's format), not a Hugging Face checkpoint. Download the "
                "model's original Hugging Face repository (config.json, *.safetensors and the tokenizer files).")
    if list(path.glob("*.safetensors")) or list(path.glob("pytorch_model*.bin")):
        return ("Weights are here but config.json is missing, so the model's architecture is unknown. Copy "
                "config.json from the model's Hugging Face repository into this folder.")
    return ("No config.json: this is not a Hugging Face model folder. Choose the folder that holds config.json, "
            "the weights (*.safetensors) and, for a target, the tokenizer files.")


def _openvino_folder(info: FolderInfo) -> FolderInfo:
    path = info.path
    cfg: dict[str, Any] = {}
    try:
        cfg = _read_json(path / "config.json") if (path / "config.json").is_file() else {}
    except (OSError, ValueError):
        cfg = {}
    archs = cfg.get("architectures") or [] if isinstance(cfg, dict) else []
    info.config = cfg if isinstance(cfg, dict) else {}
    info.architecture = archs[0] if archs else None
    if info.architecture in DRAFT_ARCHS:
        info.kind = KIND_OPENVINO_DRAFT
        info.variant = DRAFT_ARCHS[info.architecture]
        info.title = f"Already exported: an OpenVINO {VARIANT_LABELS[info.variant]} draft"
    elif (path / "openvino_tokenizer.xml").is_file():
        info.kind = KIND_OPENVINO_TARGET
        info.title = f"Already exported: an OpenVINO target ({info.architecture or 'unknown architecture'})"
    else:
        info.reason = ("This folder holds an OpenVINO model (openvino_model.xml), not a Hugging Face checkpoint, "
                       "and it has no tokenizer IR (openvino_tokenizer.xml), so it is neither a complete target nor "
                       "a DFlash draft. Export the model again from its Hugging Face folder.")
        return info
    info.reason = ("This folder is already exported to OpenVINO: nothing to convert. Add it directly "
                   f"(as a {info.model_kind}) instead of importing it.")
    return info


def _target_folder(info: FolderInfo) -> FolderInfo:
    cfg, path, arch = info.config, info.path, info.architecture
    looks_like_draft = arch and any(w in arch.lower() for w in ("dflash", "dspark", "eagle", "medusa", "draft"))
    if looks_like_draft:
        info.reason = (f"config.json names the draft architecture {arch}, which this version cannot export. It "
                       f"exports {', '.join(DRAFT_ARCHS)} drafts (DFlash v1, DSpark, DFlash v2).")
        return info
    if not arch or not arch.endswith(CAUSAL_LM_SUFFIXES):
        what = f"architecture {arch}" if arch else "no architectures entry"
        info.reason = (f"config.json says {what}{f', model_type {info.model_type}' if info.model_type else ''}: "
                       "not a text-generation (causal LM) model or a DFlash draft, so it can be neither a target "
                       "nor a draft. Choose a chat / text-generation model (…ForCausalLM) or a DFlash draft.")
        return info
    info.optimum_exportable = optimum_can_export(info.model_type)
    if not info.optimum_exportable:
        info.reason = (f"Unknown architecture for the exporter: optimum-intel does not export model_type "
                       f"{info.model_type!r} ({arch}) to OpenVINO. Choose a model of a supported family "
                       "(Llama, Qwen2/3, Mistral, Phi-3, Gemma, …).")
        return info
    info.num_layers = _int(_text_field(cfg, "num_hidden_layers"))
    info.hidden_size = _int(_text_field(cfg, "hidden_size"))
    info.vocab_size = _int(_text_field(cfg, "vocab_size"))
    info.has_chat_template = _has_chat_template(path)
    st, pt, problem = _weights(path)
    info.weights_bytes = sum(p.stat().st_size for p in st + pt)
    if problem:
        info.reason = f"{problem}. Download the model again (all *.safetensors files and their index)."
        return info
    if not st and not pt:
        info.reason = ("config.json is here but the weights are missing (no *.safetensors or pytorch_model*.bin). "
                       "Download the weight files into this folder; with huggingface-cli, download the whole "
                       "repository, not only config.json.")
        return info
    if not _has_tokenizer(path):
        info.reason = ("The tokenizer is missing (no tokenizer.json, tokenizer.model or vocab.json + merges.txt). "
                       "The export converts it to OpenVINO and chat needs it: copy the tokenizer files from the "
                       "model's Hugging Face repository into this folder.")
        return info
    from engine.export.target import ANNOTATED_FAMILIES  # stdlib-only module at import time

    if info.model_type not in ANNOTATED_FAMILIES:
        info.notes.append(f"{info.model_type} is not one of the families whose layer outputs the export is known to "
                          "find (Llama, Mistral, Qwen2/3); if it cannot find them, the target still runs alone but "
                          "DFlash drafts cannot use it.")
    if not info.has_chat_template:
        info.notes.append("No chat template: the app will give it your message as plain text to continue.")
    if not st:
        info.notes.append("Weights are in pytorch_model*.bin (pickle) files; the export loads them with torch.")
    info.kind = KIND_TARGET
    info.title = f"Target model: {arch}"
    return info


def _draft_folder(info: FolderInfo, variant: str) -> FolderInfo:
    cfg, path = info.config, info.path
    info.variant = variant
    dcfg = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), Mapping) else {}

    def field_(key: str) -> Any:  # v2 keeps its switches in dflash_config first, v1 only the mask / taps
        if variant == "dspark":
            return cfg.get(key)
        if dcfg.get(key) is not None:
            return dcfg[key]
        return cfg.get(key)

    name = VARIANT_LABELS[variant]
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
               if cfg.get(k) is None]
    mask = field_("mask_token_id")
    block = cfg.get("block_size", 16) if variant == "dflash_v1" else field_("block_size")
    if mask is None:
        missing.append("dflash_config.mask_token_id" if variant != "dspark" else "mask_token_id")
    if block is None:
        missing.append("block_size")
    if variant in ("dspark", "dflash_v2") and cfg.get("vocab_size") is None:
        missing.append("vocab_size")
    if variant == "dspark" and cfg.get("markov_rank") is None:
        missing.append("markov_rank")
    if variant == "dflash_v2":
        missing += [f"dflash_config.{k}" for k in ("conv_group_size", "conv_kernel_size", "selector_rank",
                                                   "selector_top_k") if field_(k) is None]
    if missing:
        info.reason = (f"config.json says a {name} draft but lacks {', '.join(missing)}. Download the "
                       "checkpoint's config.json again (it is not the one the weights were trained with).")
        return info
    info.hidden_size = _int(cfg["hidden_size"])
    info.num_draft_layers = _int(cfg["num_hidden_layers"])
    info.vocab_size = _int(cfg.get("vocab_size"))
    info.mask_token_id = _int(mask)
    info.block_size = _int(block)
    info.num_target_layers = _int(cfg.get("num_target_layers"))
    taps = field_("target_layer_ids")
    if taps:
        info.target_layer_ids = [int(i) for i in taps]
    elif info.num_target_layers is not None:
        info.target_layer_ids = default_target_layer_ids(info.num_target_layers, info.num_draft_layers or 1)
        info.notes.append(f"config.json names no target_layer_ids; the exporter uses z-lab's default taps "
                          f"{info.target_layer_ids} for a {info.num_target_layers}-layer target.")
    else:
        info.reason = (f"config.json says a {name} draft but names neither target_layer_ids nor num_target_layers, "
                       "so the layers of the target it reads are unknown.")
        return info
    if info.block_size is None or info.block_size < 2:
        info.reason = f"config.json's block_size {block!r} is not a block of at least 2 rows."
        return info

    if variant == "dflash_v1":
        info.head_type = "none"
        info.draft_tokens = info.block_size - 1
        info.title = "DFlash v1 draft"
    elif variant == "dspark":
        rank = _int(cfg.get("markov_rank")) or 0
        info.markov_rank = rank
        info.draft_tokens = info.block_size
        if rank > 0:
            head = str(cfg.get("markov_head_type") or "")
            if head == "rnn":
                info.reason = ("This DSpark draft has an rnn Markov head, which this version does not support (its "
                               "recurrent state along the walked path does not fit the Top-K scorer). DSpark drafts "
                               "with a vanilla or gated head, or without a head, are supported.")
                return info
            if head not in ("vanilla", "gated"):
                info.reason = f"DSpark markov_head_type must be vanilla or gated when markov_rank > 0, got {head!r}."
                return info
            info.head_type = head
            info.title = f"DSpark draft with a {head} Markov head (rank {rank})"
        else:
            info.head_type = "none"
            info.title = "DSpark draft without a Markov head (markov_rank 0)"
        if cfg.get("enable_confidence_head"):
            info.title += ", confidence head"
    else:
        info.head_type = "selector"
        info.markov_rank = _int(field_("selector_rank"))
        info.draft_tokens = info.block_size - 1
        info.title = (f"DFlash v2 draft (candidate selector rank {info.markov_rank}, "
                      f"top-{_int(field_('selector_top_k'))})")

    st, _pt, problem = _weights(path)
    if problem:
        info.reason = f"{problem}. Download the checkpoint again."
        return info
    if not st:
        info.reason = (f"config.json says a {name} draft but there are no *.safetensors weights here. Download "
                       "the checkpoint's model.safetensors (draft exports read safetensors only).")
        return info
    info.weights_bytes = sum(p.stat().st_size for p in st)
    try:
        for f in st:
            info.tensors.update({k.removeprefix("model."): v for k, v in safetensors_header(f).items()})
    except (OSError, ValueError) as exc:
        info.reason = f"The weights cannot be read ({exc}): the download is incomplete or damaged. Download it again."
        return info
    problem = _draft_weights_problem(info, cfg)
    if problem:
        info.reason = problem
        return info
    info.kind = KIND_DRAFT
    return info


def _draft_weights_problem(info: FolderInfo, cfg: Mapping[str, Any]) -> str | None:
    """The cheap part of the exporters' strict load: the tensors a head needs, and the context width."""
    t = info.tensors
    name = VARIANT_LABELS[info.variant or "dflash_v1"]
    if not any(k.startswith("layers.") for k in t):
        return (f"The weights hold no draft layers (layers.*): this model.safetensors is not a {name} draft's. "
                "Download the checkpoint again.")
    if info.variant == "dspark" and info.head_type in ("vanilla", "gated"):
        need = ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight"]
        if info.head_type == "gated":
            need.append("markov_head.gate_proj.weight")
        lacking = [k for k in need if k not in t]
        if lacking:
            return (f"config.json configures a {info.head_type} Markov head (markov_rank {info.markov_rank}) but the "
                    f"weights lack {', '.join(lacking)}. Download the full checkpoint, or use the matching headless "
                    "config (markov_rank 0) if this draft was trained without a head.")
    if info.variant == "dspark" and cfg.get("enable_confidence_head") and not any(
            k.startswith("confidence_head.") for k in t):
        return ("config.json enables a confidence head but the weights have no confidence_head.* tensors. "
                "Download the full checkpoint.")
    if info.variant == "dflash_v2" and not any(k.startswith("candidate_selector.") for k in t):
        return ("config.json says a DFlash v2 draft but the weights have no candidate_selector.* tensors (its head). "
                "Download the full checkpoint.")
    fc = t.get("fc.weight")
    if fc and info.hidden_size and info.target_layer_ids and len(fc) == 2:
        expected = [info.hidden_size, len(info.target_layer_ids) * info.hidden_size]
        if fc != expected:
            return (f"The weights do not match config.json: fc.weight is {fc}, but {len(info.target_layer_ids)} tapped "
                    f"layers of hidden size {info.hidden_size} need {expected}. The config belongs to another "
                    "checkpoint.")
    return None


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps (same as engine.drafts.dflash_v1.default_target_layer_ids; a test checks)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


# ------------------------------------------------------------------------------------------------
# Pre-export check of a draft checkpoint against an exported target
# ------------------------------------------------------------------------------------------------
@dataclass
class TargetFacts:
    """What the pre-export check needs from an exported target folder (read from its JSON files)."""

    path: Path
    vocab_size: int | None
    hidden_size: int | None
    num_layers: int | None
    tokenizer_json: Path | None


def read_target_facts(target_dir: Path | str) -> TargetFacts:
    """Vocabulary, hidden size and layers of an exported target, from config.json (optimum copies the HF
    config) and dflash_export.json; raises ModelFolderError when it is not a complete target folder."""
    from engine.models.target import check_target_dir

    target_dir = Path(target_dir)
    check_target_dir(target_dir)
    cfg: dict[str, Any] = {}
    for name in ("config.json", "dflash_export.json"):
        try:
            data = _read_json(target_dir / name) if (target_dir / name).is_file() else {}
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict):
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "text_config"):
                if cfg.get(k) is None and data.get(k) is not None:
                    cfg[k] = data[k]
    tok = target_dir / "tokenizer.json"
    return TargetFacts(target_dir, _int(_text_field(cfg, "vocab_size")), _int(_text_field(cfg, "hidden_size")),
                       _int(_text_field(cfg, "num_hidden_layers")), tok if tok.is_file() else None)


@dataclass
class DraftCheck:
    reasons: list[str] = field(default_factory=list)  # each one refuses the pair, and says what fixes it
    notes: list[str] = field(default_factory=list)  # checked / not checkable, worth knowing
    checked: bool = True  # False: the target could not be read, nothing was compared

    @property
    def fits(self) -> bool:
        return not self.reasons


def check_hf_draft(info: FolderInfo, target_dir: Path | str) -> DraftCheck:
    """Config-level check of a HF draft checkpoint against an exported target, before exporting.

    Same rules as engine.models.draft.check_draft_fits (which runs on the exported folder): vocabulary
    and mask id, hidden size (and the context width the taps give), tapped layers inside the target's
    0..L-2; plus what only the checkpoint shows: the tokenizer when both folders carry one, the head
    weights a DSpark / DFlash v2 config declares (inspect_hf_folder refuses those folders), and the
    target depth the draft was trained for.
    """
    from engine.errors import ModelFolderError

    out = DraftCheck()
    if info.kind != KIND_DRAFT:
        out.reasons.append(info.reason or "This folder does not hold a draft checkpoint.")
        return out
    try:
        t = read_target_facts(target_dir)
    except ModelFolderError as exc:
        out.checked = False
        out.notes.append(f"No usable target to check the draft against ({exc}). It is checked when you choose it "
                         "with a target.")
        return out
    fix_other = "Use a draft trained for this target, or choose the target it was trained for."
    if t.vocab_size is None:
        out.notes.append("The target's config.json does not give its vocabulary size; it is checked after the export.")
    else:
        if info.vocab_size is not None and info.vocab_size != t.vocab_size:
            out.reasons.append(f"Vocabulary: the draft was built for {info.vocab_size} tokens, the target has "
                               f"{t.vocab_size}. {fix_other}")
        if info.mask_token_id is not None and not 0 <= info.mask_token_id < t.vocab_size:
            out.reasons.append(f"Vocabulary: the draft's mask_token_id {info.mask_token_id} is outside the target's "
                               f"{t.vocab_size} tokens. {fix_other}")
        if info.vocab_size is None:
            out.notes.append("The draft's config.json gives no vocab_size; only its mask token id was checked.")
    tok_reason, tok_note = _compare_tokenizers(info.path / "tokenizer.json", t.tokenizer_json)
    if tok_reason:
        out.reasons.append(tok_reason + " " + fix_other)
    if tok_note:
        out.notes.append(tok_note)
    if t.hidden_size is None:
        out.notes.append("The target's config.json does not give its hidden size; it is checked after the export.")
    elif info.hidden_size is not None and info.hidden_size != t.hidden_size:
        out.reasons.append(f"Hidden size: the draft takes embeddings of width {info.hidden_size}, the target's are "
                           f"{t.hidden_size} wide. The draft belongs to another model size: {fix_other[0].lower()}"
                           f"{fix_other[1:]}")
    if t.num_layers is None:
        out.notes.append("The target's config.json does not give its layer count; the taps are checked after "
                         "the export.")
    else:
        bad = [i for i in info.target_layer_ids or [] if not 0 <= i < t.num_layers - 1]
        if bad:
            out.reasons.append(f"Layer ids: the draft taps target layers {bad}, but this target's tappable layers are "
                               f"0..{t.num_layers - 2} (layer {t.num_layers - 1} is after the final norm). The draft "
                               "was trained for a deeper target: choose that target.")
        elif info.num_target_layers is not None and info.num_target_layers != t.num_layers:
            out.notes.append(f"The draft was trained for a {info.num_target_layers}-layer target; this one has "
                             f"{t.num_layers}. Its taps fit, but it may be accepted rarely.")
    return out


def _tokenizer_vocab(path: Path) -> dict[str, int]:
    data = _read_json(path)
    model = data.get("model") or {}
    vocab = model.get("vocab")
    out: dict[str, int] = {}
    if isinstance(vocab, dict):
        out.update({str(k): int(v) for k, v in vocab.items()})
    elif isinstance(vocab, list):  # unigram: [[piece, score], ...]
        out.update({str(p[0]): i for i, p in enumerate(vocab)})
    for tok in data.get("added_tokens") or []:
        out[str(tok.get("content"))] = int(tok.get("id"))
    return out


def _compare_tokenizers(draft_tok: Path, target_tok: Path | None) -> tuple[str | None, str | None]:
    """(a reason, a note): tokenizers differ / could not be compared."""
    if not draft_tok.is_file():
        return None, ("The draft has no tokenizer of its own (drafts use the target's): the vocabulary size and mask "
                      "token id were checked.")
    if target_tok is None:
        return None, "The target folder has no tokenizer.json to compare the draft's tokenizer with."
    if sha256_file(draft_tok) == sha256_file(target_tok):
        return None, "The draft's tokenizer.json is the target's."
    try:
        a, b = _tokenizer_vocab(draft_tok), _tokenizer_vocab(target_tok)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        return None, f"The tokenizers could not be compared ({exc})."
    if a == b:
        return None, "The draft's tokenizer has the same vocabulary as the target's."
    by_id_a = {v: k for k, v in a.items()}
    by_id_b = {v: k for k, v in b.items()}
    differ = sorted(i for i in set(by_id_a) | set(by_id_b) if by_id_a.get(i) != by_id_b.get(i))
    first = differ[0]
    return (f"Tokenizer: the draft's tokenizer.json differs from the target's in {len(differ)} token ids (id {first}: "
            f"{by_id_a.get(first)!r} vs {by_id_b.get(first)!r}), so the draft would propose other tokens than it "
            "means."), None


# ------------------------------------------------------------------------------------------------
# Destinations and leftovers (the import dialog's disk bookkeeping, kept Qt-free for tests)
# ------------------------------------------------------------------------------------------------
def source_name(path: Path) -> str:
    """A readable model name for a folder: the repo name of a HF cache snapshot, else the folder name."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.name.startswith("models--"):
            return p.name.split("--")[-1]
    name = path.name or "model"
    if (name.lower() in ("hf", "model", "models", "checkpoint", "ckpt", "original", "main", "weights")
            or (len(name) == 40 and all(c in "0123456789abcdef" for c in name))) and path.parent.name:
        name = path.parent.name  # .../Qwen3-8B/hf, .../snapshots/<hash>
    for suffix in ("-ckpt", "_ckpt", "-checkpoint", "_checkpoint", "-hf", "_hf"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def suggest_destination(info: FolderInfo, weight_format: str, models_root: Path, drafts_root: Path) -> Path:
    """models/<name>-ov-<format> for targets, models/drafts/<name>-<format> for drafts; never an existing path."""
    name = source_name(info.path)
    if info.model_kind == "draft":
        base = drafts_root / f"{name}-{weight_format}"
    else:
        base = models_root / f"{name}-ov-{weight_format}"
    dest, n = base, 2
    while dest.exists() or leftovers(dest):
        dest = base.with_name(f"{base.name}-{n}")
        n += 1
    return dest


def destination_problem(dest: Path | str, source: Path | str) -> str | None:
    """Why the export must not write to dest (None: it may)."""
    dest, source = Path(dest).expanduser(), Path(source).expanduser()
    if not dest.name:
        return "Choose a destination folder."
    if dest.exists():
        return f"{dest} already exists. Choose a new folder name: an import never overwrites a model."
    try:
        if dest.resolve().is_relative_to(source.resolve()):
            return "The destination is inside the folder being imported. Choose a folder elsewhere."
    except OSError:
        pass
    parent = dest.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a folder."
    return None


def free_space_note(dest: Path, weights_bytes: int) -> str | None:
    """A warning when the destination's disk has less room than the weights take."""
    parent = Path(dest).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        free = shutil.disk_usage(parent).free
    except OSError:
        return None
    if weights_bytes and free < weights_bytes:
        return (f"Only {_size(free)} free where the export goes, and the weights alone take {_size(weights_bytes)}: "
                "the export may run out of space.")
    return None


def leftovers(dest: Path | str) -> list[Path]:
    """Temp siblings an interrupted export of dest can leave (`.<name>.partial-*`, both exporters' pattern)."""
    dest = Path(dest)
    if not dest.parent.is_dir():
        return []
    return sorted(dest.parent.glob(f".{dest.name}.partial-*"))


def remove_export_leftovers(dest: Path | str, remove_dest: bool) -> list[Path]:
    """Delete the temp siblings of dest (and dest itself when remove_dest); return what was removed."""
    dest = Path(dest)
    removed = []
    for p in leftovers(dest) + ([dest] if remove_dest and dest.exists() else []):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
