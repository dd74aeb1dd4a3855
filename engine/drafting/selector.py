"""The candidate selector: one place that turns a draft inference into N candidates for every variant.

- no head: each row's argmax (greedy) or a draw from the processed row (sampled): rows are
  independent of each other.
- Top-K candidate scorer (K > 0): the backbone's K best ids per row come out of the graph; ONE
  scorer inference scores every (predecessor, candidate) pair of neighbouring rows; the walk picks
  each candidate after the one before it (greedy) or draws it from softmax(E / T) over the K
  (sampled; that sparse distribution is the proposal the verifier needs).
- dense Markov walk (K = 0, DSpark): one head inference per position biases the whole row by the
  token drafted before it.
docs/draft-contract.md defines the head IRs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from engine.models.draft import DraftModel
from engine.sampling.distribution import Dist
from engine.sampling.processors import LogitsProcessor


@dataclass
class Drafted:
    tokens: list[int]
    proposals: list[Dist] = field(default_factory=list)  # the distribution each token was drawn from (sampled)
    head_ms: float = 0.0
    confidence: list[float] | None = None


@dataclass
class SamplingSpec:
    """What a sampled request brings to drafting: its processors and the draft's own RNG."""

    processor: LogitsProcessor
    rng: np.random.Generator
    temperature: float


def _softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = x.astype(np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def select_candidates(model: DraftModel, anchor: int, n: int, context: np.ndarray, top_k: int,
                      sampling: SamplingSpec | None = None) -> Drafted:
    """Run the draft once and choose n candidates; `top_k` is the scorer's K (0 = dense walk)."""
    info = model.info
    if not info.has_head:
        ids = model.draft(anchor, n, context, top_k=1)
        out = Drafted([int(t) for t in ids[:, 0]])
        if sampling is not None:
            rows = model.output("draft_logits")
            out.tokens = []
            for j in range(n):
                q = sampling.processor.distribution(rows[j], out.tokens)
                out.tokens.append(q.sample(sampling.rng.random()))
                out.proposals.append(q)
    elif top_k > 0:
        out = _topk_walk(model, anchor, n, context, top_k, sampling)
    else:
        out = _dense_walk(model, anchor, n, context, sampling)
    if info.confidence_source == "backbone":
        out.confidence = [float(c) for c in model.output("confidence")[:n]]
    return out


def _topk_walk(model: DraftModel, anchor: int, n: int, context: np.ndarray, k: int,
               sampling: SamplingSpec | None) -> Drafted:
    ids = model.draft(anchor, n, context, top_k=k).astype(np.int64)  # [n, K]
    unary = model.output("draft_topk_logits")  # [n, K]
    hidden = model.output("last_hidden_state")  # [n, H]
    pred = np.empty_like(ids)
    pred[0, :] = anchor
    pred[1:] = ids[:-1]
    t0 = time.perf_counter()
    model.scorer.infer({"predecessor_ids": pred, "candidate_ids": ids,
                        "draft_hidden_states": np.ascontiguousarray(hidden[:n])},
                       share_inputs=True, share_outputs=True)
    edges = unary[:, None, :] + model.scorer.get_tensor("edge_bias").data  # [n, K, K]
    out = Drafted([], head_ms=(time.perf_counter() - t0) * 1e3)
    head_confidence = (model.scorer.get_tensor("confidence").data
                       if model.info.confidence_source == "markov_head" else None)  # [n, K]
    if head_confidence is not None:
        out.confidence = []
    prev = 0  # row 0: every predecessor is the anchor
    for p in range(n):
        if head_confidence is not None:
            out.confidence.append(float(head_confidence[p, prev]))
        row = edges[p, prev]
        if sampling is None:
            j = int(np.argmax(row))
        else:
            q = Dist(_softmax(row, sampling.temperature), ids[p].copy())
            j = int(np.flatnonzero(q.ids == q.sample(sampling.rng.random()))[0])
            out.proposals.append(q)
        out.tokens.append(int(ids[p, j]))
        prev = j
    return out


def _dense_walk(model: DraftModel, anchor: int, n: int, context: np.ndarray,
                sampling: SamplingSpec | None) -> Drafted:
    model.draft(anchor, n, context, top_k=1)
    rows = model.output("draft_logits")  # [n, V]
    hidden = model.output("last_hidden_state")
    out = Drafted([], confidence=[] if model.info.confidence_source == "markov_head" else None)
    prev = anchor
    for p in range(n):
        t0 = time.perf_counter()
        model.dense_head.infer({"predecessor_ids": np.array([prev], np.int64),
                                "draft_hidden_states": np.ascontiguousarray(hidden[p: p + 1])},
                               share_inputs=True, share_outputs=True)
        logits = rows[p] + model.dense_head.get_tensor("bias").data[0]
        out.head_ms += (time.perf_counter() - t0) * 1e3
        if out.confidence is not None:
            out.confidence.append(float(model.dense_head.get_tensor("confidence").data[0]))
        if sampling is None:
            prev = int(np.argmax(logits))
        else:
            q = sampling.processor.distribution(logits, out.tokens)
            prev = q.sample(sampling.rng.random())
            out.proposals.append(q)
        out.tokens.append(prev)
    return out
