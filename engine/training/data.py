"""The training data of a draft: the target's answers and its tapped features, stored flat.

Answers are the target's own greedy continuations (spec §1.6): generated in batches of similar
length, left padded, by the static-cache generator (engine/training/fast_generate.py) or HF
`generate`, and kept in an answers cache (JSONL.gz rows {id, kind, ids, answer}) so that a resumed
or later run never answers a prompt twice. Features are one causal forward per batch of
right-padded prompt+answer sequences, the tapped layers' outputs concatenated (bf16 on a GPU),
either stored for every row once (what fits the feature cap) or computed again for each batch
("online": no cap, every answered row trains, at the price of a target forward per step).
"""
from __future__ import annotations

import gzip
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from engine.training.packing import tapped_hidden, target_weights

Log = Callable[[str], None]


@dataclass
class FlatData:
    """Sequences (prompt + the target's answer) concatenated: row i is tokens[offsets[i]:offsets[i+1]].

    `features` holds every token's tapped hidden states, or is None when `tap` computes them per
    batch (online features: the stored ones bound a stage to the rows that fit in memory)."""

    tokens: torch.Tensor  # [T] int64
    features: torch.Tensor | None  # [T, n*H] (bf16 on GPU, f32 on CPU); None: computed by `tap`
    offsets: torch.Tensor  # [N+1] int64
    prompt_lens: torch.Tensor  # [N] int64
    gen_lens: torch.Tensor  # [N] int64: answer tokens, EOS included when the target stopped
    kinds: list[str]
    tap: Callable[[torch.Tensor], torch.Tensor] | None = None  # right-padded tokens [b, L] -> [b, L, n*H]
    tap_tokens: int = 131072  # online: rows per target forward so that rows x width stays within this

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
        if self.features is not None:
            feats = self.features[gidx]
        else:
            per = max(1, self.tap_tokens // width)
            feats = torch.cat([self.tap(toks[i: i + per]) for i in range(0, toks.shape[0], per)])
        return toks, feats * valid[..., None].to(feats.dtype)


def target_tap(target: Any, layer_ids: Sequence[int], feat_dtype: torch.dtype,
               compute_dtype: torch.dtype | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The features of a right-padded batch: one causal forward, outside any autocast of the draft's
    step; in the target's own precision (what build_flat_data stores), or under autocast to
    `compute_dtype` (bf16 on a GPU: the forward runs every step, and f32 costs several times more;
    docs/training.md has the times)."""

    @torch.no_grad()
    def tap(toks: torch.Tensor) -> torch.Tensor:
        with torch.autocast(toks.device.type, dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None):
            out = target(input_ids=toks, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        return tapped_hidden(out.hidden_states, layer_ids).to(feat_dtype)

    return tap


@torch.no_grad()
def generate_answers_hf(
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
    online: bool = False,
    online_dtype: torch.dtype | None = None,
) -> tuple[FlatData, dict[str, Any]]:
    """Record the target's tapped hidden states for prompt+answer sequences (one causal forward per
    batch, right padding: valid rows never see the padding). Also checks that the target's argmax
    at each answer position reproduces the answer (teacher forcing vs generation agreement).
    `online`: store nothing (the data computes each batch's features when asked, under autocast to
    `online_dtype` if given) and run the forwards only until the agreement check has its positions."""
    dev = next(target.parameters()).device
    seqs = [list(p) + list(a) for p, a in zip(prompts, answers)]
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lens, 0)
    total = int(offsets[-1])
    n_h = len(layer_ids) * target.config.hidden_size
    tokens = torch.tensor([t for s in seqs for t in s], dtype=torch.long, device=dev)
    features = None if online else torch.empty(total, n_h, dtype=feat_dtype, device=dev)
    _, lm_head = target_weights(target)
    order = sorted(range(len(seqs)) if not online else _check_sample(prompts, answers, check_positions),
                   key=lambda i: lens[i])
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
            if features is not None:
                features[offsets[k] : offsets[k] + n_k] = f[r, :n_k].to(feat_dtype)
            p_k = len(prompts[k])
            if n_k > p_k and checked < check_positions:  # positions p_k-1 .. n_k-2 predict answer tokens p_k .. n_k-1
                pred = (last[r, p_k - 1 : n_k - 1] @ lm_head.T).argmax(-1)
                agree += int((pred == x[r, p_k:n_k]).sum())
                checked += n_k - p_k
        del out, f, last
        i = j
    stored_gib = 0.0 if features is None else total * n_h * features.element_size() / 2**30
    stats = {"sequences": len(seqs), "tokens": total, "feature_gib": stored_gib, "online": online,
             "checked_positions": checked, "teacher_forced_agreement": agree / max(1, checked),
             "seconds": round(time.time() - t0, 1)}
    where = "computed per batch (online)" if online else f"{stored_gib:.2f} GiB {feat_dtype}"
    log(f"features: {total} tokens x {n_h} ({where}), teacher-forced argmax = generated token on "
        f"{100 * stats['teacher_forced_agreement']:.2f}% of {checked} answer positions, {stats['seconds']}s")
    data = FlatData(tokens, features, offsets.to(dev), torch.tensor([len(p) for p in prompts]).to(dev),
                    torch.tensor([len(a) for a in answers]).to(dev), list(kinds),
                    tap=target_tap(target, layer_ids, feat_dtype, online_dtype) if online else None, tap_tokens=token_budget)
    return data, stats


def _check_sample(prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], positions: int) -> list[int]:
    """Rows in a seeded random order until their answers hold `positions` tokens: what the agreement
    check reads when no features are stored (the shortest rows first would not be a fair sample)."""
    keep, n = [], 0
    for i in _shuffled(len(prompts), 0):
        if n >= positions:
            break
        keep.append(i)
        n += len(answers[i])
    return keep


def _shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def answering_order(held: Sequence[Any], train_rows: Sequence[Any], seed: int) -> list[Any]:
    """The held-out rows, then the training rows in a seeded random order: answering in this order
    and stopping once the features are full (`features_full`) answers a uniform sample of the stage,
    not every row only to drop half of them at the feature cap."""
    return list(held) + [train_rows[i] for i in _shuffled(len(train_rows), seed)]


def _row_tokens(row: Any, answers: dict[str, list[int]]) -> int:
    """Feature tokens of an answered row: its prompt and its answer."""
    return len(row.ids) + len(answers[row.id])


def _feature_room(gib: float, bytes_per_token: int) -> int:
    """Feature tokens that fit in `gib` GiB."""
    return int(gib * 2**30 / bytes_per_token)


def features_full(rows: Sequence[Any], answers: dict[str, list[int]], gib: float, bytes_per_token: int) -> bool:
    """Whether the answered rows among `rows` already hold more feature tokens than `gib` GiB."""
    if not gib:
        return False
    return sum(_row_tokens(r, answers) for r in rows if r.id in answers) > _feature_room(gib, bytes_per_token)


def rows_within_feature_budget(held: Sequence[Any], train_rows: Sequence[Any], answers: dict[str, list[int]],
                               gib: float, bytes_per_token: int, log: Log = print, seed: int = 0) -> list[Any]:
    """The training rows whose features fit in `gib` GiB together with the held-out rows', in their order.

    When not all fit, a seeded uniform sample is kept, so every source stays in proportion: a prefix
    of the stage's rows (newest sources first) dropped the oldest sources whole, and a stage run on
    one GPU then trained on its new turns alone and lost what the held-out rows measure."""
    if not gib:
        return list(train_rows)
    sizes = [_row_tokens(r, answers) for r in train_rows]
    room = _feature_room(gib, bytes_per_token) - sum(_row_tokens(r, answers) for r in held)
    if sum(sizes) <= room:
        return list(train_rows)
    order = _shuffled(len(train_rows), seed)
    keep: list[int] = []
    for i in order:
        if sizes[i] > room:
            break
        room -= sizes[i]
        keep.append(i)
    kept = [train_rows[i] for i in sorted(keep)]
    log(f"features: {len(kept)} of {len(train_rows)} training rows fit in {gib} GiB (a uniform sample)")
    return kept


def generate_answers(target: Any, prompts: Sequence[Sequence[int]], new_tokens: int, batch_size: int, eos_id: int,
                     pad_id: int, deadline: float | None = None, log: Log = print, seed: int = 0,
                     static: bool = True, dtype: torch.dtype = torch.bfloat16, temperature: float = 0.0,
                     top_p: float = 1.0) -> list[list[int] | None]:
    """The static-cache generator (Llama / Qwen2 / Qwen3), or HF generate for greedy answers when
    `static` is False; None for prompts not reached before `deadline`."""
    if static:
        from engine.training.fast_generate import generate_answers_static

        return generate_answers_static(target, prompts, new_tokens, batch_size, eos_id, pad_id, deadline, log, seed,
                                       dtype, temperature, top_p)
    if temperature > 0:
        raise ValueError("sampled generation needs the static generator")
    return generate_answers_hf(target, prompts, new_tokens, batch_size, eos_id, pad_id, deadline, log, seed)


@torch.no_grad()
def greedy_continuations(target: Any, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    """The target's exact greedy continuation of each prompt, `new_tokens` long, no EOS stop and no
    padding (prompts of equal length run together): tiny test fixtures memorise these."""
    out: list[list[int] | None] = [None] * len(prompts)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for idx in by_len.values():
        ids = torch.tensor([list(prompts[i]) for i in idx])
        res = target(input_ids=ids, use_cache=True)
        toks = [res.logits[:, -1:].argmax(-1)]
        past = res.past_key_values
        for _ in range(new_tokens - 1):
            res = target(input_ids=toks[-1], past_key_values=past, use_cache=True)
            past = res.past_key_values
            toks.append(res.logits[:, -1:].argmax(-1))
        gen = torch.cat(toks, 1).tolist()
        for j, i in enumerate(idx):
            out[i] = gen[j]
    return [list(a) for a in out]  # type: ignore[arg-type]


def save_answers(path: Path, rows: Sequence[Any], answers: dict[str, list[int]]) -> None:
    """The answers cache (rows with `id`, `kind`, `ids`), written atomically; unanswered rows are left out."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
        for r in rows:
            if r.id in answers:
                f.write(json.dumps({"id": r.id, "kind": r.kind, "ids": list(r.ids), "answer": answers[r.id]}) + "\n")
    tmp.replace(path)


def load_answers(path: Path) -> dict[str, dict[str, Any]]:
    """id -> {id, kind, ids, answer} of an answers cache ({} when there is none)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {d["id"]: d for d in (json.loads(line) for line in f if line.strip())}
