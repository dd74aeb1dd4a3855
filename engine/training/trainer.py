"""One training loop for every draft variant (the loss is the variant's: engine/training/losses.py).

AdamW (β 0.9/0.95), the fresh heads at `head_lr_mult` times the backbone's rate (a grown draft's trained weights at
`trained_lr_mult` times, its new layers at the rate itself), warmup then cosine to
`min_lr_ratio` over min(steps, time budget), bf16 autocast on a GPU, gradient clipping. Each step
samples `batch_size` answers and `num_anchors` anchors inside each; `short_block_frac` of the blocks
are trained at a random shorter length, as the engine drafts them when asked for fewer candidates.
A CUDA out-of-memory step halves the anchors and goes on.

Checkpoints (draft, optimizer, step, schedule progress, seconds, loss history) are written every
`save_every` steps and at the end, atomically, so a killed run resumes from the last one. Under
torchrun (`world`) every rank trains on its own shard with its own batches, the gradients are
averaged before clipping, decisions taken from local state are agreed (engine/training/distributed.py),
and rank 0 alone writes checkpoints and evaluates.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from engine.drafts.dflash_v1 import DFlashV1Draft
from engine.training import distributed as ddp
from engine.training.data import FlatData, Log
from engine.training.distributed import World
from engine.training.losses import LossWeights, SubVocab, head_parameters, label_span, shortest_block, variant_loss
from engine.training.packing import sample_anchors
from engine.training.warm_start import new_layer_parameters


@dataclass
class TrainSettings:
    steps: int = 1000
    batch_size: int = 32
    num_anchors: int = 192
    lr: float = 4e-4
    head_lr_mult: float = 5.0
    min_lr_ratio: float = 0.05
    warmup: int = 100
    short_block_frac: float = 0.25
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    bf16: bool = True
    time_budget_s: float | None = None
    save_every: int = 1000
    log_every: int = 100
    eval_every: int = 0  # held-out τ during training every N steps (0: only at the end)
    sub_vocab: bool = True  # logits over the draft's sub-vocabulary where it gets one (losses.SubVocab)
    vocab_rows: int = 0  # that sub-vocabulary's size, which the finished draft ships (0: pipeline.sub_vocab_size's rule)
    # a stage that grows the draft: the rate of everything the starting weights had trained, as a multiple of lr (0
    # keeps it), while the new layers learn at lr (stage 11 at 1.0 disturbed the trained layers: docs/training.md)
    trained_lr_mult: float = 1.0


def budget_progress(seconds_before: float, elapsed: float, budget_s: float | None) -> float:
    """The time budget's share spent: it counts the seconds of the runs before a resume, so a resumed
    stage trains only for what its budget has left (not the remainder of the schedule over a whole new budget)."""
    return (seconds_before + elapsed) / budget_s if budget_s else 0.0


def lr_factor(step: int, progress: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(draft: DFlashV1Draft, data: FlatData, train_rows: torch.Tensor, embed: torch.Tensor, lm_head: torch.Tensor,
          cfg: TrainSettings, weights: LossWeights, ckpt_path: Path | None = None, resume: bool = False,
          log: Log = print, world: World = World(),
          evaluate: Callable[[int], dict[str, Any]] | None = None, vocab: SubVocab | None = None,
          on_save: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Train `draft` in place on the rows `train_rows` of `data`; returns {steps, seconds, losses
    [(step, loss, parts)], evals [(step, τ by candidates)], ...}. `evaluate(step)` (rank 0) gives the
    held-out τ logged every `eval_every` steps; `vocab`: the logits are the sub-vocabulary's;
    `on_save(step)` (rank 0) runs after each checkpoint (the pipeline writes the weights as a draft folder)."""
    dev = embed.device
    blk = draft.cfg.block_size
    draft.to(dev).train()
    head_ids = {id(p) for p in head_parameters(draft)}
    new = new_layer_parameters(draft)
    apart = head_ids | {id(p) for p in new}
    trained = cfg.trained_lr_mult if new else 1.0
    groups = [{"params": [p for p in draft.parameters() if id(p) not in apart], "mult": trained}]
    if new:
        groups.append({"params": new, "mult": 1.0})
    if head_ids:
        groups.append({"params": head_parameters(draft), "mult": cfg.head_lr_mult * trained})
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            **({"fused": True} if dev.type == "cuda" else {}))
    state: dict[str, Any] = {"step": 0, "progress": 0.0, "seconds": 0.0, "losses": [], "evals": []}
    if resume and ckpt_path is not None and ckpt_path.is_file():
        ck = torch.load(ckpt_path, map_location=dev, weights_only=False)
        draft.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = {k: ck.get(k, v) for k, v in state.items()}
        log(f"resumed from {ckpt_path} at step {state['step']}")
    ddp.broadcast_module(world, draft)  # identical starting weights on every rank
    span = label_span(draft)
    min_len = shortest_block(draft)
    rows = train_rows[(data.gen_lens[train_rows.to(data.gen_lens.device)] >= span).cpu()].cpu()
    if ddp.agree_max(world, [rows.numel() == 0], dev)[0]:  # all ranks raise, or none
        raise ValueError(f"no training answer has >= {span} tokens: the answers are too short for block {blk}")
    gen = torch.Generator().manual_seed((cfg.seed * 1000003 + state["step"]) * world.size + world.rank)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()
    n_anchor = cfg.num_anchors
    start_step, seconds_before = state["step"], state["seconds"]
    t_start = time.perf_counter()
    run: dict[str, Any] = {}
    run_n = 0

    def save() -> None:
        if ckpt_path is None or not world.main:
            return
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), **state,
                    "seconds": state["seconds"] + time.perf_counter() - t_start}, tmp)
        tmp.replace(ckpt_path)
        if on_save is not None:
            on_save(state["step"])

    def held_out(step: int) -> None:
        if evaluate is not None and world.main:
            draft.eval()
            res = evaluate(step)
            state["evals"].append((step, res))
            log(f"step {step}: held-out tau " + ", ".join(f"{n} candidates {t:.3f}" for n, t in res.items()))
            draft.train()
        ddp.barrier(world)

    while state["step"] < cfg.steps:
        elapsed = time.perf_counter() - t_start
        p_time = budget_progress(seconds_before, elapsed, cfg.time_budget_s)
        state["progress"] = max(state["progress"], state["step"] / cfg.steps, p_time)
        state["progress"] = ddp.agree_max(world, [state["progress"]], dev)[0]  # all stop at the same step
        if state["progress"] >= 1.0:
            break
        lr = cfg.lr * lr_factor(state["step"], state["progress"], cfg.warmup, cfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr * g["mult"]
        pick = rows[torch.randint(0, rows.numel(), (min(cfg.batch_size, rows.numel()),), generator=gen)]
        toks, feats = data.rows(pick)
        pd = pick.to(data.prompt_lens.device)
        anchors = sample_anchors(data.prompt_lens[pd], data.gen_lens[pd], span, n_anchor, gen)
        lens = None
        if cfg.short_block_frac > 0:
            short = torch.rand(anchors.shape, generator=gen) < cfg.short_block_frac
            lens = torch.where(short, torch.randint(min_len, blk + 1, anchors.shape, generator=gen), blk).to(dev)
        oom, err = False, None
        try:
            with amp:
                loss, parts = variant_loss(draft, toks, feats, anchors.to(dev), embed, lm_head, weights, lens, vocab)
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
            run = ddp.mean_over_ranks(world, run, dev)
            means = {k: round(float(v) / run_n, 5) for k, v in run.items()}
            run, run_n = {}, 0
            state["losses"].append((state["step"], means["loss"], means))
            now = time.perf_counter() - t_start
            rate = (state["step"] - start_step) / max(now, 1e-9)
            mem = f", {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB peak" if dev.type == "cuda" else ""
            log(f"step {state['step']}/{cfg.steps}: " + " ".join(f"{k} {v:.4f}" for k, v in means.items())
                + f" lr {lr:.2e} progress {state['progress']:.3f} ({rate:.2f} steps/s, {now:.0f}s{mem})")
        if cfg.eval_every and state["step"] % cfg.eval_every == 0:
            held_out(state["step"])
        if cfg.save_every and state["step"] % cfg.save_every == 0:
            save()
    if run_n:
        run = ddp.mean_over_ranks(world, run, dev)
        means = {k: round(float(v) / run_n, 5) for k, v in run.items()}
        state["losses"].append((state["step"], means["loss"], means))
    state["seconds"] += time.perf_counter() - t_start
    t_start = time.perf_counter()
    save()
    draft.eval()
    log(f"training: {state['step'] - start_step} steps this run ({state['step']} in all), "
        f"{n_anchor} anchors per sequence at the end")
    if world.active:  # the ranks must end with the same weights
        log(f"weights sha256 {ddp.params_sha256(draft)}")
    return {"steps": state["step"], "steps_this_run": state["step"] - start_step, "seconds": round(state["seconds"], 1),
            "losses": state["losses"], "evals": state["evals"], "progress": state["progress"],
            "anchors_final": n_anchor}
