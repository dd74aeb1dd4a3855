"""The Markov heads of DSpark and DFlash v2 as plain numpy weights, and their numpy reference formulas.

Shared by the torch drafts (engine/drafts/dspark.py, dflash2.py: `head_weights()`), the head IR
builders (engine/export/markov_head.py) and the tests; numpy only, so neither torch nor OpenVINO is
needed to read them. The formulas are described in engine/export/markov_head.py's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HEAD_NONE = "none"
HEAD_VANILLA = "vanilla"
HEAD_GATED = "gated"
HEAD_SELECTOR = "selector"
HEAD_TYPES = (HEAD_VANILLA, HEAD_GATED, HEAD_SELECTOR)


@dataclass
class HeadWeights:
    """A head's weights as float32 numpy arrays (rows of the factor tables are token ids)."""

    head_type: str
    predecessor: np.ndarray  # [V, r]: W1 (DSpark) or the predecessor codebook A (selector)
    successor: np.ndarray  # [V, r]: W2 (DSpark, Linear r->V weight) or the successor codebook B
    hidden_size: int
    gate_weight: np.ndarray | None = None  # [r, H + r] (gated), columns [h ; W1[pred]]
    gate_bias: np.ndarray | None = None  # [r] (gated)
    hidden_projection: np.ndarray | None = None  # [r, H] (selector)
    confidence_weight: np.ndarray | None = None  # [H + r] (confidence head reading W1[prev])
    confidence_bias: float | None = None

    def __post_init__(self) -> None:
        if self.head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {', '.join(HEAD_TYPES)}, got {self.head_type!r}")
        f32 = lambda a: None if a is None else np.ascontiguousarray(np.asarray(a, dtype=np.float32))  # noqa: E731
        self.predecessor, self.successor = f32(self.predecessor), f32(self.successor)
        self.gate_weight, self.gate_bias = f32(self.gate_weight), f32(self.gate_bias)
        self.hidden_projection, self.confidence_weight = f32(self.hidden_projection), f32(self.confidence_weight)
        v, r = self.predecessor.shape
        if self.successor.shape != (v, r):
            raise ValueError(f"successor factor {self.successor.shape} does not match predecessor factor {(v, r)}")
        h = self.hidden_size
        if self.head_type == HEAD_GATED and (self.gate_weight is None or self.gate_weight.shape != (r, h + r)
                                             or self.gate_bias is None or self.gate_bias.shape != (r,)):
            raise ValueError(f"a gated head needs gate_proj weight [{r}, {h + r}] and bias [{r}]")
        if self.head_type == HEAD_SELECTOR and (self.hidden_projection is None
                                                or self.hidden_projection.shape != (r, h)):
            raise ValueError(f"a selector needs hidden_projection [{r}, {h}]")
        if self.confidence_weight is not None and self.confidence_weight.shape != (h + r,):
            raise ValueError(f"a Markov confidence head needs proj weight [1, {h + r}]")

    @property
    def vocab_size(self) -> int:
        return int(self.predecessor.shape[0])

    @property
    def rank(self) -> int:
        return int(self.predecessor.shape[1])

    @property
    def has_confidence(self) -> bool:
        return self.confidence_weight is not None


# --------------------------------------------------------------------------------------------
# numpy reference (the same formulas once more, for tests and for engines without torch)
# --------------------------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def modulated_predecessor(w: HeadWeights, pred: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """a(r, pred): pred [R, ...] ids, hidden [R, H] -> [R, ..., r]."""
    e = w.predecessor[pred]
    extra = (slice(None),) + (None,) * (pred.ndim - 1)
    h = hidden.astype(np.float32)
    if w.head_type == HEAD_GATED:
        hsz = w.hidden_size
        gh = h @ w.gate_weight[:, :hsz].T
        return e * _sigmoid(gh[extra] + e @ w.gate_weight[:, hsz:].T + w.gate_bias)
    if w.head_type == HEAD_SELECTOR:
        return e * (h @ w.hidden_projection.T)[extra]
    return e


def edge_bias_np(w: HeadWeights, pred: np.ndarray, cand: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """[R, K] predecessors, [R, K] candidates, [R, H] hidden -> [R, K, K]."""
    return np.einsum("nik,njk->nij", modulated_predecessor(w, pred, hidden), w.successor[cand])


def dense_bias_np(w: HeadWeights, prev: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """[R] predecessors, [R, H] hidden -> [R, V]."""
    return modulated_predecessor(w, prev, hidden) @ w.successor.T
