"""The request's logit processors, applied per position: the same for the target's p and the draft's q.

Order (as openvino_genai and Hugging Face apply them): repetition / presence / frequency
penalties, min_new_tokens (stop tokens masked), temperature, top-k, top-p, min-p. Penalties and
min_new_tokens see the history AT that position: the committed tokens plus the drafted tokens
before it, which are exactly the tokens that will have been accepted if that position is examined.
"""
from __future__ import annotations

import math

import numpy as np

from engine.config import GenerationConfig
from engine.sampling.distribution import Dist


def needs_logits(cfg: GenerationConfig) -> bool:
    """Whether a request needs full logits (sampling, penalties, min_new_tokens) or only argmax ids."""
    return (cfg.do_sample or cfg.repetition_penalty != 1.0 or cfg.presence_penalty != 0.0
            or cfg.frequency_penalty != 0.0 or cfg.min_new_tokens > 0)


class LogitsProcessor:
    """Per-request state: which tokens were seen (prompt + output) and how often each was generated."""

    def __init__(self, cfg: GenerationConfig, vocab: int, prompt_ids: list[int], stop_ids: set[int]) -> None:
        self.cfg = cfg
        self.vocab = vocab
        self.stop_ids = np.array(sorted(t for t in stop_ids if 0 <= t < vocab), np.int64)
        self.seen = np.zeros(vocab, bool)  # prompt + generated, for the repetition penalty
        self.seen[[t for t in prompt_ids if 0 <= t < vocab]] = True
        self.counts = np.zeros(vocab, np.int64)  # generated only, for presence / frequency
        self.generated = 0

    def commit(self, tokens: list[int]) -> None:
        for t in tokens:
            if 0 <= t < self.vocab:
                self.seen[t] = True
                self.counts[t] += 1
        self.generated += len(tokens)

    def _penalised(self, logits: np.ndarray, prefix: list[int]) -> np.ndarray:
        cfg = self.cfg
        x = logits.astype(np.float64)
        if cfg.repetition_penalty != 1.0:
            ids = np.union1d(np.flatnonzero(self.seen), np.array(prefix, np.int64))
            vals = x[ids]
            x[ids] = np.where(vals > 0, vals / cfg.repetition_penalty, vals * cfg.repetition_penalty)
        if cfg.presence_penalty or cfg.frequency_penalty:
            counts = self.counts
            if prefix:
                counts = counts.copy()
                np.add.at(counts, np.array(prefix, np.int64), 1)
            used = np.flatnonzero(counts)
            x[used] -= cfg.presence_penalty + cfg.frequency_penalty * counts[used]
        if self.generated + len(prefix) < cfg.min_new_tokens and self.stop_ids.size:
            x[self.stop_ids] = -math.inf
        return x

    def distribution(self, logits: np.ndarray, prefix: list[int] | None = None) -> Dist:
        """The distribution to sample (or take the argmax of) at a position after `prefix`."""
        prefix = prefix or []
        x = self._penalised(logits, prefix)
        if not self.cfg.do_sample:
            best = int(np.argmax(x))
            return Dist(np.ones(1), np.array([best]))
        x /= self.cfg.temperature
        ids: np.ndarray | None = None
        if 0 < self.cfg.top_k < self.vocab:
            ids = np.argpartition(-x, self.cfg.top_k - 1)[: self.cfg.top_k]
            x = x[ids]
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        if self.cfg.top_p < 1.0:
            ids, probs = _top_p(ids, probs, self.cfg.top_p)
        if self.cfg.min_p > 0.0:
            keep = probs >= self.cfg.min_p * probs.max()
            if not keep.all():
                ids = np.flatnonzero(keep) if ids is None else ids[keep]
                probs = probs[keep]
        return Dist(probs / probs.sum(), ids)


def _top_p(ids: np.ndarray | None, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Smallest set of most likely tokens whose mass reaches top_p, without sorting the whole vocabulary.

    Sorts the m largest entries (m = 64, doubled until their mass reaches top_p); only a flat
    distribution ever sorts everything.
    """
    n = len(probs)
    m = min(64, n)
    while True:
        part = np.argpartition(-probs, m - 1)[:m] if m < n else np.arange(n)
        order = part[np.argsort(-probs[part], kind="stable")]
        cum = np.cumsum(probs[order])
        if cum[-1] >= top_p or m == n:
            k = int(np.searchsorted(cum, top_p, side="left")) + 1
            sel = order[: min(k, len(order))]
            return (sel if ids is None else ids[sel]), probs[sel]
        m = min(2 * m, n)
