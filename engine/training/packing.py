"""Packed block batches of self-distillation (spec §1.6): the target's tapped features, random anchors
inside the target's answers, and many draft blocks packed into one sequence with the DFlash block
mask (a block sees the target features strictly before its anchor and its own block, both ways).

Shared by the trainer (engine/training/trainer.py) and the held-out evaluation (evaluate.py).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def tapped_hidden(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """Concat the OUTPUT of each tapped decoder layer L = HF hidden_states[L+1] (spec §1.2).

    The last HF entry is the post-final-norm tensor, so tapping the last layer is refused.
    """
    n_layers = len(hidden_states) - 1
    for i in layer_ids:
        if not 0 <= i < n_layers - 1:
            raise ValueError(f"cannot tap layer {i} of a {n_layers}-layer target (valid: 0..{n_layers - 2})")
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def target_weights(target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding [V,H], lm_head [V,H]) of a HF causal LM, detached: the draft shares and freezes them."""
    emb = target.get_input_embeddings().weight.detach()
    head = target.get_output_embeddings().weight.detach()
    return emb, head


def sample_anchors(prompt_lens: torch.Tensor, gen_lens: torch.Tensor, block_size: int, num_anchors: int,
                          gen: torch.Generator) -> torch.Tensor:
    """Anchors a in [P, P+G-B] per row (P prompt length, G answer length >= B): the anchor is an
    answer token (as at inference, where the target produced it) and its B-1 labels lie in the
    answer. Returns [N, A] (with repetition)."""
    lo = prompt_lens.cpu()
    span = (gen_lens.cpu() - block_size + 1).clamp(min=1)
    u = torch.rand(lo.shape[0], num_anchors, generator=gen)
    return lo[:, None] + (u * span[:, None]).long().clamp(max=span[:, None] - 1)


def packed_inputs(
    tokens: torch.Tensor,
    features: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    embed: torch.Tensor,
    block_lens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Build forward_packed inputs, labels and label weights for blocks [x_a, MASK...] at `anchors`.

    `block_lens` [N, A] (rows incl. the anchor, 2..block_size) trains shorter blocks too, as the
    runtime drafts them when num_assistant_tokens < block_size - 1: rows past a block's length are
    hidden from its other rows and carry no loss.
    """
    b, seq_len = tokens.shape
    n_anchor = anchors.shape[1]
    dev = tokens.device
    offs = torch.arange(block_size, device=dev)
    blk_pos = anchors[:, :, None] + offs  # [B, A, Q]
    blk_tok = torch.full_like(blk_pos, mask_token_id)
    blk_tok[:, :, 0] = tokens.gather(1, anchors)
    labels = tokens.gather(1, blk_pos[:, :, 1:].reshape(b, -1)).view(b, n_anchor, block_size - 1)
    q_tot = n_anchor * block_size
    q_anchor = anchors[:, :, None].expand(-1, -1, block_size).reshape(b, q_tot)  # anchor of each query
    ctx_ok = torch.arange(seq_len, device=dev)[None, None, :] < q_anchor[:, :, None]  # context strictly before anchor
    blk_id = torch.arange(q_tot, device=dev) // block_size
    blk_ok = (blk_id[:, None] == blk_id[None, :]).expand(b, -1, -1)  # own block, both directions
    weights = torch.ones(b, n_anchor, block_size - 1, device=dev)
    if block_lens is not None:
        live = offs[None, None, :] < block_lens[:, :, None]  # [B, A, Q]
        blk_ok = blk_ok & live.reshape(b, 1, q_tot)
        weights = live[:, :, 1:].float()
    return {
        "noise_embedding": embed[blk_tok.view(b, q_tot)],
        "target_hidden": features,
        "block_position_ids": blk_pos.view(b, q_tot),
        "context_position_ids": torch.arange(seq_len, device=dev)[None].expand(b, -1),
        "allowed": torch.cat([ctx_ok, blk_ok], dim=2)[:, None],
        "labels": labels,
        "label_weights": weights,
    }


def offset0_blocks(tokens: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor, block_size: int,
                   mask_token_id: int, embed: torch.Tensor, block_lens: torch.Tensor | None = None
                   ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed blocks in the "sample from anchor" layout (DSpark, offset 0): row k of the block at
    anchor a predicts x_{a+k+1}. Returns (forward inputs, labels [b, A, B], teacher-forced
    predecessors [b, A, B] (the anchor for row 0), row offsets [B])."""
    bsz, n_anchor = anchors.shape
    batch = packed_inputs(tokens, features, anchors, block_size, mask_token_id, embed, block_lens)
    batch.pop("labels"), batch.pop("label_weights")
    offs = torch.arange(block_size, device=tokens.device)
    labels = tokens.gather(1, (anchors[:, :, None] + 1 + offs).view(bsz, -1)).view(bsz, n_anchor, block_size)
    prev = torch.cat([tokens.gather(1, anchors)[:, :, None], labels[:, :, :-1]], dim=-1)
    return batch, labels, prev, offs
