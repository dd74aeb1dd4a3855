"""The candidate selector: one place that turns a draft inference into candidates for every variant.

- no head: each row's argmax (greedy) or a draw from the processed row (sampled): rows are
  independent of each other.
- Top-K candidate scorer (K > 0): the backbone's K best ids per row come out of the graph; ONE
  scorer inference scores every (predecessor, candidate) pair of neighbouring rows of every
  request in the step; the walk picks each candidate after the one before it (greedy) or draws it
  from softmax(E / T) over the K (sampled; that sparse distribution is the proposal the verifier
  needs).
- dense Markov walk (K = 0, DSpark): one head inference per block position, for all requests that
  walk densely, biases each whole row by the token drafted before it.
docs/draft-contract.md defines the head IRs; engine/drafting/draft_batch.py runs the backbone.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from engine.drafting.draft_batch import DraftBatch, DraftCall, DraftRows
from engine.sampling.distribution import Dist
from engine.sampling.processors import LogitsProcessor

PEAK_TOP_K = 8  # a draft without a scorer still asks its graph for this many best logits per row: their peak


@dataclass
class Drafted:
    tokens: list[int]
    proposals: list[Dist] = field(default_factory=list)  # the distribution each token was drawn from (sampled)
    head_ms: float = 0.0
    confidence: list[float] | None = None
    # Per position, the largest probability of the distribution the token there was chosen from (before it
    # was chosen: it depends on the tokens drafted before, never on the token itself): how sure the draft is.
    peak: list[float] = field(default_factory=list)


@dataclass
class SamplingSpec:
    """What a sampled request brings to drafting: its processors and the draft's own RNG."""

    processor: LogitsProcessor
    rng: np.random.Generator
    temperature: float


@dataclass
class DraftJob:
    """One request's drafting in a step: the backbone call plus how to choose its candidates."""

    call: DraftCall
    top_k: int  # the scorer's K (0 = dense walk); ignored without a head
    sampling: SamplingSpec | None = None


def _softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = x.astype(np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def _peak(logits: np.ndarray) -> float:
    """The largest softmax probability of a row of logits (at temperature 1; -inf entries count as 0)."""
    z = np.asarray(logits, np.float64)
    return float(1.0 / np.exp(z - z.max()).sum())


def draft_candidates(batch: DraftBatch, jobs: list[DraftJob]) -> tuple[list[Drafted], float]:
    """Run the backbone once for all jobs and choose their candidates; returns (per job, head ms)."""
    info = batch.info
    k_max = max((j.top_k if info.has_head and j.top_k > 0 else PEAK_TOP_K) for j in jobs)
    rows = batch.run([j.call for j in jobs], k_max)
    out: list[Drafted | None] = [None] * len(jobs)
    head_ms = 0.0
    if not info.has_head:
        for i, (job, r) in enumerate(zip(jobs, rows)):
            out[i] = _unary(job, r)
    else:
        scored = [i for i, j in enumerate(jobs) if j.top_k > 0]
        dense = [i for i, j in enumerate(jobs) if j.top_k == 0]
        if scored:
            walks, ms = _topk_walks(batch, [jobs[i] for i in scored], [rows[i] for i in scored], k_max)
            head_ms += ms
            for i, d in zip(scored, walks):
                out[i] = d
        if dense:
            walks, ms = _dense_walks(batch, [jobs[i] for i in dense], [rows[i] for i in dense])
            head_ms += ms
            for i, d in zip(dense, walks):
                out[i] = d
    if info.confidence_source == "backbone":
        for d, r in zip(out, rows):
            d.confidence = [float(c) for c in r.output("confidence")]
    return out, head_ms


def _unary(job: DraftJob, rows: DraftRows) -> Drafted:
    if job.sampling is None:  # the peak over the row's best PEAK_TOP_K logits (the rest of the row adds little)
        return Drafted([int(t) for t in rows.topk_ids[:, 0]], peak=[_peak(r) for r in rows.topk_logits])
    logits = rows.logits()
    out = Drafted([])
    for j in range(rows.n):
        q = job.sampling.processor.distribution(logits[j], out.tokens)
        out.peak.append(float(q.probs.max()))
        out.tokens.append(q.sample(job.sampling.rng.random()))
        out.proposals.append(q)
    return out


def _topk_walks(batch: DraftBatch, jobs: list[DraftJob], rows: list[DraftRows], k_max: int
                ) -> tuple[list[Drafted], float]:
    """One scorer inference over every job's rows, then each job's walk over its own K columns."""
    ids = [r.topk_ids.astype(np.int64) for r in rows]  # [n, K_max] each
    pred = []
    for job, cand in zip(jobs, ids):
        p = np.empty_like(cand)
        p[0, :] = job.call.anchor
        p[1:] = cand[:-1]
        pred.append(p)
    t0 = time.perf_counter()
    scorer = batch.model.scorer
    batch.model.scorer_inputs.feed({"predecessor_ids": np.concatenate(pred), "candidate_ids": np.concatenate(ids),
                                    "draft_hidden_states": np.concatenate([r.hidden for r in rows])})
    batch.model.scorer_inputs.run()
    bias = scorer.get_tensor("edge_bias").data  # [sum n, K, K]
    conf = scorer.get_tensor("confidence").data if batch.info.confidence_source == "markov_head" else None
    head_ms = (time.perf_counter() - t0) * 1e3
    out, at = [], 0
    for job, r, cand in zip(jobs, rows, ids):
        k = job.top_k
        d = Drafted([], confidence=[] if conf is not None else None)
        prev = 0  # row 0: every predecessor is the anchor
        for p in range(r.n):
            if conf is not None:
                d.confidence.append(float(conf[at + p, prev]))
            edge = r.topk_logits[p, :k] + bias[at + p, prev, :k]
            if job.sampling is None:
                j = int(np.argmax(edge))
                d.peak.append(_peak(edge))
            else:
                q = Dist(_softmax(edge, job.sampling.temperature), cand[p, :k].copy())
                d.peak.append(float(q.probs.max()))
                j = int(np.flatnonzero(q.ids == q.sample(job.sampling.rng.random()))[0])
                d.proposals.append(q)
            d.tokens.append(int(cand[p, j]))
            prev = j
        at += r.n
        out.append(d)
    return out, head_ms


def _dense_walks(batch: DraftBatch, jobs: list[DraftJob], rows: list[DraftRows]) -> tuple[list[Drafted], float]:
    """The dense walk of every job at once: one head inference per block position."""
    head = batch.model.dense_head
    logits = [r.logits() for r in rows]
    with_conf = batch.info.confidence_source == "markov_head"
    out = [Drafted([], confidence=[] if with_conf else None) for _ in jobs]
    prev = [job.call.anchor for job in jobs]
    head_ms = 0.0
    for p in range(max(r.n for r in rows)):
        live = [i for i, r in enumerate(rows) if p < r.n]
        t0 = time.perf_counter()
        batch.model.dense_inputs.feed({"predecessor_ids": np.array([prev[i] for i in live], np.int64),
                                       "draft_hidden_states": np.stack([rows[i].hidden[p] for i in live])})
        batch.model.dense_inputs.run()
        bias = head.get_tensor("bias").data
        conf = head.get_tensor("confidence").data if with_conf else None
        head_ms += (time.perf_counter() - t0) * 1e3
        for b, i in enumerate(live):
            row = logits[i][p] + bias[b]
            if with_conf:
                out[i].confidence.append(float(conf[b]))
            sampling = jobs[i].sampling
            if sampling is None:
                prev[i] = int(np.argmax(row))
                out[i].peak.append(_peak(row))
            else:
                q = sampling.processor.distribution(row, out[i].tokens)
                out[i].peak.append(float(q.probs.max()))
                prev[i] = q.sample(sampling.rng.random())
                out[i].proposals.append(q)
            out[i].tokens.append(prev[i])
    return out, head_ms
