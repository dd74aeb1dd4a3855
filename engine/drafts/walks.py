"""Greedy reference walks over a draft's unary logits (docs/draft-contract.md), in torch.

The engine's parity tests compare its Top-K scorer, dense walk and selector walk against these
(engine/drafts/dspark.py, dflash2.py `reference_walk`); the trainer's held-out evaluation runs their
batched form (engine/training/evaluate.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from engine.drafts.dflash_v1 import DFlashV1Draft, KVCache

WALK_MODES = ("none", "topk", "dense")


@dataclass
class WalkResult:
    tokens: np.ndarray  # [N] int64: the drafted candidates
    rows: torch.Tensor  # [N, H]: the backbone's candidate rows (what the head IRs read)
    unary: torch.Tensor  # [N, V]: U per row (v2: scaled and soft-capped)
    confidence: np.ndarray | None  # [N] (DSpark with a confidence head), given the walked predecessors
    past_key_values: KVCache  # context K/V after this call (feed to the next call)


def as_tensor(x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return x.detach().to(dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x), dtype=dtype)


def lattice_walk(
    unary: torch.Tensor,
    anchor: int,
    mode: str,
    top_k: int,
    edge_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None,
    dense_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    rows: torch.Tensor,
) -> list[int]:
    """The contract's greedy walks over unary logits U [N, V] (docs/draft-contract.md, engine/drafting)."""
    n = unary.shape[0]
    if mode == "none" or (edge_fn is None and dense_fn is None):
        return [int(t) for t in unary.argmax(-1)]
    if mode == "topk":
        if top_k < 1:
            raise ValueError("mode 'topk' needs top_k >= 1")
        vals, cand = torch.topk(unary, top_k, dim=-1)  # [N, K], best first
        pred = torch.empty_like(cand)
        pred[0] = anchor
        pred[1:] = cand[:-1]
        energy = vals[:, None, :] + edge_fn(pred, cand, rows)  # [N, K, K]
        out, prev = [], 0  # row 0: every predecessor is the anchor
        for p in range(n):
            j = int(energy[p, prev].argmax())
            out.append(int(cand[p, j]))
            prev = j
        return out
    if mode == "dense":
        if dense_fn is None:
            raise ValueError("this draft has no dense Markov walk (DFlash v2 refuses markov_head_top_k=0)")
        out, prev = [], anchor
        for p in range(n):
            logits = unary[p] + dense_fn(torch.tensor([prev]), rows[p: p + 1])[0]
            prev = int(logits.argmax())
            out.append(prev)
        return out
    raise ValueError(f"mode must be one of {', '.join(WALK_MODES)}, got {mode!r}")


def run_backbone(draft: DFlashV1Draft, embeds: torch.Tensor, context: Any, past_key_values: KVCache | None,
                 start_position: int | None) -> tuple[torch.Tensor, KVCache]:
    """One draft call for one sequence: embeds [L, H], context rows [T, n*H] -> (h [L, H], K/V)."""
    ctx = as_tensor(context).reshape(-1, len(draft.cfg.target_layer_ids) * draft.cfg.hidden_size)
    past_len = past_key_values[0][0].shape[2] if past_key_values else 0
    start = past_len if start_position is None else int(start_position)
    pos = torch.arange(start, start + ctx.shape[0] + embeds.shape[0])[None]
    h, kv = draft(embeds[None], ctx[None], pos, past_key_values)
    return h[0], kv


def reference_rows(draft: Any, embed: Any, lm_head: Any, anchor: int, context: Any, num_candidates: int,
                   offset: int, past_key_values: KVCache | None, start_position: int | None,
                   scale: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
    """(candidate rows [N, H], their unary logits U [N, V], K/V) of one reference draft step: the block
    [anchor, MASK x (N - 1 + offset)] through the backbone, candidate rows from `offset` on (DSpark 0,
    DFlash v2 1). embed / lm_head: the target's [V, H] tables (None = the checkpoint's copies); `scale`
    maps the block's embeddings first (DFlash v2's input scale)."""
    draft.eval()
    e = as_tensor(embed if embed is not None else draft.embed_tokens_weight)
    w = as_tensor(lm_head if lm_head is not None else draft.lm_head_weight)
    n = int(num_candidates)
    if n < 1:
        raise ValueError("num_candidates must be >= 1")
    embeds = e[torch.tensor([int(anchor)] + [draft.cfg.mask_token_id] * (n - 1 + offset))]
    h, kv = run_backbone(draft, scale(embeds) if scale is not None else embeds, context, past_key_values,
                         start_position)
    rows = h[offset:]
    return rows, draft.unary_logits(rows, w), kv
