"""The per-variant losses of one packed batch (spec §1.6, §3.5, §4.2), and what the trainer needs to
know about each variant's block layout.

- DFlash v1 (offset 1): rows 1..B-1 of the block [anchor, MASK x (B-1)] predict anchor+1..anchor+B-1;
  position-decayed CE, weight exp(-(k-1)/gamma).
- DSpark (offset 0, "sample from anchor"): row k predicts anchor+k+1; per live row, decay exp(-k/gamma),
  ``CE(U + B, y) + tv * 2 (1 - p(y)) + unary * CE(U, y) + confidence * BCE(conf, p(y))``. The Markov
  head is teacher-forced (the token before row k is the answer's, the anchor for row 0); for a greedy
  (one-hot) target DSpark's distribution distance is 2 (1 - p(y)); the confidence head reads detached
  features, so its BCE never pulls the backbone.
- DFlash v2 (offset 1): decayed CE of the transformed unary logits plus the selector's CE over the
  top-K candidates with the ground-truth predecessor (rows whose label is outside the top-K left out);
  blocks are packed back to back, so the grouped convolutions see each block on its own.

The target's embedding and lm_head are shared and frozen. Rows past a block's length (`block_lens`,
rows incl. the anchor) are hidden from the block's other rows and carry no loss. With a `SubVocab`
the logits are the sub-vocabulary's alone, as the exported draft scores them; a label outside it
carries no CE (the draft can never propose it) and a confidence target of 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.drafts.dflash2 import DFlash2Draft
from engine.drafts.dflash_v1 import DFlashV1Draft
from engine.drafts.dspark import DSparkDraft
from engine.training.packing import offset0_blocks, packed_inputs

Parts = dict[str, torch.Tensor]


@dataclass
class SubVocab:
    """The draft's sub-vocabulary (engine/models/draft_vocab.py) as training and the held-out walk use it.

    The exported draft scores only these tokens, so its logits are trained and measured over them
    alone: on a large vocabulary the projection and its activations shrink by the ratio of the two
    sizes, and they were what bounded the features (and so the rows) that fit beside them on one GPU."""

    ids: torch.Tensor  # [S] sorted token ids
    index: torch.Tensor  # [V] position of each id in `ids`, -1 outside
    lm_head: torch.Tensor  # [S, H] the target's lm_head rows of `ids`

    @classmethod
    def of(cls, ids: torch.Tensor, lm_head: torch.Tensor) -> "SubVocab":
        ids = torch.as_tensor(ids, dtype=torch.long, device=lm_head.device).sort().values
        index = torch.full((lm_head.shape[0],), -1, dtype=torch.long, device=lm_head.device)
        index[ids] = torch.arange(ids.numel(), device=lm_head.device)
        return cls(ids, index, lm_head[ids].contiguous())

    def labels(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions in the sub-vocabulary, 0 for a label outside it; 1.0 inside / 0.0 outside)."""
        pos = self.index[labels]
        return pos.clamp(min=0), (pos >= 0).float()


def _head(lm_head: torch.Tensor, vocab: SubVocab | None) -> torch.Tensor:
    return lm_head if vocab is None else vocab.lm_head


def _labels(labels: torch.Tensor, vocab: SubVocab | None) -> tuple[torch.Tensor, torch.Tensor]:
    return (labels, torch.ones_like(labels, dtype=torch.float32)) if vocab is None else vocab.labels(labels)


@dataclass
class LossWeights:
    gamma: float = 4.0
    tv: float = 0.5  # DSpark's distribution distance (one-hot target: 2 (1 - p(y)))
    unary: float = 0.3  # DSpark: CE of the backbone's own logits U (no-head walk, Top-K candidate quality)
    confidence: float = 1.0  # DSpark confidence head
    selector: float = 1.0  # DFlash v2 selector CE


def label_span(draft: DFlashV1Draft) -> int:
    """How far past the anchor a full block's labels reach (offset 0: B tokens, offset 1: B-1)."""
    return draft.cfg.block_size + (1 if isinstance(draft, DSparkDraft) else 0)


def shortest_block(draft: DFlashV1Draft) -> int:
    """The shortest block (rows incl. the anchor) that still drafts one candidate."""
    return 1 if isinstance(draft, DSparkDraft) else 2


def head_parameters(draft: DFlashV1Draft) -> list[torch.nn.Parameter]:
    """The fresh heads (trained at head_lr_mult): DSpark's Markov and confidence heads, DFlash v2's
    selector; a v1 draft has none."""
    if isinstance(draft, DFlash2Draft):
        return list(draft.candidate_selector.parameters())
    if isinstance(draft, DSparkDraft):
        mods = [m for m in (draft.markov_head, draft.confidence_head) if m is not None]
        return [p for m in mods for p in m.parameters()]
    return []


def _wmean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (values * weights).sum() / weights.sum().clamp(min=1e-8)


def dflash_v1_loss(draft: DFlashV1Draft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                   embed: torch.Tensor, lm_head: torch.Tensor, w: LossWeights,
                   block_lens: torch.Tensor | None = None, vocab: SubVocab | None = None) -> tuple[torch.Tensor, Parts]:
    c = draft.cfg
    batch = packed_inputs(tokens, feats, anchors, c.block_size, c.mask_token_id, embed, block_lens)
    labels, weights = batch.pop("labels"), batch.pop("label_weights")
    labels, inside = _labels(labels, vocab)
    b, n_anchor, q_m1 = labels.shape
    h = draft.forward_packed(**batch).view(b, n_anchor, q_m1 + 1, -1)[:, :, 1:]
    ce = F.cross_entropy((h @ _head(lm_head, vocab).T).float().flatten(0, 2), labels.flatten(),
                         reduction="none").view_as(labels)
    decay = torch.exp(-torch.arange(q_m1, device=h.device, dtype=torch.float32) / w.gamma) * weights * inside
    loss = _wmean(ce, decay)
    return loss, {"ce": loss.detach()}


def dspark_loss(draft: DSparkDraft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                embed: torch.Tensor, lm_head: torch.Tensor, w: LossWeights,
                block_lens: torch.Tensor | None = None, vocab: SubVocab | None = None) -> tuple[torch.Tensor, Parts]:
    """Only live rows go through the lm_head (the vocabulary projection is the large part)."""
    bsz, n_anchor = anchors.shape
    blk = draft.cfg.block_size
    batch, labels, prev, offs = offset0_blocks(tokens, feats, anchors, blk, draft.cfg.mask_token_id, embed,
                                               block_lens)
    h = draft.forward_packed(**batch).view(bsz, n_anchor, blk, -1)
    decay = torch.exp(-offs.float() / w.gamma).expand(bsz, n_anchor, blk)
    if block_lens is not None:
        live = offs[None, None, :] < block_lens[:, :, None]
        h, labels, prev, decay = h[live], labels[live], prev[live], decay[live]
    else:
        h, labels, prev, decay = h.flatten(0, 2), labels.flatten(), prev.flatten(), decay.flatten()
    labels, inside = _labels(labels, vocab)
    decay = decay * inside
    u = draft.unary_logits(h, _head(lm_head, vocab))
    logits = u + draft.dense_bias(prev, h, None if vocab is None else vocab.ids) if draft.markov_head is not None else u
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    norm = decay.sum().clamp(min=1e-8)
    parts = {"ce": (ce * decay).sum() / norm}
    loss = parts["ce"]
    p_label = torch.exp(-ce) * inside  # a token outside the sub-vocabulary is never proposed, so never accepted
    if w.tv:
        parts["tv"] = (2 * (1 - p_label) * decay).sum() / norm
        loss = loss + w.tv * parts["tv"]
    if w.unary and draft.markov_head is not None:
        parts["ce_unary"] = (F.cross_entropy(u.float(), labels, reduction="none") * decay).sum() / norm
        loss = loss + w.unary * parts["ce_unary"]
    if draft.confidence_head is not None and w.confidence:
        feats_c = h.detach()
        if draft.dspark.confidence_head_with_markov:
            feats_c = torch.cat([feats_c, draft.markov_head.prev_embeddings(prev).detach().to(h.dtype)], dim=-1)
        conf_logit = draft.confidence_head(feats_c).float()
        parts["conf"] = F.binary_cross_entropy_with_logits(conf_logit, p_label.detach())
        loss = loss + w.confidence * parts["conf"]
    return loss, {k: v.detach() for k, v in parts.items()}


def dflash2_loss(draft: DFlash2Draft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                 embed: torch.Tensor, lm_head: torch.Tensor, w: LossWeights,
                 block_lens: torch.Tensor | None = None, vocab: SubVocab | None = None) -> tuple[torch.Tensor, Parts]:
    """Parts: "ce" (unary), "selector" (its CE over the covered rows), "covered" (share of rows whose
    label is in the top-K)."""
    c = draft.cfg
    bsz, n_anchor = anchors.shape
    blk = c.block_size
    batch = packed_inputs(tokens, feats, anchors, blk, c.mask_token_id, embed, block_lens)
    labels, weights = batch.pop("labels"), batch.pop("label_weights")  # [b, A, B-1]
    batch["noise_embedding"] = draft.scale_embeddings(batch["noise_embedding"])
    h = draft.forward_packed(**batch, block_len=blk).view(bsz, n_anchor, blk, -1)[:, :, 1:]
    pos, inside = _labels(labels, vocab)
    unary = draft.unary_logits(h, _head(lm_head, vocab)).float()
    ce = F.cross_entropy(unary.flatten(0, 2), pos.flatten(), reduction="none").view_as(labels)
    decay = torch.exp(-torch.arange(blk - 1, device=tokens.device, dtype=torch.float32) / w.gamma) * weights * inside
    ce_loss = _wmean(ce, decay)
    cand = unary.detach().topk(draft.v2.selector_top_k, dim=-1).indices  # [b, A, B-1, K] (sub-vocabulary positions)
    prev = torch.cat([tokens.gather(1, anchors)[:, :, None], labels[:, :, :-1]], dim=-1)
    cand_ids = cand if vocab is None else vocab.ids[cand]
    energy = unary.gather(-1, cand) + draft.candidate_selector.transition(prev, cand_ids, h).float()
    hit = cand_ids == labels[..., None]
    covered = hit.any(-1).float()
    sel = F.cross_entropy(energy.flatten(0, 2), hit.float().argmax(-1).flatten(), reduction="none").view_as(labels)
    sel_loss = _wmean(sel, decay * covered)
    parts = {"ce": ce_loss.detach(), "selector": sel_loss.detach(), "covered": _wmean(covered, decay).detach()}
    return ce_loss + w.selector * sel_loss, parts


def variant_loss(draft: DFlashV1Draft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                 embed: torch.Tensor, lm_head: torch.Tensor, w: LossWeights,
                 block_lens: torch.Tensor | None = None, vocab: SubVocab | None = None) -> tuple[torch.Tensor, Parts]:
    """The loss of `draft`'s variant on blocks at `anchors` [b, A]; returns (loss, detached parts)."""
    if isinstance(draft, DFlash2Draft):
        return dflash2_loss(draft, tokens, feats, anchors, embed, lm_head, w, block_lens, vocab)
    if isinstance(draft, DSparkDraft):
        return dspark_loss(draft, tokens, feats, anchors, embed, lm_head, w, block_lens, vocab)
    return dflash_v1_loss(draft, tokens, feats, anchors, embed, lm_head, w, block_lens, vocab)
