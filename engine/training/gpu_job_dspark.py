"""Train a DSpark draft (DFlash backbone + Markov head, spec §3), or with `--variant dflash_v2` a
DFlash v2 draft (grouped dynamic convs + candidate selector, spec §4), for a target from its own answers.

The DSpark sibling of engine/training/gpu_job.py (DFlash v1): the same data path (the target's
greedy answers, its tapped features stored flat on the device, random anchors inside the answer,
blocks packed with the DFlash block mask), with DSpark's layout and heads:

* "sample from anchor" (candidate offset 0): the block [anchor, MASK x (B-1)] gives B candidate
  rows, row k predicting the token k+1 places after the anchor, so block 8 proposes up to 8
  candidates and n candidates need a block of n rows;
* a Markov head (vanilla or gated, rank r) adds W2 W1[x_{k-1}] (gated: modulated by h_k) to the
  unary logits U_k = lm_head(h_k); it is trained teacher-forced (x_{k-1} = the answer's token, the
  anchor for row 0), as DeepSpec does;
* an optional confidence head (BCE towards the probability its row's token is accepted).

Loss per live row, weighted by exp(-k/gamma) (k = 0 for the first candidate):
    CE(U + B, y) + tv_weight * ||softmax(U + B) - onehot(y)||_1 + unary_weight * CE(U, y)
  + conf_weight * BCE(confidence, p(y))   (the confidence head reads detached h and W1[x_{k-1}]).
For a greedy target the target distribution is one-hot, so DSpark's distance term is
2 (1 - p(y)) (no target logits needed); the unary CE keeps the backbone usable without the head
(the "no head" walk) and keeps the Top-K scorer's candidates (top-K of U) good.

The backbone can be warm-started from a DFlash v1 draft of the same shape (`--init-backbone`):
same tensor names, but v1's row k predicts anchor+k while DSpark's predicts anchor+k+1, so the
weights are an initialisation only (the attention over the target context carries over).

Held-out acceptance replays the greedy decode on the target's fixed answers for every anchor of
each held-out answer, with the engine's three walks (docs/draft-contract.md; the torch
references are engine/export/dspark.lattice_walk): "none" (argmax of U), "topk" (Top-K scorer,
K candidates of U per row re-ranked with the head's edge bias, greedy path) and "dense" (the dense
Markov walk), for n candidates each.

    python -m engine.training.gpu_job_dspark --target smollm2 --data-cache answers.jsonl.gz --out OUT \
        --init-backbone resources/drafts/smollm2-dflash-b8

DFlash v2 (`--variant dflash_v2`) shares everything above but the draft and its loss: the z-lab
layout (offset 1, as v1: the block [anchor, MASK x (B-1)] gives B-1 candidates from rows 1..B-1),
engine.export.dflash2.DFlash2Draft (a DFlash backbone with an identity-initialised grouped dynamic
conv around each sublayer, and the candidate selector of rank `--markov-rank` over the top
`--selector-top-k` unary candidates, starting as a no-op), trained with
engine.training.variant_train.dflash2_loss (decayed CE of U + the selector's CE with the
ground-truth predecessor). `--init-backbone` copies a v1 draft's fc, hidden_norm, first layers and
norm (the v2 draft may have fewer layers); v1 and v2 share the layout, so that start is the v1
draft truncated. Held-out acceptance runs the walks "none" (argmax of U) and "topk" (the selector
walk); the engine refuses the dense walk for v2.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F



def _stub_openvino_if_missing() -> None:
    """engine.export.dspark imports openvino for its IR export, which training never calls; the GPU
    machine has no openvino, so an empty stand-in lets the torch modules load there."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        import types

        ov = types.ModuleType("openvino")
        ov.opset13 = types.ModuleType("openvino.opset13")  # type: ignore[attr-defined]
        sys.modules["openvino"], sys.modules["openvino.opset13"] = ov, ov.opset13  # type: ignore[attr-defined]


_stub_openvino_if_missing()

from engine.export.dflash2 import (  # noqa: E402
    VARIANT_DFLASH_V2,
    DFlash2Draft,
    load_dflash2_checkpoint,
    random_dflash2_config,
    save_dflash2_checkpoint,
)
from engine.export.dflash_v1 import load_checkpoint as load_v1_checkpoint  # noqa: E402
from engine.export.dspark import DSparkDraft, load_dspark_checkpoint, random_dspark_config, save_dspark_checkpoint
from engine.export.markov_head import HEAD_GATED, HEAD_VANILLA
from engine.training import distributed as ddp
from engine.training.distributed import World
from engine.training.dflash_train import offset0_blocks, packed_inputs, target_weights
from engine.training.gpu_job import (
    FileLog,
    FlatData,
    Log,
    build_flat_data,
    generate_answers,
    rows_within_feature_budget,
    load_data_tokens,
    lr_factor,
    replay,
    sample_anchors_varlen,
    save_data_tokens,
    split_file,
)
from engine.training.target_loader import load_target
from engine.training.variant_train import dflash2_loss

WALKS = ("none", "topk", "dense")
BACKBONE_PREFIXES = ("fc.", "hidden_norm.", "layers.", "norm.")
V2_ONLY = ("attention_conv.", "mlp_conv.")  # DFlash v2's additions inside a layer (no v1 counterpart)
VARIANT_DSPARK = "dspark"
VARIANTS = (VARIANT_DSPARK, VARIANT_DFLASH_V2)

Draft = DSparkDraft | DFlash2Draft


def has_head(draft: Draft) -> bool:
    """A Markov head (DSpark) or the candidate selector (DFlash v2): the Top-K walk means something."""
    return isinstance(draft, DFlash2Draft) or draft.markov_head is not None


# --------------------------------------------------------------------------------------------
# The draft
# --------------------------------------------------------------------------------------------
def new_dspark_draft(target_config: dict[str, Any], layers: int, block_size: int, taps: Sequence[int], mask_id: int,
                     rank: int, head_type: str, confidence: bool, confidence_with_markov: bool,
                     num_anchors: int) -> tuple[DSparkDraft, dict[str, Any]]:
    """A fresh DSpark draft; a Markov head starts as a zero bias (W2 = 0, W1 ~ N(0, 1/r)), so that a
    warm-started backbone's logits are unchanged at step 0 and the head learns a residual."""
    cfg = random_dspark_config(target_config, layers, block_size, taps, mask_id, markov_rank=rank,
                               markov_head_type=head_type, enable_confidence_head=confidence,
                               confidence_head_with_markov=confidence_with_markov, num_anchors=num_anchors)
    draft = DSparkDraft(cfg)
    if draft.markov_head is not None:
        with torch.no_grad():
            draft.markov_head.markov_w1.weight.normal_(0.0, rank ** -0.5)
            draft.markov_head.markov_w2.weight.zero_()
    return draft, cfg


def new_dflash2_draft(target_config: dict[str, Any], layers: int, block_size: int, taps: Sequence[int], mask_id: int,
                      rank: int, top_k: int, conv_group_size: int = 16, conv_kernel_size: int = 2
                      ) -> tuple[DFlash2Draft, dict[str, Any]]:
    """A fresh DFlash v2 draft (identity convs, a selector that starts as a no-op: successor codebook
    0); the predecessor codebook ~ N(0, 1/r), as the DSpark head's W1, so the selector learns from step 1."""
    cfg = random_dflash2_config(target_config, layers, block_size, taps, mask_id, conv_group_size=conv_group_size,
                                conv_kernel_size=conv_kernel_size, selector_rank=rank, selector_top_k=top_k)
    draft = DFlash2Draft(cfg)
    with torch.no_grad():
        draft.candidate_selector.predecessor_codebook.normal_(0.0, rank ** -0.5)
    return draft, cfg


def init_backbone_from_v1(draft: Draft, v1_dir: Path) -> dict[str, Any]:
    """Copy a DFlash v1 draft's backbone (fc, hidden_norm, layers, norm) into `draft`: same tensor
    names and shapes are required (same target, taps, MLP width); a draft with fewer layers takes
    the first ones. For DSpark the block layout differs (v1 offset 1, DSpark offset 0), so this is an
    initialisation, not a conversion; DFlash v2 shares v1's layout (its convs start as identities)."""
    v1, v1_cfg = load_v1_checkpoint(Path(v1_dir))
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


def head_parameters(draft: Draft) -> list[torch.nn.Parameter]:
    """The fresh heads (trained at --head-lr-mult): DSpark's Markov + confidence heads, DFlash v2's
    selector (its convs start as identities inside the backbone and learn at the backbone's rate)."""
    if isinstance(draft, DFlash2Draft):
        return list(draft.candidate_selector.parameters())
    mods = [m for m in (draft.markov_head, draft.confidence_head) if m is not None]
    return [p for m in mods for p in m.parameters()]


# --------------------------------------------------------------------------------------------
# Loss of one packed batch
# --------------------------------------------------------------------------------------------
@dataclass
class LossWeights:
    gamma: float = 4.0
    tv: float = 0.5  # DSpark's distribution distance (one-hot target: 2 (1 - p(y)))
    unary: float = 0.3  # CE of the backbone's own logits U (no-head walk, Top-K candidate quality)
    confidence: float = 1.0


def dspark_batch_loss(draft: DSparkDraft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
                      embed: torch.Tensor, lm_head: torch.Tensor, w: LossWeights,
                      block_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Blocks [x_a, MASK x (B-1)] at `anchors` [b, A] (offset 0: row k predicts x_{a+k+1}); rows past
    a block's length (block_lens, 1..B) are hidden from its other rows and carry no loss. Only live
    rows go through the lm_head. Returns (loss, detached parts)."""
    bsz, n_anchor = anchors.shape
    blk = draft.cfg.block_size
    batch, labels, prev, offs = offset0_blocks(tokens, feats, anchors, blk, draft.cfg.mask_token_id, embed,
                                               block_lens)  # prev: teacher forcing
    h = draft.forward_packed(**batch).view(bsz, n_anchor, blk, -1)
    decay = torch.exp(-offs.float() / w.gamma).expand(bsz, n_anchor, blk)
    if block_lens is not None:
        live = offs[None, None, :] < block_lens[:, :, None]
        h, labels, prev, decay = h[live], labels[live], prev[live], decay[live]
    else:
        h, labels, prev, decay = h.flatten(0, 2), labels.flatten(), prev.flatten(), decay.flatten()
    u = draft.unary_logits(h, lm_head)
    logits = u + draft.dense_bias(prev, h) if draft.markov_head is not None else u
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    norm = decay.sum().clamp(min=1e-8)
    parts = {"ce": (ce * decay).sum() / norm}
    loss = parts["ce"]
    p_label = torch.exp(-ce)
    if w.tv:
        parts["tv"] = (2 * (1 - p_label) * decay).sum() / norm
        loss = loss + w.tv * parts["tv"]
    if w.unary and draft.markov_head is not None:
        parts["ce_unary"] = (F.cross_entropy(u.float(), labels, reduction="none") * decay).sum() / norm
        loss = loss + w.unary * parts["ce_unary"]
    if draft.confidence_head is not None and w.confidence:
        # a probe on detached features: its BCE never pulls the backbone or W1 away from acceptance
        feats_c = h.detach()
        if draft.dspark.confidence_head_with_markov:
            feats_c = torch.cat([feats_c, draft.markov_head.prev_embeddings(prev).detach().to(h.dtype)], dim=-1)
        conf_logit = draft.confidence_head(feats_c).float()
        parts["conf"] = F.binary_cross_entropy_with_logits(conf_logit, p_label.detach())
        loss = loss + w.confidence * parts["conf"]
    return loss, {k: v.detach() for k, v in parts.items()}


def batch_loss(draft: Draft, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor, embed: torch.Tensor,
               lm_head: torch.Tensor, w: LossWeights, block_lens: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The variant's loss: dspark_batch_loss, or variant_train.dflash2_loss for DFlash v2 (block_lens
    there count rows incl. the anchor, 2..B; only w.gamma applies)."""
    if isinstance(draft, DFlash2Draft):
        parts: dict[str, torch.Tensor] = {}
        loss = dflash2_loss(draft, tokens, feats, anchors, embed, lm_head, w.gamma, block_lens, parts=parts)
        return loss, parts
    return dspark_batch_loss(draft, tokens, feats, anchors, embed, lm_head, w, block_lens)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
@dataclass
class DSparkTrainConfig:
    steps: int = 1000
    batch_size: int = 32
    num_anchors: int = 192
    lr: float = 4e-4
    head_lr_mult: float = 5.0  # the fresh heads learn faster than a warm-started backbone
    min_lr_ratio: float = 0.05
    warmup: int = 100
    short_block_frac: float = 0.25  # blocks trained at a random shorter length (1..B rows)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    bf16: bool = True
    time_budget_s: float | None = None
    save_every: int = 1000
    log_every: int = 100


def train_dspark(draft: Draft, data: FlatData, train_rows: torch.Tensor, embed: torch.Tensor,
                 lm_head: torch.Tensor, cfg: DSparkTrainConfig, weights: LossWeights, ckpt_path: Path | None = None,
                 resume: bool = False, log: Log = print, world: World = World()) -> dict[str, Any]:
    """Train in place (AdamW, warmup + cosine over min(steps, time budget), bf16 autocast on GPU).
    A CUDA out-of-memory step halves the anchors per sequence and goes on. Returns a summary.

    With several ranks (`world`), `train_rows` are this rank's shard; each rank samples its own
    batches, the gradients are averaged before clipping, and the time budget and out-of-memory
    decisions are agreed on (ddp.agree_max) so that all ranks take the same steps; rank 0 alone saves
    checkpoints. A world of one issues no collective."""
    dev = embed.device
    c = draft.cfg
    blk = c.block_size
    draft.to(dev).train()
    head_ids = {id(p) for p in head_parameters(draft)}
    groups = [{"params": [p for p in draft.parameters() if id(p) not in head_ids], "mult": 1.0}]
    if head_ids:
        groups.append({"params": head_parameters(draft), "mult": cfg.head_lr_mult})
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            **({"fused": True} if dev.type == "cuda" else {}))
    state: dict[str, Any] = {"step": 0, "progress": 0.0, "seconds": 0.0, "losses": []}
    if resume and ckpt_path is not None and ckpt_path.is_file():
        ck = torch.load(ckpt_path, map_location=dev, weights_only=False)
        draft.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = {k: ck[k] for k in state}
        log(f"resumed from {ckpt_path} at step {state['step']}")
    ddp.broadcast_module(world, draft)  # identical starting weights on every rank
    v2 = isinstance(draft, DFlash2Draft)
    span = blk if v2 else blk + 1  # an offset-0 block's labels reach B tokens past the anchor, offset 1's B-1
    min_len = 2 if v2 else 1  # shortest block: one candidate (offset 1: the anchor row + one)
    rows = train_rows[(data.gen_lens[train_rows.to(data.gen_lens.device)] >= span).cpu()].cpu()
    if world.active and ddp.agree_max(world, [rows.numel() == 0], dev)[0]:  # all ranks raise, or none
        raise ValueError(f"a rank's training rows have no answer with >= {span} tokens")
    if rows.numel() == 0:
        raise ValueError(f"no training answer has >= {span} tokens")
    gen = torch.Generator().manual_seed((cfg.seed * 1000003 + state["step"]) * world.size + world.rank)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()
    n_anchor = cfg.num_anchors
    start_step, p0 = state["step"], state["progress"]
    t_start = time.perf_counter()
    run: dict[str, float] = {}
    run_n = 0

    def save() -> None:
        if ckpt_path is None or not world.main:
            return
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), **state,
                    "seconds": state["seconds"] + time.perf_counter() - t_start}, tmp)
        tmp.replace(ckpt_path)

    while state["step"] < cfg.steps:
        elapsed = time.perf_counter() - t_start
        p_time = p0 + (1 - p0) * elapsed / cfg.time_budget_s if cfg.time_budget_s else 0.0
        state["progress"] = max(state["progress"], state["step"] / cfg.steps, p_time)
        # the ranks' clocks differ: all stop at the same step (and use the same lr)
        state["progress"] = ddp.agree_max(world, [state["progress"]], dev)[0]
        if state["progress"] >= 1.0:
            break
        lr = cfg.lr * lr_factor(state["step"], state["progress"], cfg.warmup, cfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr * g["mult"]
        pick = rows[torch.randint(0, rows.numel(), (min(cfg.batch_size, rows.numel()),), generator=gen)]
        toks, feats = data.rows(pick)
        pd = pick.to(data.prompt_lens.device)
        anchors = sample_anchors_varlen(data.prompt_lens[pd], data.gen_lens[pd], span, n_anchor, gen)
        lens = None
        if cfg.short_block_frac > 0:
            short = torch.rand(anchors.shape, generator=gen) < cfg.short_block_frac
            lens = torch.where(short, torch.randint(min_len, blk + 1, anchors.shape, generator=gen), blk).to(dev)
        oom, err = False, None
        try:
            with amp:
                loss, parts = batch_loss(draft, toks, feats, anchors.to(dev), embed, lm_head, weights, lens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        except torch.OutOfMemoryError:
            if n_anchor <= 16 and not world.active:
                raise
            oom, loss, parts = True, None, None
        except Exception as e:  # with several ranks: fail together, the others would wait in a collective
            if not world.active:
                raise
            err, loss, parts = e, None, None
        if world.active:
            oom_any, err_any = ddp.agree_max(world, [oom, err is not None], dev)
            if err_any:
                raise err or RuntimeError(f"a training step failed on another rank at step {state['step']}")
            oom = bool(oom_any)
            if oom and n_anchor <= 16:
                raise torch.OutOfMemoryError(f"out of memory at step {state['step']} with {n_anchor} anchors")
        if oom:
            opt.zero_grad(set_to_none=True)
            loss = parts = None
            torch.cuda.empty_cache()
            n_anchor //= 2
            log(f"out of memory at step {state['step']}: {n_anchor} anchors per sequence from now on")
            continue
        ddp.average_gradients(world, list(draft.parameters()))
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        opt.step()
        state["step"] += 1
        for k, v in {"loss": loss.detach(), **parts}.items():
            run[k] = run.get(k, 0.0) + v.float()
        run_n += 1
        if state["step"] % cfg.log_every == 0 or state["step"] == start_step + 1:
            run = ddp.mean_over_ranks(world, run, dev)  # the same steps on every rank: over all ranks' batches
            means = {k: round(float(v) / run_n, 5) for k, v in run.items()}
            run, run_n = {}, 0
            state["losses"].append((state["step"], means["loss"], means))
            now = time.perf_counter() - t_start
            rate = (state["step"] - start_step) / max(now, 1e-9)
            mem = f", {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB peak" if dev.type == "cuda" else ""
            log(f"step {state['step']}: " + " ".join(f"{k} {v:.4f}" for k, v in means.items())
                + f" lr {lr:.2e} progress {state['progress']:.3f} ({rate:.2f} steps/s, {now:.0f}s{mem})")
        if cfg.save_every and state["step"] % cfg.save_every == 0:
            save()
    if run_n:
        run = ddp.mean_over_ranks(world, run, dev)
        means = {k: round(float(v) / run_n, 5) for k, v in run.items()}
        state["losses"].append((state["step"], means["loss"], means))
    state["seconds"] += time.perf_counter() - t_start
    save()
    draft.eval()
    log(f"training: {state['step'] - start_step} steps this run ({state['step']} total) in "
        f"{time.perf_counter() - t_start:.1f}s, {n_anchor} anchors per sequence at the end")
    return {"steps": state["step"], "steps_this_run": state["step"] - start_step, "seconds": round(state["seconds"], 1),
            "losses": state["losses"], "progress": state["progress"], "anchors_final": n_anchor}


# --------------------------------------------------------------------------------------------
# Greedy walks over a batch of blocks (the batched form of engine.export.dspark.lattice_walk)
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def walk_blocks(draft: Draft, h: torch.Tensor, unary: torch.Tensor, anchor_ids: torch.Tensor, mode: str,
                top_k: int) -> torch.Tensor:
    """h [M, n, H] (the candidate rows), unary [M, n, V] (float32), anchor_ids [M] -> drafted tokens
    [M, n] for one walk. "topk" is DSpark's Top-K scorer or DFlash v2's selector walk (the same lattice)."""
    m, n, _ = unary.shape
    if mode == "none" or not has_head(draft):
        return unary.argmax(-1)
    if mode == "topk":
        vals, cand = torch.topk(unary, top_k, dim=-1)  # [M, n, K], best first
        pred = torch.empty_like(cand)
        pred[:, 0] = anchor_ids[:, None]
        pred[:, 1:] = cand[:, :-1]
        edge = draft.edge_bias(pred.reshape(m * n, top_k), cand.reshape(m * n, top_k), h.reshape(m * n, -1))
        energy = vals[:, :, None, :] + edge.view(m, n, top_k, top_k).float()  # [M, n, K(pred), K(cand)]
        ar = torch.arange(m, device=h.device)
        prev = torch.zeros(m, dtype=torch.long, device=h.device)  # row 0: every predecessor is the anchor
        out = []
        for p in range(n):
            j = energy[ar, p, prev].argmax(-1)
            out.append(cand[ar, p, j])
            prev = j
        return torch.stack(out, 1)
    if mode == "dense":
        if isinstance(draft, DFlash2Draft):
            raise ValueError("DFlash v2 has no dense walk")
        prev = anchor_ids
        out = []
        for p in range(n):
            logits = unary[:, p] + draft.dense_bias(prev, h[:, p]).float()
            prev = logits.argmax(-1)
            out.append(prev)
        return torch.stack(out, 1)
    raise ValueError(f"mode must be one of {', '.join(WALKS)}, got {mode!r}")


@torch.no_grad()
def accepted_lengths_dspark(draft: Draft, data: FlatData, rows: Sequence[int], n_cand: int,
                            embed: torch.Tensor, lm_head: torch.Tensor, modes: Sequence[str], top_k: int, bf16: bool,
                            max_blocks: int = 4096) -> dict[str, list[torch.Tensor]]:
    """For every anchor a in [P, P+G-1-n] of each row: how many of the n candidates each walk drafts
    (block [x_a, MASK x (n-1)] for DSpark, [x_a, MASK x n] for DFlash v2 (offset 1), context = the
    target's features of positions < a) match the answer. Rows are batched; returns
    {mode: [accepted [G-n] per row]}."""
    off = int(draft.candidate_offset)
    rows_blk = n_cand + off
    dev = embed.device
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    w_head = lm_head.float()
    out: dict[str, list[torch.Tensor]] = {m: [] for m in modes}
    idx = torch.tensor(list(rows), dtype=torch.long)
    toks, feats = data.rows(idx)
    p_all = data.prompt_lens[idx.to(data.prompt_lens.device)].to(dev)
    counts = (data.gen_lens[idx.to(data.gen_lens.device)].to(dev) - n_cand).clamp(min=0)
    n_max = int(counts.max()) if counts.numel() else 0
    per_mode: dict[str, list[torch.Tensor]] = {m: [] for m in modes}
    step = max(1, max_blocks // max(1, len(rows)))
    for s in range(0, n_max, step):
        j = torch.arange(s, min(n_max, s + step), device=dev)
        anchors = p_all[:, None] + torch.minimum(j[None, :], (counts - 1).clamp(min=0)[:, None])  # [b, A]
        batch = packed_inputs(toks, feats, anchors, rows_blk, draft.cfg.mask_token_id, embed)
        batch.pop("labels"), batch.pop("label_weights")
        kw = {}
        if isinstance(draft, DFlash2Draft):
            batch["noise_embedding"] = draft.scale_embeddings(batch["noise_embedding"])
            kw["block_len"] = rows_blk  # the convs see each (shorter) block on its own
        with amp:
            h = draft.forward_packed(**batch, **kw)
        b, a = anchors.shape
        h = h.float().view(b * a, rows_blk, -1)[:, off:]
        labels = toks.gather(1, (anchors[:, :, None] + 1 + torch.arange(n_cand, device=dev)).view(b, -1))
        labels = labels.view(b * a, n_cand)
        anchor_ids = toks.gather(1, anchors).view(-1)
        unary = draft.unary_logits(h, w_head)
        for m in modes:
            drafted = walk_blocks(draft, h, unary, anchor_ids, m, top_k)
            per_mode[m].append((drafted == labels).long().cumprod(-1).sum(-1).view(b, a))
        del unary, h
    for m in modes:
        acc = torch.cat(per_mode[m], 1) if per_mode[m] else torch.zeros(len(rows), 0, dtype=torch.long, device=dev)
        out[m] = [acc[i, : int(counts[i])] for i in range(len(rows))]
    return out


@torch.no_grad()
def heldout_acceptance_dspark(draft: Draft, data: FlatData, rows: Sequence[int], embed: torch.Tensor,
                              lm_head: torch.Tensor, cands: Sequence[int], modes: Sequence[str] = WALKS,
                              top_k: int = 8, bf16: bool = True, rows_per_pass: int = 16) -> dict[str, Any]:
    """τ (tokens per target step: accepted drafts + the target's own token) of the greedy decode
    replayed on held-out answers, per walk and number of candidates, overall and per kind, with
    P(candidate k accepted | 1..k-1 accepted)."""
    draft.eval()
    modes = [m for m in modes if m == "none" or (has_head(draft) and not (m == "dense" and isinstance(draft, DFlash2Draft)))]
    res: dict[str, Any] = {}
    for n in cands:
        keep = [r for r in rows if int(data.gen_lens[r]) >= n + 2]
        tally = {m: ({}, [0] * (n + 1)) for m in modes}
        for s in range(0, len(keep), rows_per_pass):
            group = keep[s : s + rows_per_pass]
            accs = accepted_lengths_dspark(draft, data, group, n, embed, lm_head, modes, top_k, bf16)
            for m in modes:
                by_kind, hist = tally[m]
                for r, acc in zip(group, accs[m]):
                    rounds, toks, per = replay(acc, int(data.prompt_lens[r]))
                    for a in per:
                        hist[a] += 1
                    for kind in (data.kinds[r], "all"):
                        k = by_kind.setdefault(kind, [0, 0])
                        k[0] += rounds
                        k[1] += toks
        res_n = {}
        for m in modes:
            by_kind, hist = tally[m]
            cond = []
            for k in range(1, n + 1):
                reached = sum(hist[k - 1 :])
                cond.append(round(sum(hist[k:]) / reached, 4) if reached else None)
            res_n[m] = {
                "tokens_per_step": {kind: round(t / max(1, r_), 4) for kind, (r_, t) in sorted(by_kind.items())},
                "rounds": {kind: r_ for kind, (r_, _) in sorted(by_kind.items())},
                "accepted_hist": hist,
                "conditional_acceptance": cond,
            }
        res[str(n)] = res_n
    return res


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def ship_dspark(draft: Draft, config: dict[str, Any], folder: Path, dtype: torch.dtype,
                extra: dict[str, Any]) -> Path:
    """config.json (DeepSpec layout, or z-lab's for DFlash v2) + model.safetensors in `dtype` (no
    embedding / lm_head copies: the engine grafts the target's) + training.json."""
    save = save_dflash2_checkpoint if isinstance(draft, DFlash2Draft) else save_dspark_checkpoint
    save(copy.deepcopy(draft).to("cpu", dtype), config, folder)
    (Path(folder) / "training.json").write_text(json.dumps(extra, indent=1) + "\n", encoding="utf-8")
    return Path(folder)


def safetensors_bytes(vocab: int, hidden: int, n_params_backbone: int, rank: int, confidence: int) -> int:
    """fp16 payload bytes of a DSpark draft (header excluded): backbone + W1, W2 [V, r] + confidence."""
    return 2 * (n_params_backbone + 2 * vocab * rank + confidence)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train a DSpark draft (DFlash backbone + Markov head) or a DFlash v2 "
                                 "draft (convs + candidate selector) from the target's own answers.")
    ap.add_argument("--variant", default=VARIANT_DSPARK, choices=VARIANTS)
    ap.add_argument("--target", default="smollm2", help="'smollm2', a .gguf, a HF folder, or 'random:smollm2'")
    ap.add_argument("--prompts", help="JSONL(.gz) from engine.training.corpus; without it the rows (and their "
                    "order: the first --heldout are held out) come from --data-cache")
    ap.add_argument("--data-cache", required=True, help="answers JSONL.gz (gpu_job's format): read when present, "
                    "written after generation otherwise")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", help="checkpoints (default: --out)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-prompts", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--gen-until", type=float, default=0, help="stop starting generation batches after this many "
                    "seconds from the job's start (0 = no limit)")
    ap.add_argument("--gen-impl", default="hf", choices=("hf", "static"),
                    help="hf: transformers generate; static: engine.training.fast_generate (static KV cache)")
    ap.add_argument("--gen-dtype", default="bfloat16", choices=("bfloat16", "float32"), help="for --gen-impl static")
    ap.add_argument("--max-feature-gib", type=float, default=0,
                    help="use the rows (in file order, held-out first) whose features fit in this many GiB (0: all)")
    ap.add_argument("--feature-tokens", type=int, default=131072)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=8, help="rows incl. the anchor = candidates per block")
    ap.add_argument("--taps", default="1,8,15,22,27")
    ap.add_argument("--mask-token-id", type=int, default=-1)
    ap.add_argument("--markov-rank", type=int, default=12, help="rank of the Markov head (DSpark) or of the "
                    "candidate selector (DFlash v2)")
    ap.add_argument("--selector-top-k", type=int, default=16, help="DFlash v2: the selector's K (config and loss)")
    ap.add_argument("--conv-group-size", type=int, default=16, help="DFlash v2")
    ap.add_argument("--conv-kernel-size", type=int, default=2, help="DFlash v2")
    ap.add_argument("--head", default=HEAD_VANILLA, choices=(HEAD_VANILLA, HEAD_GATED, "none"))
    ap.add_argument("--confidence", default="markov", choices=("none", "hidden", "markov"),
                    help="confidence head: none, on h alone, or on [h ; W1[prev]] (DeepSpec's)")
    ap.add_argument("--init-backbone", help="a DFlash v1 draft folder of the same shape to warm-start the backbone")
    ap.add_argument("--init-from", help="a draft folder of the --variant to start from (all weights)")
    ap.add_argument("--resume", action="store_true", help="continue from WORK/ckpt.pt")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--anchors", type=int, default=192)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--head-lr-mult", type=float, default=5.0)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--tv-weight", type=float, default=0.5)
    ap.add_argument("--unary-weight", type=float, default=0.3)
    ap.add_argument("--conf-weight", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--short-block-frac", type=float, default=0.25)
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--deadline", type=float, default=0, help="seconds from the job's start by which everything is "
                    "saved; training stops --reserve seconds before it")
    ap.add_argument("--reserve", type=float, default=45)
    ap.add_argument("--save-every", type=int, default=1000)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-rows", type=int, default=256)
    ap.add_argument("--eval-cands", default="3,5,7,8")
    ap.add_argument("--extra-heldout", type=int, default=0, help="also hold out the first N training rows of each "
                    "--extra-heldout-kinds kind (answered even past --gen-until) and report their τ separately "
                    "(metrics heldout_extra); the main held-out set and its numbers are unchanged")
    ap.add_argument("--extra-heldout-kinds", default="")
    ap.add_argument("--eval-top-k", default="8", help="K of the Top-K / selector walk; a comma list also "
                    "evaluates the further K's (metrics heldout_topk)")
    ap.add_argument("--ship-dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--max-mb", type=float, default=20.0, help="refuse to train a draft whose weights would not fit")
    ap.add_argument("--split-mib", type=float, default=0)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


@dataclass
class _Row:
    id: str
    kind: str
    ids: list[int]


def _rows(args: argparse.Namespace, cache: Path) -> list[_Row]:
    if args.prompts:
        from engine.training.corpus import read_rows

        rows = [_Row(r.id, r.kind, list(r.ids)) for r in read_rows(Path(args.prompts)) if r.ids]
    else:
        if not cache.is_file():
            raise SystemExit(f"{cache} does not exist and no --prompts were given")
        rows = [_Row(k, d["kind"], list(d["ids"])) for k, d in load_data_tokens(cache).items()]
    return rows[: args.max_prompts] if args.max_prompts else rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The job. Under `torchrun --nproc_per_node=N` (WORLD_SIZE > 1) it runs data parallel
    (engine/training/distributed.py): answers and training rows are split over the ranks, rank 0
    writes the data cache, checkpoints, the draft and metrics.json and evaluates; the other ranks
    return a short summary after training."""
    t_job = time.time()
    args = parse_args(argv)
    world = ddp.world_from_env()
    dev = ddp.rank_device(world, args.device)
    ddp.init(world, dev)
    try:
        return _job(args, world, dev, t_job)
    finally:
        ddp.close(world)


def _job(args: argparse.Namespace, world: World, dev: torch.device, t_job: float) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else out
    work.mkdir(parents=True, exist_ok=True)
    log: Log = FileLog(out / "log.txt") if world.main else ddp.RankLog(out / f"log.rank{world.rank}.txt")
    if world.active:
        log(f"data parallel: rank {world.rank} of {world.size} (local rank {world.local_rank}), "
            f"{'nccl' if dev.type == 'cuda' else 'gloo'}")
    torch.manual_seed(args.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    else:
        log(f"device: cpu, torch {torch.__version__}")
    import transformers

    metrics: dict[str, Any] = {"args": vars(args), "versions": {"torch": torch.__version__,
                                                                 "transformers": transformers.__version__}}
    target, info = load_target(args.target, torch.float32, dev)
    tcfg = target.config.to_dict()
    log(f"target {args.target}: {target.config.num_hidden_layers} layers, hidden {target.config.hidden_size}, "
        f"vocab {target.config.vocab_size} ({time.time() - t_job:.1f}s)")
    taps = [int(x) for x in args.taps.split(",")]
    mask_id = args.mask_token_id if args.mask_token_id >= 0 else info.mask_id
    if mask_id is None:
        raise SystemExit("no MASK token known for this target: pass --mask-token-id")

    # ---- the draft first: refuse a size that would not ship before spending time on data
    v2 = args.variant == VARIANT_DFLASH_V2
    rank = 0 if args.head == "none" else args.markov_rank
    if args.init_from:
        draft, dcfg = (load_dflash2_checkpoint if v2 else load_dspark_checkpoint)(Path(args.init_from))
        log(f"draft initialised from {args.init_from}")
    elif v2:
        draft, dcfg = new_dflash2_draft(tcfg, args.layers, args.block_size, taps, mask_id, args.markov_rank,
                                        args.selector_top_k, args.conv_group_size, args.conv_kernel_size)
    else:
        draft, dcfg = new_dspark_draft(tcfg, args.layers, args.block_size, taps, mask_id, rank,
                                       args.head if rank else HEAD_VANILLA, args.confidence != "none",
                                       args.confidence == "markov", args.anchors)
    if args.init_backbone and not args.init_from:
        metrics["init_backbone"] = init_backbone_from_v1(draft, Path(args.init_backbone))
        log(f"backbone warm-started from the DFlash v1 draft {args.init_backbone}")
    n_params = sum(p.numel() for p in draft.parameters())
    est_mb = n_params * 2 / 1e6
    if v2:
        vc = draft.v2
        log(f"draft: DFlash v2, {draft.cfg.num_hidden_layers} layers, block {draft.cfg.block_size} (offset 1), "
            f"taps {taps}, mask {mask_id}, convs group {vc.conv_group_size} kernel {vc.conv_kernel_size}, selector "
            f"rank {vc.selector_rank} top-k {vc.selector_top_k}, {n_params / 1e6:.2f}M parameters (~{est_mb:.2f} MB fp16)")
    else:
        log(f"draft: DSpark, {dcfg['num_hidden_layers']} layers, block {dcfg['block_size']} (offset 0), taps {taps}, "
            f"mask {mask_id}, Markov head {dcfg.get('markov_head_type', 'none')} rank {dcfg['markov_rank']}, confidence "
            f"{'with markov' if dcfg['confidence_head_with_markov'] else dcfg['enable_confidence_head']}, "
            f"{n_params / 1e6:.2f}M parameters (~{est_mb:.2f} MB fp16)")
    if args.ship_dtype != "float32" and est_mb >= args.max_mb:
        raise SystemExit(f"the draft would take {est_mb:.2f} MB > --max-mb {args.max_mb}: lower --markov-rank")

    # ---- rows, answers
    cache = Path(args.data_cache)
    rows = _rows(args, cache)
    n_held = min(args.heldout, max(1, len(rows) // 10))
    held, train_rows = rows[:n_held], rows[n_held:]
    extra_rows: list[_Row] = []
    for kind in [k for k in args.extra_heldout_kinds.split(",") if k] if args.extra_heldout else []:
        extra_rows += [r for r in train_rows if r.kind == kind][: args.extra_heldout]
    if extra_rows:
        ex_ids = {r.id for r in extra_rows}
        train_rows = [r for r in train_rows if r.id not in ex_ids]
    answers: dict[str, list[int]] = {}
    if cache.is_file():
        answers = {k: v["answer"] for k, v in load_data_tokens(cache).items()}
        log(f"answers: {len(answers)} read from {cache}")
    todo_held = [r for r in held + extra_rows if r.id not in answers]
    todo_train = [r for r in train_rows if r.id not in answers]
    generated: list[str] = []  # the ids this rank answered (every row's in a world of one)
    if todo_held or todo_train:
        t0 = time.time()
        new: dict[str, list[int]] = {}
        until = (t_job + args.gen_until) if args.gen_until else None
        for group, deadline in ((ddp.shard(todo_held, world), None), (ddp.shard(todo_train, world), until)):
            if group:
                if args.gen_impl == "static":
                    from engine.training.fast_generate import generate_answers_static

                    got = generate_answers_static(target, [r.ids for r in group], args.new_tokens, args.gen_batch,
                                                  info.eos_id, info.pad_id, deadline, log, args.seed,
                                                  getattr(torch, args.gen_dtype))
                else:
                    got = generate_answers(target, [r.ids for r in group], args.new_tokens, args.gen_batch,
                                           info.eos_id, info.pad_id, deadline, log, args.seed)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                new.update({r.id: a for r, a in zip(group, got) if a is not None})
        generated = list(new)
        answers.update(ddp.gather_dicts(world, new))  # every rank: every rank's answers
        metrics["generation"] = {"seconds": round(time.time() - t0, 1)}
        if world.main:
            every = held + extra_rows + train_rows
            save_data_tokens(cache, [r.ids for r in every], [answers.get(r.id) for r in every],
                             [r.id for r in every], [r.kind for r in every])
        ddp.barrier(world)
    held = [r for r in held if r.id in answers]
    extra_rows = [r for r in extra_rows if r.id in answers]
    train_rows = [r for r in train_rows if r.id in answers]
    per_token = len(taps) * target.config.hidden_size * (2 if dev.type == "cuda" and not args.no_bf16 else 4)
    # N ranks hold N times the features: the rows that fit in N budgets (the same list on every rank, in
    # file order), each rank building features for the held-out rows and its own shard of these
    budget_rows = rows_within_feature_budget(held + extra_rows, train_rows, answers, args.max_feature_gib * world.size,
                                             per_token, log)
    train_rows = ddp.shard(budget_rows, world)
    all_rows = held + extra_rows + train_rows
    kinds_used = dict(Counter(r.kind for r in budget_rows))
    log(f"answers: {len(held) + len(extra_rows) + len(budget_rows)} used ({len(held)} held out, {len(extra_rows)} "
        f"extra held out, training rows by kind {kinds_used})")
    if world.active:
        counts = ddp.gather_objects(world, (len(train_rows), len(generated)))
        per_rank = [c[0] for c in counts]
        metrics["distributed"] = {"world_size": world.size, "backend": "nccl" if dev.type == "cuda" else "gloo",
                                  "train_rows_per_rank": per_rank, "answers_per_rank": [c[1] for c in counts]}
        log(f"this rank trains on {len(train_rows)} of the {len(budget_rows)} training rows (per rank {per_rank})")

    # ---- features
    feat_dtype = torch.bfloat16 if (dev.type == "cuda" and not args.no_bf16) else torch.float32
    data, fstats = build_flat_data(target, [r.ids for r in all_rows], [answers[r.id] for r in all_rows],
                                   [r.kind for r in all_rows], taps, args.feature_tokens, feat_dtype, log)
    metrics["data"] = {**fstats, "prompts_train": len(budget_rows), "prompts_heldout": len(held),
                       "prompts_extra_heldout": len(extra_rows), "train_kinds": kinds_used,
                       "answer_tokens_mean": round(float(data.gen_lens.float().mean()), 1)}
    embed, lm_head = target_weights(target)
    embed, lm_head = embed.to(dev), lm_head.to(dev)
    n_layers_t = target.config.num_hidden_layers
    del target
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if world.main:
        (work / "draft_config.json").write_text(json.dumps(dcfg, indent=1), encoding="utf-8")

    # ---- the starting draft on the extra held-out rows (the new data's kinds), for comparison
    cands = [int(x) for x in args.eval_cands.split(",")
             if 0 < int(x) <= draft.cfg.block_size - draft.candidate_offset]
    top_ks = [int(x) for x in str(args.eval_top_k).split(",")]
    extra_idx = list(range(len(held), len(held) + len(extra_rows)))  # their rows in `data`
    if extra_rows and args.init_from and world.main:
        t0 = time.time()
        draft.to(dev)
        try:
            ex0 = heldout_acceptance_dspark(draft, data, extra_idx, embed, lm_head, cands, ("topk",), top_ks[0],
                                            dev.type == "cuda" and not args.no_bf16, 16)
            metrics["heldout_extra_init"] = ex0
            for n, per in ex0.items():
                log(f"extra held-out, starting draft, {n} candidates: tokens/step {per['topk']['tokens_per_step']}")
        except Exception as e:  # a comparison only
            log(f"extra held-out of the starting draft failed: {e!r}")
        log(f"extra held-out of the starting draft: {time.time() - t0:.1f}s")
        draft.train()
    ddp.barrier(world)  # the other ranks wait for rank 0's evaluation: training's collectives come next

    # ---- training
    budget = None
    if args.deadline:
        budget = t_job + args.deadline - args.reserve - time.time()
        budget = -ddp.agree_max(world, [-budget], dev)[0]  # the shortest over the ranks: all stop (and refuse) together
        log(f"training time budget: {budget:.0f}s")
        if budget < 5:
            raise SystemExit("no time left to train")
    bf16 = not args.no_bf16 and dev.type == "cuda"
    tc = DSparkTrainConfig(steps=args.steps, batch_size=args.batch, num_anchors=args.anchors, lr=args.lr,
                           head_lr_mult=args.head_lr_mult, min_lr_ratio=args.min_lr_ratio, warmup=args.warmup,
                           short_block_frac=args.short_block_frac, weight_decay=args.weight_decay, seed=args.seed,
                           bf16=bf16, time_budget_s=budget, save_every=args.save_every, log_every=args.log_every)
    lw = LossWeights(gamma=args.gamma, tv=args.tv_weight, unary=args.unary_weight, confidence=args.conf_weight)
    train_idx = torch.arange(len(held) + len(extra_rows), len(all_rows))
    sha_start = ddp.params_sha256(draft) if world.active else None
    try:
        tres = train_dspark(draft, data, train_idx, embed, lm_head, tc, lw, work / "ckpt.pt", args.resume, log, world)
    except Exception as e:  # ship what there is rather than nothing (the device call is not repeatable)
        import traceback

        log(f"training failed: {e!r}\n{traceback.format_exc()}")
        metrics["train_error"] = repr(e)
        tres = {"steps": -1, "losses": []}
    draft.eval()
    if world.active:  # what each rank trained on and its final weights (the ranks must agree), for checks
        rank_info = {"rank": world.rank, "world_size": world.size, "steps": tres["steps"],
                     "train_row_ids": [r.id for r in train_rows], "answered_ids": generated,
                     "params_sha256_start": sha_start, "params_sha256_end": ddp.params_sha256(draft)}
        (work / f"ddp_rank{world.rank}.json").write_text(json.dumps(rank_info) + "\n", encoding="utf-8")
        if not world.main:
            log(f"rank {world.rank} done: {tres['steps']} steps")
            return {k: v for k, v in rank_info.items() if k != "train_row_ids"}
    losses = tres["losses"]
    metrics["train"] = {**{k: v for k, v in tres.items() if k != "losses"}, "config": asdict(tc), "loss": asdict(lw),
                        "loss_first": losses[0][2] if losses else None, "loss_last": losses[-1][2] if losses else None,
                        "losses": losses}

    # ---- the shipped draft first (an evaluation failure must not lose it), then held-out acceptance
    recipe = ("engine.training.gpu_job_dspark --variant dflash_v2 (self-distilled DFlash v2: offset-1 blocks, DFlash "
              "block mask, grouped dynamic convs, decayed CE of U + selector CE over the top-K with the ground-truth "
              "predecessor)" if v2 else
              "engine.training.gpu_job_dspark (self-distilled DSpark: offset-0 blocks, DFlash block mask, "
              "teacher-forced Markov head, CE + one-hot L1 + unary CE + confidence BCE)")
    extra = {"recipe": recipe, "steps": tres["steps"], "loss_last": metrics["train"]["loss_last"],
             "init_backbone": metrics.get("init_backbone"), "init_from": args.init_from, "walk_top_k": top_ks[0]}
    ship_dtype = getattr(torch, args.ship_dtype)
    folder = ship_dspark(draft, dcfg, out / "draft", ship_dtype, extra)
    size = (folder / "model.safetensors").stat().st_size
    metrics["draft"] = {"parameters": n_params, "safetensors_bytes": size, "dtype": args.ship_dtype,
                        "target_layers": n_layers_t}
    log(f"saved {folder} ({size / 1e6:.2f} MB {args.ship_dtype})")
    if args.split_mib:
        metrics["draft"]["parts"] = [p.name for p in split_file(folder / "model.safetensors", int(args.split_mib * 2**20))]
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    t0 = time.time()
    rows_per_pass = 16
    acc: dict[str, Any] = {}
    while True:
        try:
            eval_rows = list(range(min(len(held), args.eval_rows)))
            acc = heldout_acceptance_dspark(draft, data, eval_rows, embed, lm_head, cands, WALKS, top_ks[0], bf16,
                                            rows_per_pass)
            for k in top_ks[1:]:
                more = heldout_acceptance_dspark(draft, data, eval_rows, embed, lm_head, cands, ("topk",), k, bf16,
                                                 rows_per_pass)
                metrics.setdefault("heldout_topk", {})[str(k)] = more
                for n, per in more.items():
                    log(f"held-out, {n} candidates, walk topk K={k}: tokens/step {per['topk']['tokens_per_step']}")
            if extra_rows:
                ex = heldout_acceptance_dspark(draft, data, extra_idx, embed, lm_head, cands, WALKS, top_ks[0], bf16,
                                               rows_per_pass)
                metrics["heldout_extra"] = ex
                for n, per in ex.items():
                    for m, r in per.items():
                        log(f"extra held-out ({len(extra_rows)} rows), {n} candidates, walk {m}: tokens/step "
                            f"{r['tokens_per_step']}")
            break
        except torch.OutOfMemoryError:
            if rows_per_pass == 1:
                raise
            rows_per_pass //= 2
            torch.cuda.empty_cache()
            log(f"evaluation out of memory: {rows_per_pass} rows per pass")
        except Exception as e:  # keep the shipped draft and the training log
            log(f"evaluation failed: {e!r}")
            metrics["heldout_error"] = repr(e)
            break
    metrics["heldout"] = acc
    for n, per in acc.items():
        for m, r in per.items():
            log(f"held-out, {n} candidates, walk {m}: tokens/step {r['tokens_per_step']}, "
                f"P(accept k | k-1) {r['conditional_acceptance']}")
    log(f"evaluation: {time.time() - t0:.1f}s")
    extra["heldout_tokens_per_step"] = {n: {m: r["tokens_per_step"].get("all") for m, r in per.items()}
                                        for n, per in acc.items()}
    (folder / "training.json").write_text(json.dumps(extra, indent=1) + "\n", encoding="utf-8")
    metrics["seconds_total"] = round(time.time() - t_job, 1)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    log(f"job {metrics['seconds_total']}s")
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
