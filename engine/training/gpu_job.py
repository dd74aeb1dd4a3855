"""Train a DFlash v1 draft for a target from its own answers (spec §1.6), on a GPU or on CPU.

One job, start to end:
  1. load the target (engine.training.target_loader: the SmolLM2 GGUF, a .gguf, a HF folder);
  2. read pre-tokenised chat prompts (engine.training.corpus), split off a held-out set;
  3. the target answers every prompt itself: greedy, batched with left padding, stopping at EOS;
  4. one forward per batch (right padding, causal) records the tapped layers' hidden states
     (HF hidden_states[L+1], never the last layer) into one flat [tokens, n*H] store;
  5. train the draft: random anchors in each answer, blocks [anchor, MASK...] packed with the
     DFlash block mask, position-decayed CE against the target's own next tokens
     (dflash_train.packed_inputs / block_loss), bf16 autocast, AdamW, warmup + cosine by steps
     or by wall time, resumable checkpoints;
  6. held-out acceptance: for every anchor position of each held-out answer the draft's accepted
     prefix length is computed in one packed pass, then the greedy DFlash decode is replayed on
     it (exact for greedy: the target's output is the fixed answer) -> tokens per target step;
  7. save the draft (z-lab layout, fp16 by default) and metrics.json / log.txt.

    python -m engine.training.gpu_job --target smollm2 --prompts prompts.jsonl.gz --out OUT
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from engine.export.dflash_v1 import DFlashV1Draft, load_checkpoint, random_draft_config, save_checkpoint
from engine.training.corpus import read_rows
from engine.training.dflash_train import block_loss, packed_inputs, tapped_hidden, target_weights
from engine.training.target_loader import load_target

Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# Data: the target's answers and its tapped features, stored flat
# --------------------------------------------------------------------------------------------
@dataclass
class FlatData:
    """Sequences (prompt + the target's answer) concatenated: row i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: torch.Tensor  # [T] int64
    features: torch.Tensor  # [T, n*H] (bf16 on GPU, f32 on CPU)
    offsets: torch.Tensor  # [N+1] int64
    prompt_lens: torch.Tensor  # [N] int64
    gen_lens: torch.Tensor  # [N] int64: answer tokens, EOS included when the target stopped
    kinds: list[str]

    @property
    def n(self) -> int:
        return int(self.prompt_lens.shape[0])

    def rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded (tokens [b, L], features [b, L, n*H]) of rows `idx` (on the data's device)."""
        dev = self.tokens.device
        idx = idx.to(dev)
        lens = (self.prompt_lens + self.gen_lens).to(dev)[idx]
        width = int(lens.max())
        pos = torch.arange(width, device=dev)
        valid = pos[None, :] < lens[:, None]
        gidx = (self.offsets.to(dev)[idx][:, None] + pos[None, :]).clamp(max=self.tokens.shape[0] - 1)
        toks = torch.where(valid, self.tokens[gidx], torch.zeros((), dtype=torch.long, device=dev))
        feats = self.features[gidx] * valid[..., None].to(self.features.dtype)
        return toks, feats


@torch.no_grad()
def generate_answers(
    target: Any,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    batch_size: int,
    eos_id: int,
    pad_id: int,
    deadline: float | None = None,
    log: Log = print,
    seed: int = 0,
) -> list[list[int] | None]:
    """The target's greedy answer to each prompt (EOS included, nothing after it); None for prompts
    not reached before `deadline` (time.time()). Batches of similar length, left padded, in random
    batch order so a cut-off run still covers every length."""
    from transformers import GenerationConfig

    dev = next(target.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    gc = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=eos_id, pad_token_id=pad_id)
    out: list[list[int] | None] = [None] * len(prompts)
    t0 = time.time()
    done = 0
    for bi, chunk in enumerate(batches):
        if deadline is not None and time.time() > deadline:
            log(f"generation: time budget reached after {bi}/{len(batches)} batches ({done} answers)")
            break
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, i in enumerate(chunk):
            p = list(prompts[i])
            ids[j, width - len(p) :] = torch.tensor(p)
            mask[j, width - len(p) :] = 1
        seq = target.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gc)
        gen = seq[:, width:].cpu().tolist()
        for j, i in enumerate(chunk):
            row = gen[j]
            if eos_id in row:
                row = row[: row.index(eos_id) + 1]
            out[i] = row
        done += len(chunk)
        log(f"generation: batch {bi + 1}/{len(batches)} ({len(chunk)} x prompt<={width}) done, "
            f"{done} answers, {time.time() - t0:.1f}s")
    return out


@torch.no_grad()
def build_flat_data(
    target: Any,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    kinds: Sequence[str],
    layer_ids: Sequence[int],
    token_budget: int = 131072,
    feat_dtype: torch.dtype = torch.float32,
    log: Log = print,
    check_positions: int = 100_000,
) -> tuple[FlatData, dict[str, Any]]:
    """Record the target's tapped hidden states for prompt+answer sequences (one causal forward per
    batch, right padding: valid rows never see the padding). Also checks that the target's argmax
    at each answer position reproduces the answer (teacher forcing vs generation agreement)."""
    dev = next(target.parameters()).device
    seqs = [list(p) + list(a) for p, a in zip(prompts, answers)]
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lens, 0)
    total = int(offsets[-1])
    n_h = len(layer_ids) * target.config.hidden_size
    tokens = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=dev)
    features = torch.empty(total, n_h, dtype=feat_dtype, device=dev)
    _, lm_head = target_weights(target)
    order = sorted(range(len(seqs)), key=lambda i: lens[i])
    agree = checked = 0
    i = 0
    t0 = time.time()
    while i < len(order):
        width = int(lens[order[i]])
        j = i
        while j < len(order) and (j - i + 1) * int(lens[order[j]]) <= max(token_budget, int(lens[order[j]])):
            j += 1
        chunk = order[i:j]
        width = int(lens[chunk[-1]])
        x = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, k in enumerate(chunk):
            x[r, : lens[k]] = torch.tensor(seqs[k])
        x = x.to(dev)
        out = target(input_ids=x, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        f = tapped_hidden(out.hidden_states, layer_ids)
        last = out.hidden_states[-1]  # post-final-norm: logits = last @ lm_head.T
        for r, k in enumerate(chunk):
            n_k = int(lens[k])
            features[offsets[k] : offsets[k] + n_k] = f[r, :n_k].to(feat_dtype)
            p_k = len(prompts[k])
            if n_k > p_k and checked < check_positions:  # positions p_k-1 .. n_k-2 predict answer tokens p_k .. n_k-1
                pred = (last[r, p_k - 1 : n_k - 1] @ lm_head.T).argmax(-1)
                agree += int((pred == x[r, p_k:n_k]).sum())
                checked += n_k - p_k
        del out, f, last
        i = j
    stats = {"sequences": len(seqs), "tokens": total, "feature_gib": total * n_h * features.element_size() / 2**30,
             "teacher_forced_agreement": agree / max(1, checked), "seconds": round(time.time() - t0, 1)}
    log(f"features: {total} tokens x {n_h} ({stats['feature_gib']:.2f} GiB {feat_dtype}), "
        f"teacher-forced argmax = generated token on {100 * stats['teacher_forced_agreement']:.2f}% "
        f"of answer positions, {stats['seconds']}s")
    data = FlatData(tokens, features, offsets.to(dev), torch.tensor([len(p) for p in prompts]).to(dev),
                    torch.tensor([len(a) for a in answers]).to(dev), list(kinds))
    return data, stats


def rows_within_feature_budget(held: Sequence[Any], train_rows: Sequence[Any], answers: dict[str, list[int]],
                               gib: float, bytes_per_token: int, log: Log = print) -> list[Any]:
    """The training rows (in order) whose features fit in `gib` GiB together with the held-out rows'."""
    if not gib:
        return list(train_rows)
    room, kept = int(gib * 2**30 / bytes_per_token), []
    room -= sum(len(r.ids) + len(answers[r.id]) for r in held)
    for r in train_rows:
        room -= len(r.ids) + len(answers[r.id])
        if room < 0:
            break
        kept.append(r)
    if len(kept) < len(train_rows):
        log(f"features: {len(kept)} of {len(train_rows)} training rows fit in {gib} GiB")
    return kept


def sample_anchors_varlen(prompt_lens: torch.Tensor, gen_lens: torch.Tensor, block_size: int, num_anchors: int,
                          gen: torch.Generator) -> torch.Tensor:
    """Anchors a in [P, P+G-B] per row (P prompt length, G answer length >= B): the anchor is an
    answer token (as at inference, where the target produced it) and its B-1 labels lie in the
    answer. Returns [N, A] (with repetition)."""
    lo = prompt_lens.cpu()
    span = (gen_lens.cpu() - block_size + 1).clamp(min=1)
    u = torch.rand(lo.shape[0], num_anchors, generator=gen)
    return lo[:, None] + (u * span[:, None]).long().clamp(max=span[:, None] - 1)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------
@dataclass
class JobTrainConfig:
    steps: int = 1000
    batch_size: int = 32
    num_anchors: int = 256
    lr: float = 6e-4
    min_lr_ratio: float = 0.05
    warmup: int = 100
    gamma: float = 4.0
    short_block_frac: float = 0.0  # share of blocks trained at a random shorter length (2..block_size rows)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    bf16: bool = True
    time_budget_s: float | None = None  # cosine runs over min(steps, this much training time)
    save_every: int = 500
    log_every: int = 50


def lr_factor(step: int, progress: float, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _save_ckpt(path: Path, draft: DFlashV1Draft, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), **state}, tmp)
    os.replace(tmp, path)


def train(
    draft: DFlashV1Draft,
    data: FlatData,
    train_rows: torch.Tensor,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    cfg: JobTrainConfig,
    ckpt_path: Path | None = None,
    resume: bool = False,
    log: Log = print,
) -> dict[str, Any]:
    """Train in place; returns {steps, seconds, losses [(step, loss)], ...}. A checkpoint holds the
    draft, the optimizer, the step, the schedule progress and the loss history."""
    dev = embed.device
    c = draft.cfg
    draft.to(dev).train()
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            **({"fused": True} if fused else {}))
    state: dict[str, Any] = {"step": 0, "progress": 0.0, "seconds": 0.0, "losses": []}
    if resume and ckpt_path is not None and ckpt_path.is_file():
        ck = torch.load(ckpt_path, map_location=dev, weights_only=False)
        draft.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = {k: ck[k] for k in state}
        log(f"resumed from {ckpt_path} at step {state['step']} (progress {state['progress']:.3f})")
    rows = train_rows[(data.gen_lens[train_rows.to(data.gen_lens.device)] >= c.block_size).cpu()].cpu()
    if rows.numel() == 0:
        raise ValueError(f"no training answer has >= {c.block_size} tokens")
    gen = torch.Generator().manual_seed(cfg.seed * 1000003 + state["step"])
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()
    start_step, p0 = state["step"], state["progress"]
    t_start = time.perf_counter()
    run_loss = torch.zeros((), device=dev)
    run_n = 0
    while state["step"] < cfg.steps:
        elapsed = time.perf_counter() - t_start
        p_time = p0 + (1 - p0) * elapsed / cfg.time_budget_s if cfg.time_budget_s else 0.0
        state["progress"] = max(state["progress"], state["step"] / cfg.steps, p_time)
        if state["progress"] >= 1.0:
            break
        lr = cfg.lr * lr_factor(state["step"], state["progress"], cfg.warmup, cfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        pick = rows[torch.randint(0, rows.numel(), (min(cfg.batch_size, rows.numel()),), generator=gen)]
        toks, feats = data.rows(pick)
        anchors = sample_anchors_varlen(data.prompt_lens[pick.to(data.prompt_lens.device)],
                                        data.gen_lens[pick.to(data.gen_lens.device)], c.block_size, cfg.num_anchors, gen)
        extra = []
        if cfg.short_block_frac > 0:  # also train the shorter blocks the runtime drafts with fewer candidates
            short = torch.rand(anchors.shape, generator=gen) < cfg.short_block_frac
            lens = torch.where(short, torch.randint(2, c.block_size + 1, anchors.shape, generator=gen), c.block_size)
            extra = [lens.to(dev)]
        batch = packed_inputs(toks, feats, anchors.to(dev), c.block_size, c.mask_token_id, embed, *extra)
        labels, weights = batch.pop("labels"), batch.pop("label_weights", None)
        with amp:
            hidden = draft.forward_packed(**batch)
            loss = (block_loss(hidden, labels, lm_head, cfg.gamma) if weights is None
                    else block_loss(hidden, labels, lm_head, cfg.gamma, weights))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        opt.step()
        state["step"] += 1
        run_loss += loss.detach().float()
        run_n += 1
        if state["step"] % cfg.log_every == 0 or state["step"] == start_step + 1:
            mean = float(run_loss) / run_n
            run_loss.zero_()
            run_n = 0
            state["losses"].append((state["step"], round(mean, 5)))
            now = time.perf_counter() - t_start
            rate = (state["step"] - start_step) / max(now, 1e-9)
            log(f"step {state['step']}: loss {mean:.4f} lr {lr:.2e} progress {state['progress']:.3f} "
                f"({rate:.2f} steps/s, {now:.0f}s)")
        if ckpt_path is not None and cfg.save_every and state["step"] % cfg.save_every == 0:
            _save_ckpt(ckpt_path, draft, opt, {**state, "seconds": state["seconds"] + time.perf_counter() - t_start})
    if run_n:
        state["losses"].append((state["step"], round(float(run_loss) / run_n, 5)))
    state["seconds"] += time.perf_counter() - t_start
    if ckpt_path is not None:
        _save_ckpt(ckpt_path, draft, opt, state)
    draft.eval()
    log(f"training: {state['step'] - start_step} steps this run ({state['step']} total) in "
        f"{time.perf_counter() - t_start:.1f}s")
    return {"steps": state["step"], "steps_this_run": state["step"] - start_step, "seconds": round(state["seconds"], 1),
            "losses": state["losses"], "progress": state["progress"]}


# --------------------------------------------------------------------------------------------
# Held-out acceptance (greedy DFlash decode replayed on the target's fixed answer)
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def accepted_lengths(draft: DFlashV1Draft, data: FlatData, row: int, n_cand: int, embed: torch.Tensor,
                     lm_head: torch.Tensor, bf16: bool, chunk: int = 512) -> torch.Tensor:
    """For each anchor a in [P, P+G-1-n_cand] of `row`: how many of the draft's n_cand candidates
    (block [x_a, MASK x n_cand], context = target features of positions < a) match the answer."""
    dev = embed.device
    p, g = int(data.prompt_lens[row]), int(data.gen_lens[row])
    toks, feats = data.rows(torch.tensor([row]))
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    acc = []
    anchors_all = torch.arange(p, p + g - n_cand, device=dev)
    for s in range(0, anchors_all.numel(), chunk):
        anchors = anchors_all[s : s + chunk][None]
        batch = packed_inputs(toks, feats, anchors, n_cand + 1, draft.cfg.mask_token_id, embed)
        labels = batch.pop("labels")[0]  # [A, n_cand]
        batch.pop("label_weights", None)
        with amp:
            h = draft.forward_packed(**batch)
        h = h.view(anchors.shape[1], n_cand + 1, -1)[:, 1:].float()
        pred = (h @ lm_head.T.float()).argmax(-1)
        acc.append((pred == labels).long().cumprod(-1).sum(-1))
    return torch.cat(acc) if acc else torch.zeros(0, dtype=torch.long, device=dev)


def replay(acc: torch.Tensor, p: int) -> tuple[int, int, list[int]]:
    """Greedy DFlash decode over precomputed accepted lengths: (rounds, tokens, accepted per round)."""
    a_list = acc.tolist()
    i, rounds, toks, per = 0, 0, 0, []
    while i < len(a_list):
        a = a_list[i]
        rounds += 1
        toks += a + 1
        per.append(a)
        i += a + 1
    return rounds, toks, per


@torch.no_grad()
def heldout_acceptance(draft: DFlashV1Draft, data: FlatData, rows: Sequence[int], embed: torch.Tensor,
                       lm_head: torch.Tensor, cands: Sequence[int], bf16: bool = True) -> dict[str, Any]:
    """τ (tokens per target step) and the per-candidate acceptance of the greedy DFlash decode on held-out
    answers, for each number of candidates in `cands` (the draft run with a block of n+1), overall and per kind."""
    draft.eval()
    res: dict[str, Any] = {}
    for n in cands:
        by_kind: dict[str, list[int]] = {}
        hist = [0] * (n + 1)
        for r in rows:
            if int(data.gen_lens[r]) < n + 2:
                continue
            acc = accepted_lengths(draft, data, r, n, embed, lm_head, bf16)
            rounds, toks, per = replay(acc, int(data.prompt_lens[r]))
            for a in per:
                hist[a] += 1
            k = by_kind.setdefault(data.kinds[r], [0, 0])
            k[0] += rounds
            k[1] += toks
            k = by_kind.setdefault("all", [0, 0])
            k[0] += rounds
            k[1] += toks
        total_rounds = max(1, sum(hist))
        # P(candidate k accepted | candidates < k accepted), k = 1..n
        cond = []
        for k in range(1, n + 1):
            reached = sum(hist[k - 1 :])
            cond.append(round(sum(hist[k:]) / reached, 4) if reached else None)
        res[str(n)] = {
            "tokens_per_step": {kind: round(t / max(1, r_), 4) for kind, (r_, t) in sorted(by_kind.items())},
            "rounds": {kind: r_ for kind, (r_, _) in sorted(by_kind.items())},
            "accepted_hist": hist,
            "mean_accepted": round(sum(a * c for a, c in enumerate(hist)) / total_rounds, 4),
            "conditional_acceptance": cond,
        }
    return res


# --------------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------------
def ship_draft(draft: DFlashV1Draft, config: dict[str, Any], folder: Path, dtype: torch.dtype, extra: dict[str, Any]
               ) -> Path:
    """save_checkpoint in `dtype` (a copy: the trained fp32 draft is left alone); training metadata
    goes to training.json beside config.json (config.json stays a plain z-lab config)."""
    import copy

    save_checkpoint(copy.deepcopy(draft).to("cpu", dtype), config, folder)
    (Path(folder) / "training.json").write_text(json.dumps(extra, indent=1) + "\n", encoding="utf-8")
    return Path(folder)


def split_file(path: Path, max_bytes: int) -> list[Path]:
    """Split a file into parts of at most max_bytes (the device's per-file return limit); the parts
    are `name.part-00`, `name.part-01`, ... next to a `name.sha256`."""
    import hashlib

    data = path.read_bytes()
    (path.parent / (path.name + ".sha256")).write_text(hashlib.sha256(data).hexdigest() + "\n")
    if len(data) <= max_bytes:
        return [path]
    parts = []
    for k, s in enumerate(range(0, len(data), max_bytes)):
        part = path.parent / f"{path.name}.part-{k:02d}"
        part.write_bytes(data[s : s + max_bytes])
        parts.append(part)
    path.unlink()
    return parts


class FileLog:
    def __init__(self, path: Path | None) -> None:
        self.t0 = time.time()
        self.fh = open(path, "a", encoding="utf-8") if path else None

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        if self.fh:
            self.fh.write(line + "\n")
            self.fh.flush()


def save_data_tokens(path: Path, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int] | None],
                     ids: Sequence[str], kinds: Sequence[str]) -> None:
    """The generated data without features (a resumed or later run recomputes features in seconds)."""
    import gzip

    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as f:
        for pid, k, p, a in zip(ids, kinds, prompts, answers):
            if a is not None:
                f.write(json.dumps({"id": pid, "kind": k, "ids": list(p), "answer": list(a)}) + "\n")


def load_data_tokens(path: Path) -> dict[str, dict[str, Any]]:
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {d["id"]: d for d in (json.loads(line) for line in f if line.strip())}


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train a DFlash v1 draft from the target's own answers.")
    ap.add_argument("--target", default="smollm2", help="'smollm2', a .gguf, a HF folder, or 'random:smollm2'")
    ap.add_argument("--prompts", required=True, help="JSONL(.gz) from engine.training.corpus (rows with 'ids')")
    ap.add_argument("--out", required=True, help="results: log.txt, metrics.json, draft/")
    ap.add_argument("--work", help="checkpoints and data cache (default: --out)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-prompts", type=int, default=0, help="use at most this many prompts (0 = all)")
    ap.add_argument("--heldout", type=int, default=256, help="prompts kept out of training for acceptance")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--gen-impl", default="hf", choices=("hf", "static"),
                    help="hf: transformers generate; static: engine.training.fast_generate (static KV cache)")
    ap.add_argument("--gen-dtype", default="bfloat16", choices=("bfloat16", "float32"), help="for --gen-impl static")
    ap.add_argument("--max-feature-gib", type=float, default=0,
                    help="use the rows (in file order, held-out first) whose features fit in this many GiB (0: all)")
    ap.add_argument("--gen-until", type=float, default=0, help="stop starting generation batches after this many "
                    "seconds from the job's start (0 = no limit)")
    ap.add_argument("--feature-tokens", type=int, default=131072, help="tokens per feature forward")
    ap.add_argument("--data-cache", help="generated answers (JSONL.gz): reused when present, written otherwise")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--taps", default="1,8,15,22,27")
    ap.add_argument("--mask-token-id", type=int, default=-1, help="-1: the target's suggestion")
    ap.add_argument("--intermediate-size", type=int, default=0, help="draft MLP width (0 = the target's)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--anchors", type=int, default=256)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--short-block-frac", type=float, default=0.0, help="share of blocks trained shorter (needs "
                    "dflash_train.packed_inputs with block_lens)")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--deadline", type=float, default=0, help="seconds from the job's start by which everything "
                    "must be saved; training stops --reserve seconds before it (0 = no deadline)")
    ap.add_argument("--reserve", type=float, default=60)
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--resume", action="store_true", help="continue from WORK/ckpt.pt")
    ap.add_argument("--init-from", help="start from a saved draft folder (or a WORK/ckpt.pt) instead of a random draft")
    ap.add_argument("--eval-rows", type=int, default=256)
    ap.add_argument("--eval-cands", default="1,3,5,7")
    ap.add_argument("--ship-dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--split-mib", type=float, default=0, help="split model.safetensors into parts of this size")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    t_job = time.time()
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else out
    work.mkdir(parents=True, exist_ok=True)
    log = FileLog(out / "log.txt")
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
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
    log(f"target {args.target}: {target.config.num_hidden_layers} layers, hidden {target.config.hidden_size}, "
        f"vocab {target.config.vocab_size}, eos {info.eos_id} ({time.time() - t_job:.1f}s)")
    taps = [int(x) for x in args.taps.split(",")]
    mask_id = args.mask_token_id if args.mask_token_id >= 0 else info.mask_id
    if mask_id is None:
        raise SystemExit("no MASK token known for this target: pass --mask-token-id")

    rows = [r for r in read_rows(Path(args.prompts)) if r.ids]
    if args.max_prompts:
        rows = rows[: args.max_prompts]
    n_held = min(args.heldout, max(1, len(rows) // 10))
    held, train_rows = rows[:n_held], rows[n_held:]  # the corpus file is already shuffled
    log(f"prompts: {len(rows)} ({sum(r.kind == 'code' for r in rows)} code), held out {len(held)}")

    # ---- 1. the target's answers
    cache = Path(args.data_cache) if args.data_cache else work / "answers.jsonl.gz"
    answers: dict[str, list[int]] = {}
    if cache.is_file():
        answers = {k: v["answer"] for k, v in load_data_tokens(cache).items()}
        log(f"answers: {len(answers)} reused from {cache}")
    todo = [r for r in held + train_rows if r.id not in answers]
    if todo:
        t0 = time.time()
        # held-out answers first and never cut off (acceptance needs them)
        todo_held = [r for r in held if r.id not in answers]
        todo_train = [r for r in train_rows if r.id not in answers]
        for group, deadline in ((todo_held, None), (todo_train, (t_job + args.gen_until) if args.gen_until else None)):
            if not group:
                continue
            if args.gen_impl == "static":
                from engine.training.fast_generate import generate_answers_static

                got = generate_answers_static(target, [r.ids for r in group], args.new_tokens, args.gen_batch,
                                              info.eos_id, info.pad_id, deadline, log, args.seed,
                                              getattr(torch, args.gen_dtype))
            else:
                got = generate_answers(target, [r.ids for r in group], args.new_tokens, args.gen_batch, info.eos_id,
                                       info.pad_id, deadline, log, args.seed)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            for r, a in zip(group, got):
                if a is not None:
                    answers[r.id] = a
        gen_s = time.time() - t0
        n_tok = sum(len(answers[r.id]) for r in todo if r.id in answers)
        log(f"generation: {len(answers)} answers, {n_tok} new tokens in {gen_s:.1f}s ({n_tok / max(gen_s, 1e-9):.0f} tok/s)")
        metrics["generation"] = {"seconds": round(gen_s, 1), "new_tokens": n_tok}
        save_data_tokens(cache, [r.ids for r in held + train_rows], [answers.get(r.id) for r in held + train_rows],
                         [r.id for r in held + train_rows], [r.kind for r in held + train_rows])
    held = [r for r in held if r.id in answers]
    train_rows = [r for r in train_rows if r.id in answers]
    per_token = len(taps) * target.config.hidden_size * (2 if dev.type == "cuda" and not args.no_bf16 else 4)
    train_rows = rows_within_feature_budget(held, train_rows, answers, args.max_feature_gib, per_token, log)
    all_rows = held + train_rows
    n_eos = sum(1 for r in all_rows if answers[r.id] and answers[r.id][-1] == info.eos_id)
    n_mask = sum(answers[r.id].count(mask_id) + r.ids.count(mask_id) for r in all_rows)
    log(f"answers: {len(all_rows)} used, {n_eos} ended with EOS, MASK id {mask_id} occurs {n_mask} times in the data")

    # ---- 2. features
    feat_dtype = torch.bfloat16 if (dev.type == "cuda" and not args.no_bf16) else torch.float32
    data, fstats = build_flat_data(target, [r.ids for r in all_rows], [answers[r.id] for r in all_rows],
                                   [r.kind for r in all_rows], taps, args.feature_tokens, feat_dtype, log)
    metrics["data"] = {**fstats, "prompts_train": len(train_rows), "prompts_heldout": len(held), "answers_eos": n_eos,
                       "answer_tokens_mean": round(float(data.gen_lens.float().mean()), 1), "mask_in_data": n_mask}
    embed, lm_head = target_weights(target)
    embed, lm_head = embed.to(dev), lm_head.to(dev)
    hidden_size, n_layers_t = target.config.hidden_size, target.config.num_hidden_layers
    tcfg = target.config.to_dict()
    del target
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # ---- 3. the draft
    if args.init_from and args.init_from.endswith(".pt"):  # a training checkpoint (weights only; fresh optimizer)
        ck = Path(args.init_from)
        dcfg = json.loads((ck.parent / "draft_config.json").read_text(encoding="utf-8"))
        draft = DFlashV1Draft(dcfg)
        draft.load_state_dict(torch.load(ck, map_location="cpu", weights_only=False)["model"])
        log(f"draft initialised from the weights in {ck}")
    elif args.init_from:
        draft, dcfg = load_checkpoint(Path(args.init_from))
        log(f"draft initialised from {args.init_from}")
    else:
        dcfg = random_draft_config(tcfg, args.layers, args.block_size, taps, mask_id)
        if args.intermediate_size:
            dcfg["intermediate_size"] = args.intermediate_size
        draft = DFlashV1Draft(dcfg)
    (work / "draft_config.json").write_text(json.dumps(dcfg, indent=1), encoding="utf-8")
    n_params = sum(p.numel() for p in draft.parameters())
    log(f"draft: {dcfg['num_hidden_layers']} layers, hidden {hidden_size}, block {dcfg['block_size']}, taps {taps} "
        f"of {n_layers_t}, mask {mask_id}, {n_params / 1e6:.2f}M parameters")

    held_idx = list(range(len(held)))
    train_idx = torch.arange(len(held), len(all_rows))
    budget = None
    if args.deadline:
        budget = t_job + args.deadline - args.reserve - time.time()
        log(f"training time budget: {budget:.0f}s")
        if budget < 10:
            raise SystemExit("no time left to train")
    tc = JobTrainConfig(steps=args.steps, batch_size=args.batch, num_anchors=args.anchors, lr=args.lr,
                        min_lr_ratio=args.min_lr_ratio, warmup=args.warmup, gamma=args.gamma,
                        weight_decay=args.weight_decay, seed=args.seed, short_block_frac=args.short_block_frac, bf16=not args.no_bf16 and dev.type == "cuda",
                        time_budget_s=budget, save_every=args.save_every, log_every=args.log_every)
    tres = train(draft, data, train_idx, embed, lm_head, tc, work / "ckpt.pt", args.resume, log)
    metrics["train"] = {**{k: v for k, v in tres.items() if k != "losses"}, "config": asdict(tc),
                        "loss_first": tres["losses"][0][1] if tres["losses"] else None,
                        "loss_last": tres["losses"][-1][1] if tres["losses"] else None, "losses": tres["losses"]}

    # ---- 4. held-out acceptance and the shipped draft
    t0 = time.time()
    cands = [int(x) for x in args.eval_cands.split(",") if 0 < int(x) < dcfg["block_size"]]
    acc = heldout_acceptance(draft, data, held_idx[: args.eval_rows], embed, lm_head, cands, bf16=tc.bf16)
    metrics["heldout"] = acc
    for n, r in acc.items():
        log(f"held-out acceptance, {n} candidates: tokens/step {r['tokens_per_step']}, "
            f"P(accept k | k-1) {r['conditional_acceptance']}")
    log(f"evaluation: {time.time() - t0:.1f}s")
    ship_dtype = getattr(torch, args.ship_dtype)
    extra = {"recipe": "engine.training.gpu_job (self-distilled, DFlash block mask, position-decayed CE)",
             "steps": tres["steps"], "loss_last": metrics["train"]["loss_last"],
             "heldout_tokens_per_step": {n: r["tokens_per_step"].get("all") for n, r in acc.items()}}
    folder = ship_draft(draft, dcfg, out / "draft", ship_dtype, extra)
    size = (folder / "model.safetensors").stat().st_size
    metrics["draft"] = {"parameters": n_params, "safetensors_bytes": size, "dtype": args.ship_dtype}
    if args.split_mib:
        parts = split_file(folder / "model.safetensors", int(args.split_mib * 2**20))
        metrics["draft"]["parts"] = [p.name for p in parts]
    metrics["seconds_total"] = round(time.time() - t_job, 1)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    log(f"saved {folder} ({size / 2**20:.2f} MiB {args.ship_dtype}); job {metrics['seconds_total']}s")
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
