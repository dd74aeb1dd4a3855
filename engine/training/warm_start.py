"""Warm starts: a DFlash v1 draft's backbone copied into a DSpark or DFlash v2 draft of the same target,
a trained draft grown deeper (new layers that start as identities), and a DSpark Markov head grown to a
higher rank (new rank columns that start at zero)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

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


ZEROED_IN_NEW_LAYERS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # the residual branches' outputs


def grow_layers(draft: Any, cfg: dict[str, Any], layers: int) -> tuple[Any, dict[str, Any]]:
    """`draft` with `layers` decoder layers: its own kept, each new one after them a copy of its last layer
    with the attention and MLP output projections zeroed. A zeroed output makes a pre-norm layer the
    identity, so the deeper draft drafts exactly what the trained one did and training goes on from there
    (the copied projections give the new layer useful inputs from the first step). Returns (draft, config)."""
    old = int(cfg["num_hidden_layers"])
    if layers < old:
        raise ValueError(f"the draft has {old} layers; it can grow, not shrink to {layers}")
    grown_cfg = copy.deepcopy(cfg)
    grown_cfg["num_hidden_layers"] = layers
    taps = [int(t) for t in draft.cfg.target_layer_ids]  # pinned: a config without them derives them from the layers
    if isinstance(grown_cfg.get("dflash_config"), dict):
        grown_cfg["dflash_config"]["target_layer_ids"] = taps
    else:
        grown_cfg["target_layer_ids"] = taps
    if isinstance(grown_cfg.get("layer_types"), list) and grown_cfg["layer_types"]:
        grown_cfg["layer_types"] = list(grown_cfg["layer_types"]) + [grown_cfg["layer_types"][-1]] * (layers - old)
    grown = type(draft)(grown_cfg)
    src = draft.state_dict()
    state = grown.state_dict()
    for k in state:
        if k.startswith("layers."):
            i, rest = k.split(".", 2)[1:]
            if int(i) >= old:
                state[k] = torch.zeros_like(state[k]) if rest in ZEROED_IN_NEW_LAYERS else src[f"layers.{old - 1}.{rest}"]
                continue
        state[k] = src[k]
    grown = _with_state(draft, grown, state)
    grown.grown_from = old  # the trainer tells the new layers from the trained weights (TrainSettings.trained_lr_mult)
    return grown, grown_cfg


def _with_state(draft: Any, grown: Any, state: dict[str, Any]) -> Any:
    """`grown` holding `state`, with `draft`'s copies of the target's tables, in `draft`'s dtype."""
    grown.load_state_dict(state)
    for name in ("embed_tokens_weight", "lm_head_weight"):
        if getattr(draft, name, None) is not None:
            setattr(grown, name, getattr(draft, name))
    return grown.to(next(draft.parameters()).dtype)


def new_layer_parameters(draft: Any) -> list[Any]:
    """The parameters of the layers `grow_layers` added (none for a draft that did not grow)."""
    old = getattr(draft, "grown_from", None)
    if old is None:
        return []
    return [p for name, p in draft.named_parameters()
            if name.startswith("layers.") and int(name.split(".", 2)[1]) >= old]


def grow_markov_rank(draft: Any, cfg: dict[str, Any], rank: int) -> tuple[Any, dict[str, Any]]:
    """A DSpark `draft` whose Markov head has `rank` columns: the trained ones kept, each new predecessor
    column drawn small and each new successor column zero, so the bias W1[prev] @ W2.T, the gate of a gated
    head and a Markov-reading confidence head are unchanged and the grown draft drafts exactly what the
    trained one did. The head costs nothing per step at any rank, where a layer costs a draft call's time,
    so a head sized to an older size budget is the cheaper thing to grow. Returns (draft, config)."""
    old = int(cfg.get("markov_rank", 0))
    if old == 0 or getattr(draft, "markov_head", None) is None:
        raise ValueError("the draft has no Markov head to grow (markov_rank 0)")
    if rank < old:
        raise ValueError(f"the Markov head has rank {old}; it can grow, not shrink to {rank}")
    grown_cfg = copy.deepcopy(cfg)
    grown_cfg["markov_rank"] = rank
    grown = type(draft)(grown_cfg)
    src = draft.state_dict()
    state = grown.state_dict()
    h = draft.cfg.hidden_size
    g = torch.Generator().manual_seed(rank)
    for k in state:
        new = state[k]
        old_t = src[k]
        if new.shape == old_t.shape:
            state[k] = old_t
            continue
        out = torch.zeros_like(new)
        if k == "markov_head.markov_w1.weight":  # [V, r]: new predecessor columns small, as a fresh head's
            out.normal_(0.0, rank ** -0.5, generator=g)
            out[:, :old] = old_t
        elif k == "markov_head.markov_w2.weight":  # [V, r]: new successor columns zero -> the bias is unchanged
            out[:, :old] = old_t
        elif k in ("markov_head.gate_proj.weight", "markov_head.gate_proj.bias"):
            # [r, H + r] over cat([h, W1[prev]]): the trained gates read nothing new; new gates start at one half
            if new.dim() == 2:
                out[:old, :h + old] = old_t
            else:
                out[:old] = old_t
        elif k == "confidence_head.proj.weight":  # [1, H + r]: the new Markov columns read as zero
            out[:, :old_t.shape[1]] = old_t
        else:
            raise ValueError(f"{k}: shape {tuple(old_t.shape)} -> {tuple(new.shape)} has no growth rule")
        state[k] = out
    grown = _with_state(draft, grown, state)
    if getattr(draft, "grown_from", None) is not None:
        grown.grown_from = draft.grown_from
    return grown, grown_cfg


def grow_to_shape(draft: Any, cfg: dict[str, Any], layers: int, rank: int) -> tuple[Any, dict[str, Any], str]:
    """`draft` grown to the recipe's `layers` and (a DSpark draft with a Markov head; 0 skips it) head `rank`.
    Returns (draft, config, what grew, "" if nothing); a ValueError names the recipe's keys."""
    grew = []
    try:
        if int(cfg["num_hidden_layers"]) != layers:
            draft, cfg = grow_layers(draft, cfg, layers)
            grew.append(f"grown to {layers} layers (the new ones start as identities)")
        if rank and 0 < int(cfg.get("markov_rank", 0)) != rank:
            draft, cfg = grow_markov_rank(draft, cfg, rank)
            grew.append(f"its Markov head grown to rank {rank} (the new columns start at zero)")
    except ValueError as e:
        keys = f"layers is {layers}" + (f", markov_rank {rank}" if rank else "")
        raise ValueError(f"{e} (the recipe's [draft] {keys})") from None
    return draft, cfg, ", ".join(grew)
