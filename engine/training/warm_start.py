"""Warm start: a DFlash v1 draft's backbone copied into a DSpark or DFlash v2 draft of the same target."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.drafts.dflash_v1 import DFlashV1Draft, load_checkpoint

BACKBONE_PREFIXES = ("fc.", "hidden_norm.", "layers.", "norm.")
V2_ONLY = ("attention_conv.", "mlp_conv.")  # DFlash v2's additions inside a layer (no v1 counterpart)


def copy_v1_backbone(draft: DFlashV1Draft, v1_dir: Path) -> dict[str, Any]:
    """Copy a DFlash v1 draft's backbone (fc, hidden_norm, layers, norm) into `draft`: same tensor
    names and shapes are required (same target, taps, MLP width); a draft with fewer layers takes
    the first ones. For DSpark the block layout differs (v1 offset 1, DSpark offset 0), so this is an
    initialisation, not a conversion; DFlash v2 shares v1's layout (its convs start as identities)."""
    v1, v1_cfg = load_checkpoint(Path(v1_dir))
    a, b = v1.cfg, draft.cfg
    for field in ("hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "target_layer_ids", "mask_token_id"):
        if getattr(a, field) != getattr(b, field):
            raise ValueError(f"{v1_dir}: {field} {getattr(a, field)!r} differs from the draft's {getattr(b, field)!r}")
    if b.num_hidden_layers > a.num_hidden_layers:
        raise ValueError(f"{v1_dir}: {a.num_hidden_layers} layers, the draft wants {b.num_hidden_layers}")
    src = v1.state_dict()
    own = draft.state_dict()
    keys = [k for k in own if k.startswith(BACKBONE_PREFIXES) and not any(x in k for x in V2_ONLY)]
    missing = [k for k in keys if k not in src or src[k].shape != own[k].shape]
    if missing:
        raise ValueError(f"{v1_dir}: backbone tensors missing or misshapen: {missing[:4]}")
    draft.load_state_dict({k: src[k] for k in keys}, strict=False)
    return {"from": str(v1_dir), "tensors": len(keys), "v1_block_size": v1_cfg.get("block_size"),
            "v1_layers": a.num_hidden_layers, "layers_copied": b.num_hidden_layers}
