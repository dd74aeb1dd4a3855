"""Held-out acceptance of a draft, in torch: τ (tokens per target step) at each candidate count.

For a greedy target the decode's output is the target's own fixed answer, so for every anchor of a
held-out answer one packed pass gives how many of the draft's n candidates match it (for each walk:
"none" = argmax of U, "topk" = DSpark's Top-K scorer or DFlash v2's selector walk, "dense" = DSpark's
dense Markov walk; the batched forms of engine/drafts/walks.py), and the greedy decode is replayed
over those lengths: start at the first answer token, accept a, commit a + 1, jump. Only the last
block of each answer, which would run past it, is not counted. `simulate_acceptance` is the slow
reference (a real decode against the HF target) the replay is checked against.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from engine.drafts.dflash2 import DFlash2Draft
from engine.drafts.dflash2 import reference_step as dflash2_step
from engine.drafts.dflash_v1 import DFlashV1Draft, KVCache
from engine.drafts.dspark import DSparkDraft
from engine.drafts.dspark import reference_step as dspark_step
from engine.drafts.walks import WalkResult, as_tensor, run_backbone
from engine.training.data import FlatData
from engine.training.losses import SubVocab
from engine.training.packing import packed_inputs, tapped_hidden, target_weights

WALKS = ("none", "topk", "dense")


def candidate_offset(draft: DFlashV1Draft) -> int:
    """0 for DSpark (every block row is a candidate), 1 for DFlash v1 / v2 (the anchor row is not)."""
    return int(getattr(draft, "candidate_offset", 1))


def has_head(draft: DFlashV1Draft) -> bool:
    """A Markov head (DSpark) or the candidate selector (DFlash v2): the Top-K walk means something."""
    return isinstance(draft, DFlash2Draft) or (isinstance(draft, DSparkDraft) and draft.markov_head is not None)


def unary_logits(draft: DFlashV1Draft, rows: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    if isinstance(draft, (DSparkDraft, DFlash2Draft)):
        return draft.unary_logits(rows, lm_head)
    return rows @ lm_head.T


def tau(result: dict[str, Any], mode: str) -> dict[str, float]:
    """{candidates: τ over all held-out rows} for one walk of a heldout_acceptance result."""
    return {n: per[mode]["tokens_per_step"].get("all", 0.0) for n, per in result.items() if mode in per}


@torch.no_grad()
def walk_blocks(draft: DFlashV1Draft, h: torch.Tensor, unary: torch.Tensor, anchor_ids: torch.Tensor, mode: str,
                top_k: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """h [M, n, H] (the candidate rows), unary [M, n, V] (float32), anchor_ids [M] -> drafted tokens
    [M, n] for one walk. "topk" is DSpark's Top-K scorer or DFlash v2's selector walk (the same lattice).
    `ids` [S]: unary is over this sub-vocabulary (V = S), as the exported draft scores it."""
    m, n, _ = unary.shape
    to_ids = (lambda x: x) if ids is None else (lambda x: ids[x])
    if mode == "none" or not has_head(draft):
        return to_ids(unary.argmax(-1))
    if mode == "topk":
        vals, cand = torch.topk(unary, top_k, dim=-1)  # [M, n, K], best first
        cand = to_ids(cand)
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
            logits = unary[:, p] + draft.dense_bias(prev, h[:, p], ids).float()
            prev = to_ids(logits.argmax(-1))
            out.append(prev)
        return torch.stack(out, 1)
    raise ValueError(f"mode must be one of {', '.join(WALKS)}, got {mode!r}")


@torch.no_grad()
def accepted_lengths(draft: DFlashV1Draft, data: FlatData, rows: Sequence[int], n_cand: int,
                            embed: torch.Tensor, lm_head: torch.Tensor, modes: Sequence[str], top_k: int, bf16: bool,
                            max_blocks: int = 4096, vocab: SubVocab | None = None) -> dict[str, list[torch.Tensor]]:
    """For every anchor a in [P, P+G-1-n] of each row: how many of the n candidates each walk drafts
    (block [x_a, MASK x (n-1)] for DSpark, [x_a, MASK x n] for DFlash v2 (offset 1), context = the
    target's features of positions < a) match the answer. Rows are batched; returns
    {mode: [accepted [G-n] per row]}."""
    off = candidate_offset(draft)
    rows_blk = n_cand + off
    dev = embed.device
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    w_head = (lm_head if vocab is None else vocab.lm_head).float()
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
        unary = unary_logits(draft, h, w_head)
        for m in modes:
            drafted = walk_blocks(draft, h, unary, anchor_ids, m, top_k, None if vocab is None else vocab.ids)
            per_mode[m].append((drafted == labels).long().cumprod(-1).sum(-1).view(b, a))
        del unary, h
    for m in modes:
        acc = torch.cat(per_mode[m], 1) if per_mode[m] else torch.zeros(len(rows), 0, dtype=torch.long, device=dev)
        out[m] = [acc[i, : int(counts[i])] for i in range(len(rows))]
    return out


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
                              lm_head: torch.Tensor, cands: Sequence[int], modes: Sequence[str] = WALKS,
                              top_k: int = 8, bf16: bool = True, rows_per_pass: int = 16,
                              vocab: SubVocab | None = None) -> dict[str, Any]:
    """τ (tokens per target step: accepted drafts + the target's own token) of the greedy decode
    replayed on held-out answers, per walk and number of candidates, overall and per kind, with
    P(candidate k accepted | 1..k-1 accepted); over the sub-vocabulary `vocab` where the draft has one."""
    draft.eval()
    modes = [m for m in modes if m == "none" or (has_head(draft) and not (m == "dense" and isinstance(draft, DFlash2Draft)))]
    cands = [n for n in cands if 0 < n <= draft.cfg.block_size - candidate_offset(draft)]
    res: dict[str, Any] = {}
    for n in cands:
        keep = [r for r in rows if int(data.gen_lens[r]) >= n + 2]
        tally = {m: ({}, [0] * (n + 1)) for m in modes}
        for s in range(0, len(keep), rows_per_pass):
            group = keep[s : s + rows_per_pass]
            accs = accepted_lengths(draft, data, group, n, embed, lm_head, modes, top_k, bf16, vocab=vocab)
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


@dataclass
class AcceptanceStats:
    rounds: int
    tokens: int
    accepted_drafts: int
    drafted: int

    @property
    def tokens_per_round(self) -> float:
        """τ: committed tokens per target call (accepted drafts + the target's own token)."""
        return self.tokens / max(1, self.rounds)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_drafts / max(1, self.drafted)



@torch.no_grad()
def v1_step(draft: DFlashV1Draft, embed: Any, lm_head: Any, anchor: int, context: Any, num_candidates: int,
            mode: str = "none", top_k: int | None = None, past_key_values: KVCache | None = None,
            start_position: int | None = None) -> WalkResult:
    """One DFlash v1 draft step: block [anchor, MASK x N] -> N argmax candidates (rows 1..N)."""
    import numpy as np

    e, w = as_tensor(embed), as_tensor(lm_head)
    ids = torch.tensor([int(anchor)] + [draft.cfg.mask_token_id] * int(num_candidates))
    h, kv = run_backbone(draft, e[ids], context, past_key_values, start_position)
    unary = h[1:] @ w.T
    return WalkResult(unary.argmax(-1).numpy().astype(np.int64), h[1:], unary, None, kv)


@torch.no_grad()
def simulate_acceptance(
    target: Any,
    draft: DFlashV1Draft,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 48,
    mode: str = "topk",
    top_k: int | None = None,
    num_candidates: int | None = None,
) -> AcceptanceStats:
    """Greedy speculative decode of each prompt with the draft's reference walk and the HF target
    (full recompute, the draft keeps its context K/V across steps as the IR's state does). The output
    equals the target's greedy output by construction; what is measured is how much is accepted."""
    step_fn = dspark_step if isinstance(draft, DSparkDraft) else dflash2_step if isinstance(draft, DFlash2Draft) else v1_step
    layer_ids = draft.cfg.target_layer_ids
    n_cand = num_candidates or (draft.cfg.block_size - candidate_offset(draft))
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
