"""One draft inference for every request that drafts in a step, with the draft's KV cache on the host.

The draft graph takes its past keys/values as inputs (engine/models/draft_kv.py) and returns the
keys/values of the new context rows; this class keeps them in one array per cached tensor,
[rows, kv heads, capacity, head size], one batch row per request. Why: the call's shapes then stay
the same step after step (the capacity only changes when it doubles or shrinks, new context rows
are padded to a steady count), and the CPU plugin does not re-plan the graph on every call, which
cost more than the draft's compute (docs/engine.md, "Draft KV on the host").

Each row's own slots are its first `lengths[seq]` slots; everything else (the unused capacity, padded
context rows, the block rows of shorter blocks) is hidden by the attention mask, which gives it
exactly zero weight, so a request's candidates do not depend on who else is in the batch. There
is nothing to compact: a row only ever writes its real rows, back to back.
"""
from __future__ import annotations

import time

import numpy as np
import openvino as ov

from engine.drafting.draft_batch import DraftCall, DraftRows, draft_rows, mask_probe, row_positions
from engine.models.bound_inputs import BoundInputs
from engine.models.draft import DraftModel


class HostKVBatch:
    """The batch rows of a draft whose KV cache lives in host arrays (same interface as DraftBatch)."""

    MIN_CAPACITY = 256  # slots per row allocated at least; then doubled as contexts grow

    serial = False  # every row runs in the one batched call

    def __init__(self, model: DraftModel) -> None:
        assert model.kv is not None, "HostKVBatch needs a draft whose KV cache was moved to the host"
        self.model = model
        self.info = model.info
        self.request = model.request
        self.rows: list[int] = []  # sequence per batch row
        self.lengths: dict[int, int] = {}  # context rows cached per sequence
        self.dropped: set[int] = set()
        self._preloaded: dict[int, list[np.ndarray]] = {}  # a cached prefix's KV for a row that joins next call
        self.inputs = BoundInputs(self.request)
        self.buffers: list[np.ndarray] = []
        self._bind([self._empty(0, 0, kv.heads, kv.head_size) for kv in model.kv])
        self.steady_rows = self.info.block_size  # new context rows per step never exceed a block
        self.last_model_ms = 0.0

    @staticmethod
    def _empty(rows: int, capacity: int, heads: int, head_size: int) -> np.ndarray:
        return np.zeros((rows, heads, capacity, head_size), np.float32)

    def _bind(self, buffers: list[np.ndarray]) -> None:
        """Make `buffers` the draft's past inputs: the arrays kept are the request's own tensors, so a
        call reads the cache in place and `_commit` writes new rows straight into them."""
        self.inputs.feed({kv.past_name: b for kv, b in zip(self.model.kv, buffers)})
        self.buffers = [self.inputs.array(kv.past_name, b.shape) for kv, b in zip(self.model.kv, buffers)]

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[2]

    def drop(self, seq: int) -> None:
        """Forget a sequence (finished, cancelled, preempted); its row leaves at the next call."""
        self.lengths.pop(seq, None)
        self._preloaded.pop(seq, None)
        if seq in self.rows:
            self.dropped.add(seq)

    def preload(self, seq: int, kv: list[np.ndarray]) -> None:
        """Start `seq`'s row with the context KV of a cached prefix ([kv heads, rows, head size] per
        cached tensor, as `export` gave them): the row joins at the next call with those rows as its
        first slots, so the draft continues as if it had taken in the prefix's target rows itself."""
        self.drop(seq)
        self._preloaded[seq] = kv

    def export(self, seq: int, start: int, stop: int) -> list[np.ndarray]:
        """Copies of `seq`'s cached context KV at positions [start, stop) (for the prefix cache)."""
        if stop > self.lengths.get(seq, 0) or seq in self.dropped:
            raise ValueError(f"sequence {seq} has {self.lengths.get(seq, 0)} context rows, not {stop}")
        r = self.rows.index(seq)
        return [b[r, :, start:stop].copy() for b in self.buffers]

    def _rebatch(self, calls: list[DraftCall]) -> None:
        """Drop finished rows, append newcomers; copies the arrays only when the rows change."""
        keep = [s for s in self.rows if s not in self.dropped]
        new = [c.seq for c in calls if c.seq not in self.rows or c.seq in self.dropped]
        if not new and len(keep) == len(self.rows):
            return
        index = [self.rows.index(s) for s in keep]
        longest = max((self.lengths[s] for s in keep), default=0)
        capacity = self.capacity
        if capacity > self.MIN_CAPACITY and 4 * longest < capacity:  # long requests left: shrink
            capacity = max(self.MIN_CAPACITY, _pow2_at_least(2 * longest))
        preload = {s: self._preloaded.pop(s) for s in new if s in self._preloaded}
        longest_new = max((kv[0].shape[1] for kv in preload.values()), default=0)
        if longest_new > capacity:
            capacity = max(self.MIN_CAPACITY, _pow2_at_least(longest_new))
        kept = [b[index, :, :capacity] for b in self.buffers]
        if capacity > self.capacity:
            kept = [np.concatenate([k, self._empty(k.shape[0], capacity - k.shape[2], k.shape[1], k.shape[3])], axis=2)
                    for k in kept]
        self._bind([np.concatenate([k, self._empty(len(new), capacity, k.shape[1], k.shape[3])]) for k in kept])
        self.lengths.update({s: 0 for s in new})
        self.rows, self.dropped = keep + new, set()
        for seq, kv in preload.items():
            r, rows = self.rows.index(seq), kv[0].shape[1]
            for buf, part in zip(self.buffers, kv):
                buf[r, :, :rows] = part
            self.lengths[seq] = rows

    def _reserve(self, slots: int) -> None:
        """Make room for `slots` slots per row (doubling, so the shape changes rarely)."""
        if slots <= self.capacity:
            return
        capacity = max(self.MIN_CAPACITY, _pow2_at_least(slots))
        grown = []
        for kv, b in zip(self.model.kv, self.buffers):  # a larger shape: new zeroed tensors bound in place of the old
            g = self.inputs.array(kv.past_name, (b.shape[0], b.shape[1], capacity, b.shape[3]))
            g[:, :, : b.shape[2]] = b
            grown.append(g)
        self.buffers = grown

    def run(self, calls: list[DraftCall], top_k: int) -> list[DraftRows]:
        """One inference drafting every call's block; returns their rows in call order."""
        t0 = time.perf_counter()
        info = self.info
        self._rebatch(calls)
        by_seq = {c.seq: c for c in calls}
        rows, cap = len(self.rows), self.capacity
        ctx = max([self.steady_rows] + [c.context.shape[0] for c in calls])
        block = max(c.n for c in calls) + info.candidate_offset
        ids = np.full((rows, block), info.mask_token_id, np.int64)
        hidden = np.zeros((rows, ctx, info.context_width), np.float32)
        positions = np.zeros((rows, ctx + block), np.int64)
        mask = np.zeros((rows, cap + ctx + block), np.int64)
        got = [0] * rows
        for r, seq in enumerate(self.rows):
            base = self.lengths[seq]
            mask[r, :base] = 1
            c = by_seq.get(seq)
            if c is not None:
                got[r] = c.context.shape[0]
                ids[r, 0] = c.anchor
                hidden[r, : got[r]] = c.context
                mask[r, cap: cap + got[r]] = 1
                mask[r, cap + ctx: cap + ctx + c.n + info.candidate_offset] = 1
            else:
                mask[r, cap + ctx] = 1  # an idle row: one slot so its softmax has something to read
            positions[r] = row_positions(base, got[r], ctx, block)
        self.inputs.feed({"input_ids": ids, "hidden_states": hidden, "position_ids": positions,
                          "attention_mask": mask, "top_k": np.array(top_k, np.int64)})
        self.inputs.run()
        self._commit(got)
        self.last_model_ms = (time.perf_counter() - t0) * 1e3
        return [draft_rows(self.model, self.request, self.rows.index(c.seq), c.n) for c in calls]

    def _commit(self, got: list[int]) -> None:
        """Append each row's new context keys/values to its slots."""
        self._reserve(max(self.lengths[s] + g for s, g in zip(self.rows, got)))
        for kv, buf in zip(self.model.kv, self.buffers):
            new = self.request.get_tensor(kv.new_name).data
            for r, seq in enumerate(self.rows):
                if got[r]:
                    base = self.lengths[seq]
                    buf[r, :, base: base + got[r]] = new[r, :, : got[r]]
        for seq, g in zip(self.rows, got):
            self.lengths[seq] += g


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def host_padding_is_exact(model: DraftModel) -> bool:
    """The host path's probe: padded context rows and unused capacity filled with noise, masked.

    False for a draft IR that ignores `attention_mask`; the caller then keeps the stateful path."""
    rng = np.random.default_rng(1)

    def run(req: ov.InferRequest, hidden: np.ndarray, ids: np.ndarray, padded: bool) -> np.ndarray:
        rows, block, capacity = hidden.shape[1], ids.shape[1], 4 if padded else 0
        mask = np.concatenate([np.zeros(capacity), np.ones(3), np.zeros(rows - 3), np.ones(block)])[None].astype(np.int64)
        feeds = {"input_ids": ids, "hidden_states": hidden, "attention_mask": mask, "top_k": np.array(1, np.int64),
                 "position_ids": np.concatenate([np.arange(rows), np.arange(3, 3 + block)])[None].astype(np.int64)}
        feeds.update({kv.past_name: 100 * rng.standard_normal((1, kv.heads, capacity, kv.head_size)).astype(np.float32)
                      for kv in model.kv})
        req.infer(feeds)
        return req.get_tensor("last_hidden_state").data

    return mask_probe(model, run)
