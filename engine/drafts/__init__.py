"""The torch DFlash-family drafts: DFlash v1 (z-lab), DSpark (DeepSpec) and DFlash v2 (z-lab).

Configs, modules, public-format checkpoint folders and reference walks, written for this project.
Both engine/export (the OpenVINO IRs) and engine/training (self-distillation) import them; this
package imports neither, and nothing here needs OpenVINO. torch is imported by the variant modules,
not by this file, so `detect_variant` works without torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from engine.errors import ModelFolderError

VARIANT_DFLASH_V1 = "dflash_v1"
VARIANT_DSPARK = "dspark"
VARIANT_DFLASH_V2 = "dflash_v2"
VARIANTS = (VARIANT_DFLASH_V1, VARIANT_DSPARK, VARIANT_DFLASH_V2)

# architectures[0] of each variant's config.json (docs/draft-contract.md)
ARCHITECTURES = {
    "DFlashDraftModel": VARIANT_DFLASH_V1,
    "Qwen3DSparkModel": VARIANT_DSPARK,
    "DFlash2DraftModel": VARIANT_DFLASH_V2,
}


def detect_variant(config: Mapping[str, Any]) -> str:
    """Name the draft variant from config.json's architectures."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch]
    raise ModelFolderError(f"not a DFlash draft checkpoint: architectures={archs!r}")


def load_draft(folder: Path, dtype: Any = None) -> tuple[Any, dict[str, Any], str]:
    """(torch draft in eval mode, its config dict, its variant) of any checkpoint folder (float32 by default)."""
    import torch

    from engine.drafts.dflash2 import load_dflash2_checkpoint
    from engine.drafts.dflash_v1 import load_checkpoint, read_config
    from engine.drafts.dspark import load_dspark_checkpoint

    variant = detect_variant(read_config(Path(folder)))
    loader = {VARIANT_DFLASH_V1: load_checkpoint, VARIANT_DSPARK: load_dspark_checkpoint,
              VARIANT_DFLASH_V2: load_dflash2_checkpoint}[variant]
    model, cfg = loader(Path(folder), dtype or torch.float32)
    return model, cfg, variant


def save_draft(model: Any, config: Mapping[str, Any], folder: Path) -> Path:
    """Write `model` in its variant's public layout (config.json + model.safetensors)."""
    from engine.drafts.dflash2 import save_dflash2_checkpoint
    from engine.drafts.dflash_v1 import save_checkpoint
    from engine.drafts.dspark import save_dspark_checkpoint

    saver = {VARIANT_DFLASH_V1: save_checkpoint, VARIANT_DSPARK: save_dspark_checkpoint,
             VARIANT_DFLASH_V2: save_dflash2_checkpoint}[detect_variant(config)]
    return saver(model, config, Path(folder))
