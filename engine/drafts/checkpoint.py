"""Checkpoint folders of the DFlash-family drafts (config.json + *.safetensors, public tensor names).

Shared by the DSpark and DFlash v2 modules (the DFlash v1 module has its own stricter loader, as
z-lab's folders carry no embedding copies): a strict load whose errors name the missing, unexpected
or misshapen tensors, and a save in the same layout.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from engine.drafts.dflash_v1 import read_config
from engine.errors import ModelFolderError

OPTIONAL_COPIES = ("embed_tokens.weight", "lm_head.weight")
INT8_STORAGE = "int8"  # config.json "weight_storage": wide 2-D weights as int8 rows, a float32 scale per row
SCALE_SUFFIX = "_scale"
INT8_MIN_COLUMNS = 256  # narrower rows (the Markov head's [V, r] tables) stay float16: a scale per row would cost


def int8_rows(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` for an int8 checkpoint: each float 2-D weight with at least INT8_MIN_COLUMNS columns as int8
    (symmetric, per row: scale = max|row| / 127) plus `<name>_scale`; every other float tensor as float16.
    Why: a deeper draft then fits the size the app ships, and the export quantizes to int8 per channel anyway."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if not v.is_floating_point():
            out[k] = v
        elif v.dim() == 2 and v.shape[1] >= INT8_MIN_COLUMNS:
            w = v.detach().float()
            scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
            out[k] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            out[k + SCALE_SUFFIX] = scale.contiguous()
        else:
            out[k] = v.detach().to(torch.float16).contiguous()
    return out


def from_int8_rows(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float32 weights of an int8 checkpoint's `<name>` + `<name>_scale` pairs; other tensors unchanged."""
    out = dict(state)
    for k in [k for k, v in state.items() if v.dtype == torch.int8 and k + SCALE_SUFFIX in state]:
        scale = out.pop(k + SCALE_SUFFIX).float()
        out[k] = state[k].float() * scale[:, None]
    return out


def read_state(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint, 'model.' prefixes stripped, int8-stored
    weights as float32."""
    from safetensors.torch import load_file

    files = sorted(Path(ckpt_dir).glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{ckpt_dir} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            state[k.removeprefix("model.")] = v
    return from_int8_rows(state)


def load_state_into(model: nn.Module, state: Mapping[str, torch.Tensor], ckpt_dir: Path, what: str,
                    dtype: torch.dtype, optional: Sequence[str] = OPTIONAL_COPIES) -> None:
    """Strict load with errors that name the missing / unexpected / misshapen tensors."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelFolderError(f"{ckpt_dir}: weights missing from the checkpoint: {', '.join(missing[:8])}")
    extra = sorted(k for k in set(state) - set(expected) if k not in optional)
    if extra:
        raise ModelFolderError(f"{ckpt_dir}: unexpected weights (not a {what} draft of this config?): {', '.join(extra[:8])}")
    bad = [f"{k} {tuple(state[k].shape)} (config says {tuple(v.shape)})" for k, v in expected.items()
           if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise ModelFolderError(f"{ckpt_dir}: weights of the wrong shape: {', '.join(bad[:4])}")
    model.load_state_dict({k: state[k].to(dtype) for k in expected})


def load_variant_checkpoint(cls: type, what: str, ckpt_dir: Path, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    """Build `cls` from a checkpoint folder's config, load its weights (the optional embed_tokens /
    lm_head copies kept for torch use), cast to `dtype`."""
    ckpt_dir = Path(ckpt_dir)
    cfg = read_config(ckpt_dir)
    model = cls(cfg)
    state = read_state(ckpt_dir)
    load_state_into(model, state, ckpt_dir, what, dtype)
    if "embed_tokens.weight" in state:
        model.embed_tokens_weight = state["embed_tokens.weight"].to(dtype)
    if "lm_head.weight" in state:
        model.lm_head_weight = state["lm_head.weight"].to(dtype)
    return model.to(dtype).eval(), cfg


def save_variant_checkpoint(model: nn.Module, config: Mapping[str, Any], ckpt_dir: Path) -> Path:
    """A DSpark / DFlash v2 folder: the model's tensors with DeepSpec's names, plus the embed_tokens /
    lm_head copies the model carries (when it carries them)."""
    return save_state(model, config, ckpt_dir, {"embed_tokens.weight": getattr(model, "embed_tokens_weight", None),
                                                "lm_head.weight": getattr(model, "lm_head_weight", None)})


def save_state(model: nn.Module, config: Mapping[str, Any], ckpt_dir: Path,
               extra: Mapping[str, torch.Tensor | None] | None = None) -> Path:
    from safetensors.torch import save_file

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(dict(config))
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    for k, v in (extra or {}).items():
        if v is not None:
            state[k] = v.detach().to("cpu").contiguous()
    cfg["torch_dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    if cfg.get("weight_storage") == INT8_STORAGE:
        state = int8_rows(state)
        cfg["torch_dtype"] = "float16"  # of the tensors that are not int8 rows
    elif cfg.get("weight_storage") is not None:
        raise ValueError(f"weight_storage {cfg['weight_storage']!r}: only {INT8_STORAGE!r} is known")
    save_file(state, str(ckpt_dir / "model.safetensors"), metadata={"format": "pt"})
    (ckpt_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return ckpt_dir
