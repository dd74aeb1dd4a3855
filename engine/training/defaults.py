"""A draft's shape from the target alone, where the recipe leaves it open, and the checks that refuse
a target the recipe cannot serve (before any work starts).

Taps: five layers spread from layer 1 to L-3 (SmolLM2's 30 layers give [1, 8, 15, 22, 27], the
shipped drafts'), never the last layer (its HF hidden state is after the final norm). Width, heads
and MLP are the target's (the draft shares its embedding and lm_head). The size budget is a tenth of
the target's fp16 weights, at least 8 MB; the layers and the head rank are the largest that fit it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.training.recipe import INT8_SHIP, DraftSettings, RecipeError
from engine.training.target_loader import MASK_CANDIDATES, TargetInfo

MIN_BUDGET_MB = 8.0
MAX_RANK = 64


class TargetError(ValueError):
    """A target the recipe cannot serve; the message says why and what to do."""


def default_taps(num_layers: int, count: int = 5) -> list[int]:
    hi = num_layers - 3 if num_layers > 4 else num_layers - 2
    count = max(1, min(count, hi))
    if count == 1:
        return [max(0, hi // 2)]
    return sorted({round(1 + i * (hi - 1) / (count - 1)) for i in range(count)})


def backbone_params(cfg: dict[str, Any], layers: int, taps: int) -> int:
    h, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    d = int(cfg.get("head_dim") or h // heads)
    per_layer = h * heads * d * 2 + 2 * h * kv * d + 3 * h * inter + 2 * h + 2 * d
    return taps * h * h + h + layers * per_layer + h


@dataclass
class DraftShape:
    layers: int
    block_size: int
    taps: list[int]
    mask_id: int
    rank: int
    budget_mb: float
    estimated_mb: float


def draft_shape(variant: str, d: DraftSettings, info: TargetInfo, tokenizer_vocab: dict[str, int] | None) -> DraftShape:
    """The draft's shape (recipe first, then defaults); TargetError / RecipeError when it cannot be."""
    if not info.chat_template:
        raise TargetError(f"{info.source} has no chat template: the training prompts are chat turns and the draft "
                          "must see them as the app sends them. Use the instruct/chat version of the model, or add a "
                          "chat_template to its tokenizer_config.json.")
    n = info.num_layers
    taps = list(d.taps) or default_taps(n)
    bad = [t for t in taps if not 0 <= int(t) <= n - 2]
    if bad:
        raise TargetError(f"taps {bad} are out of range for {info.source}: a {n}-layer target can be tapped at layers "
                          f"0..{n - 2} (the last layer's output is after the final norm)")
    mask = info.mask_id
    if d.mask_token:
        if not tokenizer_vocab or d.mask_token not in tokenizer_vocab:
            raise TargetError(f"the recipe's mask_token {d.mask_token!r} is not in {info.source}'s vocabulary")
        mask = int(tokenizer_vocab[d.mask_token])
    if mask is None:
        raise TargetError(f"{info.source} has none of the tokens a draft can use as MASK ({', '.join(MASK_CANDIDATES)}): "
                          "name an unused special token of its vocabulary as [draft] mask_token in a recipe")
    budget = d.max_mb or max(MIN_BUDGET_MB, info.num_params * 2 / 1e6 / 10)
    vocab, h = info.vocab_size, info.hidden_size
    head_bytes_per_rank = 0
    if variant == "dspark" and d.head != "none":
        head_bytes_per_rank = 2 * 2 * vocab  # W1, W2 [V, r] in fp16
    elif variant == "dflash_v2":
        head_bytes_per_rank = 2 * 2 * vocab + 2 * h  # A, B [V, r] + W_h [r, H]
    per_param = 1 if d.ship_dtype == INT8_SHIP else 2  # bytes of a backbone weight as shipped
    layers = d.layers
    if not layers:
        layers = 2 if backbone_params(info.config, 2, len(taps)) * per_param / 1e6 + head_bytes_per_rank * 4 / 1e6 <= budget else 1
    base_mb = backbone_params(info.config, layers, len(taps)) * per_param / 1e6
    if variant == "dflash_v2":
        base_mb += layers * 2 * (2 * d.conv_kernel_size * h + 2 * d.conv_kernel_size * (h // d.conv_group_size) * h) * 2 / 1e6
    rank = d.markov_rank
    if head_bytes_per_rank and not rank:
        rank = int(min(MAX_RANK, (budget - base_mb) * 1e6 // head_bytes_per_rank))
        if rank < 1:
            raise TargetError(f"a {layers}-layer draft of {info.source} takes {base_mb:.1f} MB, over the size budget "
                              f"of {budget:.1f} MB with no room for its head: raise [draft] max_mb or lower layers")
    est = base_mb + rank * head_bytes_per_rank / 1e6
    if d.ship_dtype != "float32" and est > budget:
        raise RecipeError(f"the draft would take {est:.2f} MB, over [draft] max_mb {budget:.2f}: lower markov_rank or "
                          "layers, or raise max_mb")
    return DraftShape(layers, d.block_size, [int(t) for t in taps], int(mask), int(rank), round(budget, 2),
                      round(est, 2))
