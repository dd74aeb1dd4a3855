"""Self-distillation training of DSpark and DFlash v2 drafts (spec §3.5, §4.2), in torch.

Same data and packing as the DFlash v1 trainer (engine/training/dflash_train.py: the target's own
greedy continuations, random anchors, blocks packed with the DFlash block mask); what differs is the
layout and the heads:

- DSpark ("sample from anchor", offset 0): block row k predicts the token k+1 places after the
  anchor, so a block of B rows has B labels. The Markov head is trained teacher-forced (the token
  before row k is the ground truth one, the anchor for row 0): CE on ``U + B(prev)`` with position
  decay. A confidence head learns, by BCE, the probability its row's token is accepted: for a
  one-hot (greedy) target that is ``1 - TV(p_draft, p_target) = p_draft(label)`` (spec §3.4).
- DFlash v2 (z-lab layout, offset 1, like v1): CE on the transformed unary logits
  ``U = softcap(output_multiplier * lm_head(h))`` of rows 1..B-1, plus the selector's CE over the
  top-K candidates of each row with the ground-truth predecessor (positions whose label is not in
  the top-K are left out, spec §4.2). Blocks are packed back to back, so the grouped convolutions
  see each block on its own.

The target's embedding and lm_head are shared and frozen. Nothing here knows about tiny models;
every tensor follows `cfg.device`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from engine.export.dflash2 import DFlash2Draft
from engine.export.dflash2 import reference_step as dflash2_step
from engine.export.dspark import DSparkDraft
from engine.export.dspark import reference_step as dspark_step
from engine.training.dflash_train import (
    AcceptanceStats,
    DistillData,
    TrainConfig,
    TrainResult,
    _lr_factor,
    offset0_blocks,
    packed_inputs,
    sample_anchors,
    tapped_hidden,
    target_weights,
)

CONFIDENCE_LOSS_WEIGHT = 1.0
SELECTOR_LOSS_WEIGHT = 1.0

Draft = DSparkDraft | DFlash2Draft


def _decay(n: int, gamma: float, device: torch.device) -> torch.Tensor:
    return torch.exp(-torch.arange(n, device=device, dtype=torch.float32) / gamma)


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights).sum() / weights.sum().clamp(min=1e-8)


# --------------------------------------------------------------------------------------------
# Losses of one packed batch
# --------------------------------------------------------------------------------------------
def dspark_loss(draft: DSparkDraft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                embed: torch.Tensor, lm_head: torch.Tensor, gamma: float,
                block_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Offset-0 blocks at `anchors` [b, A]: rows 0..B-1 predict tokens anchor+1..anchor+B."""
    bsz, n_anchor = anchors.shape
    blk = draft.cfg.block_size
    dev = tokens.device
    batch, labels, prev, offs = offset0_blocks(tokens, feats, anchors, blk, draft.cfg.mask_token_id, embed,
                                               block_lens)
    live = torch.ones_like(labels, dtype=torch.float32)
    if block_lens is not None:
        live = (offs[None, None, :] < block_lens[:, :, None]).float()
    h = draft.forward_packed(**batch).view(bsz, n_anchor, blk, -1)
    logits = draft.unary_logits(h, lm_head)
    if draft.markov_head is not None:
        logits = logits + draft.dense_bias(prev, h)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(labels)
    weights = _decay(blk, gamma, dev) * live
    loss = _weighted_mean(ce, weights)
    if draft.confidence_head is not None:
        feats_c = h
        if draft.dspark.confidence_head_with_markov:
            feats_c = torch.cat([h, draft.markov_head.prev_embeddings(prev)], dim=-1)
        conf_logit = draft.confidence_head(feats_c)
        target = torch.softmax(logits.detach(), -1).gather(-1, labels[..., None])[..., 0]
        bce = F.binary_cross_entropy_with_logits(conf_logit, target, reduction="none")
        loss = loss + CONFIDENCE_LOSS_WEIGHT * _weighted_mean(bce, live)
    return loss


def dflash2_loss(draft: DFlash2Draft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                 embed: torch.Tensor, lm_head: torch.Tensor, gamma: float,
                 block_lens: torch.Tensor | None = None, parts: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Offset-1 blocks: rows 1..B-1 predict anchor+1..anchor+B-1; base CE + selector CE.
    `parts`, when given, receives the detached terms: "ce" (unary), "selector" (its CE over the
    covered rows) and "covered" (the weighted share of rows whose label is in the top-K)."""
    c = draft.cfg
    bsz, n_anchor = anchors.shape
    blk = c.block_size
    batch = packed_inputs(tokens, feats, anchors, blk, c.mask_token_id, embed, block_lens)
    labels, weights = batch.pop("labels"), batch.pop("label_weights")  # [b, A, B-1]
    batch["noise_embedding"] = draft.scale_embeddings(batch["noise_embedding"])
    h = draft.forward_packed(**batch, block_len=blk).view(bsz, n_anchor, blk, -1)[:, :, 1:]
    unary = draft.unary_logits(h, lm_head)
    ce = F.cross_entropy(unary.flatten(0, 2), labels.flatten(), reduction="none").view_as(labels)
    w = _decay(blk - 1, gamma, tokens.device) * weights
    loss = _weighted_mean(ce, w)
    k = draft.v2.selector_top_k
    cand = unary.detach().topk(k, dim=-1).indices  # [b, A, B-1, K]
    prev = torch.cat([tokens.gather(1, anchors)[:, :, None], labels[:, :, :-1]], dim=-1)
    energy = unary.gather(-1, cand) + draft.candidate_selector.transition(prev, cand, h)
    hit = cand == labels[..., None]
    covered = hit.any(-1).float()
    sel = F.cross_entropy(energy.flatten(0, 2), hit.float().argmax(-1).flatten(), reduction="none").view_as(labels)
    sel_loss = _weighted_mean(sel, w * covered)
    if parts is not None:
        parts.update(ce=loss.detach(), selector=sel_loss.detach(), covered=_weighted_mean(covered, w).detach())
    return loss + SELECTOR_LOSS_WEIGHT * sel_loss


# --------------------------------------------------------------------------------------------
# Training loop
# --------------------------------------------------------------------------------------------
def train_variant_draft(
    draft: Draft,
    data: DistillData,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    cfg: TrainConfig = TrainConfig(),
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train a DSpark or DFlash v2 draft in place on `data`; embed / lm_head are the target's (frozen).

    cfg.min_block_size (rows incl. the anchor, as for v1) also trains shorter blocks, as the engine
    drafts them when asked for fewer candidates than the block holds.
    """
    dev = torch.device(cfg.device)
    draft.to(dev).train()
    embed, lm_head = embed.to(dev).detach(), lm_head.to(dev).detach()
    tokens, feats = data.tokens.to(dev), data.features.to(dev)
    dspark = isinstance(draft, DSparkDraft)
    blk = draft.cfg.block_size
    span = blk + 1 if dspark else blk  # an offset-0 block's labels reach one token further
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg.warmup, cfg.steps))
    loss_fn = dspark_loss if dspark else dflash2_loss
    t0 = time.perf_counter()
    losses: list[float] = []
    step = 0
    for step in range(1, cfg.steps + 1):
        rows = torch.randint(0, tokens.shape[0], (min(cfg.batch_size, tokens.shape[0]),), generator=gen)
        anchors = sample_anchors(data.prompt_lens[rows], data.new_tokens, span, cfg.num_anchors, gen).to(dev)
        lens = None
        if cfg.min_block_size is not None:
            lo = max(1, cfg.min_block_size - 1) if dspark else max(2, cfg.min_block_size)
            lens = torch.randint(lo, blk + 1, anchors.shape, generator=gen).to(dev)
        r = rows.to(dev)
        loss = loss_fn(draft, tokens[r], feats[r], anchors, embed, lm_head, cfg.gamma, lens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
        if cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s:
            break
    draft.eval()
    return TrainResult(step, time.perf_counter() - t0, losses)


# --------------------------------------------------------------------------------------------
# Reference decode with the torch walks, to measure acceptance without OpenVINO
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def simulate_variant_acceptance(
    target: Any,
    draft: Draft,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 48,
    mode: str = "topk",
    top_k: int | None = None,
    num_candidates: int | None = None,
) -> AcceptanceStats:
    """Greedy speculative decode of each prompt with the draft's reference walk and the HF target
    (full recompute, the draft keeps its context K/V across steps as the IR's state does)."""
    step_fn = dspark_step if isinstance(draft, DSparkDraft) else dflash2_step
    layer_ids = draft.cfg.target_layer_ids
    n_cand = num_candidates or (draft.cfg.block_size - draft.candidate_offset)
    embed, lm_head = target_weights(target)
    draft.eval()
    stats = AcceptanceStats(0, 0, 0, 0)
    for prompt in prompts:
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        out = target(input_ids=ids, output_hidden_states=True)
        ctx = tapped_hidden(out.hidden_states, layer_ids)[0]
        anchor = int(out.logits[0, -1].argmax())
        past, produced = None, 1
        while produced < max_new_tokens:
            res = step_fn(draft, embed, lm_head, anchor, ctx, n_cand, mode, top_k, past)
            past = res.past_key_values
            cand = torch.from_numpy(res.tokens)
            seq = torch.cat([ids, torch.tensor([[anchor]]), cand[None]], dim=1)
            out = target(input_ids=seq, output_hidden_states=True)
            start = ids.shape[1]
            post = out.logits[0, start:].argmax(-1)
            a = int((cand == post[:-1]).long().cumprod(0).sum())
            stats.rounds += 1
            stats.accepted_drafts += a
            stats.drafted += n_cand
            stats.tokens += a + 1
            ids = seq[:, : start + a + 1]
            ctx = tapped_hidden(out.hidden_states, layer_ids)[0, start: start + a + 1]
            anchor = int(post[a])
            produced += a + 1
    return stats
