"""Token distributions in target ids, sparse or dense, with float64 sums and float64 draws.

float64 matters: a float32 uniform has 2^-24 resolution, so tokens whose probability is below that
could never be drawn, and float32 cumulative sums over 49k-150k entries drift.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Dist:
    """Probabilities `probs` (float64, summing to 1) over `ids`, or over the whole vocabulary."""

    probs: np.ndarray
    ids: np.ndarray | None = None  # None = dense: probs[i] is token i

    def prob(self, token: int) -> float:
        if self.ids is None:
            return float(self.probs[token]) if 0 <= token < len(self.probs) else 0.0
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def probs_at(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of `tokens` (0 outside the support), without densifying a sparse support."""
        if self.ids is None:
            out = np.zeros(len(tokens), np.float64)
            ok = (tokens >= 0) & (tokens < len(self.probs))
            out[ok] = self.probs[tokens[ok]]
            return out
        order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[order]
        pos = np.minimum(np.searchsorted(sorted_ids, tokens), len(sorted_ids) - 1)
        return np.where(sorted_ids[pos] == tokens, self.probs[order][pos], 0.0)

    def sample(self, u: float) -> int:
        """Inverse-CDF draw for a float64 uniform u in [0, 1)."""
        cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        i = min(i, len(self.probs) - 1)  # cdf[i] > u * total, so probs[i] > 0
        return int(i if self.ids is None else self.ids[i])

    def argmax(self) -> int:
        i = int(np.argmax(self.probs))
        return i if self.ids is None else int(self.ids[i])

    def dense(self, vocab: int) -> np.ndarray:
        if self.ids is None:
            return self.probs
        out = np.zeros(vocab, np.float64)
        out[self.ids] = self.probs
        return out

    @property
    def support(self) -> int:
        return len(self.probs) if self.ids is None else len(self.ids)
