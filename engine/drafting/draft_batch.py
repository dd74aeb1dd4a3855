"""One draft inference for every request that drafts in a step.

The draft IR is stateful (its KV state holds each sequence's context rows) with a batch axis, so
the batch rows of that state are the requests: `beam_idx` keeps, drops and adds rows between
calls, and a per-row `attention_mask` hides what is not a row's own (padding of shorter context,
block rows of shorter blocks, slots of a row that joined later). The draft's attention is not
causal, so a masked slot gets exactly zero weight: a request's candidates do not depend on who
else is in the batch. Padding slots stay in the state, masked; when they pile up the state is
compacted (one copy). A draft that ignores `attention_mask` (possible for foreign exports) is
detected at load by a probe and then runs one infer request per sequence instead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import openvino as ov

from engine.models.draft import DraftModel


@dataclass
class DraftRows:
    """One request's outputs of a batched draft call (views valid until the next call)."""

    topk_ids: np.ndarray  # [n, K]
    topk_logits: np.ndarray  # [n, K]
    hidden: np.ndarray  # [n, H] last_hidden_state
    request: ov.InferRequest
    row: int
    n: int
    vocabulary: np.ndarray | None = None  # the draft's sub-vocabulary (draft_logits columns), if any
    vocab_size: int = 0

    def output(self, name: str) -> np.ndarray:
        """Any other output of the call for this request (draft_logits [n, V or |vocabulary|], confidence [n])."""
        return self.request.get_tensor(name).data[self.row, : self.n]

    def logits(self) -> np.ndarray:
        """The draft's logit rows over the whole vocabulary: ids outside a sub-vocabulary are -inf (never drafted)."""
        raw = self.output("draft_logits")
        if self.vocabulary is None:
            return raw
        full = np.full((raw.shape[0], self.vocab_size), -np.inf, np.float32)
        full[:, self.vocabulary] = raw
        return full


def draft_rows(model: DraftModel, request: ov.InferRequest, row: int, n: int) -> DraftRows:
    """One request's rows of the last call on `request` (views, valid until the next call)."""
    def out(name: str) -> np.ndarray:
        return request.get_tensor(name).data[row, :n]

    return DraftRows(out("draft_topk_ids"), out("draft_topk_logits"), out("last_hidden_state"), request, row, n,
                     model.vocabulary, model.vocab_size)


def row_positions(base: int, got: int, ctx: int, block: int) -> np.ndarray:
    """Position ids of one batch row: its `got` new context rows from `base`, padding up to `ctx` rows
    (at the next position, masked), then the block."""
    positions = np.full(ctx + block, base + got, np.int64)
    positions[:got] = np.arange(base, base + got)
    positions[ctx:] = np.arange(base + got, base + got + block)
    return positions


@dataclass
class DraftCall:
    """What one request brings to a draft call."""

    seq: int
    anchor: int
    n: int  # candidates to draft
    context: np.ndarray  # [rows, n*H] target rows not yet in the draft's state


class DraftBatch:
    """The batch rows of a stateful draft and their masks."""

    COMPACT_MIN_SLOTS = 256  # compact when the slots a compaction would free exceed this
    COMPACT_RATIO = 1.0  # ... and this share of the longest row (a copy per doubling, amortised)

    def __init__(self, model: DraftModel) -> None:
        self.model = model
        self.info = model.info
        self.request = model.request
        self.rows: list[int] = []  # sequence per batch row
        self.committed: dict[int, int] = {}  # context rows in the state per sequence (logical length)
        self.mask = np.zeros((0, 0), np.int64)  # [rows, slots]: 1 = the row's own context slot
        self.dropped: set[int] = set()
        self.compactions = 0
        self.last_model_ms = 0.0
        self.serial = not padding_is_exact(model)
        self._serial_requests: dict[int, ov.InferRequest] = {}

    @property
    def slots(self) -> int:
        return self.mask.shape[1]

    def drop(self, seq: int) -> None:
        """Forget a sequence (finished, cancelled, preempted); its row leaves at the next call."""
        self.committed.pop(seq, None)
        self._serial_requests.pop(seq, None)
        if seq in self.rows:
            self.dropped.add(seq)

    def run(self, calls: list[DraftCall], top_k: int) -> list[DraftRows]:
        """One inference drafting every call's block; returns their rows in call order."""
        t0 = time.perf_counter()
        if self.serial:
            out = [self._run_one(c, top_k) for c in calls]
        else:
            out = self._run_batched(calls, top_k)
        self.last_model_ms = (time.perf_counter() - t0) * 1e3
        return out

    # ---- batched path ---------------------------------------------------------------------------
    def _rebatch(self, calls: list[DraftCall]) -> np.ndarray:
        """New row order (kept rows, then newcomers); returns beam_idx and updates the masks."""
        keep = [s for s in self.rows if s not in self.dropped]
        new = [c.seq for c in calls if c.seq not in self.rows or c.seq in self.dropped]
        self.committed.update({s: 0 for s in new})
        if not keep:
            self.request.reset_state()
            self.mask = np.zeros((len(new), 0), np.int64)
            self.rows, self.dropped = new, set()
            return np.arange(len(new), dtype=np.int32)
        index = {s: i for i, s in enumerate(self.rows)}
        beam = np.array([index[s] for s in keep] + [0] * len(new), np.int32)
        mask = np.zeros((len(keep) + len(new), self.slots), np.int64)
        mask[: len(keep)] = self.mask[[index[s] for s in keep]]
        self.mask, self.rows, self.dropped = mask, keep + new, set()
        return beam

    def _run_batched(self, calls: list[DraftCall], top_k: int) -> list[DraftRows]:
        info = self.info
        beam = self._rebatch(calls)
        by_seq = {c.seq: c for c in calls}
        rows = len(self.rows)
        ctx = max((c.context.shape[0] for c in calls), default=0)
        block = max(c.n for c in calls) + info.candidate_offset
        width = self.model.info.context_width
        ids = np.full((rows, block), info.mask_token_id, np.int64)
        hidden = np.zeros((rows, ctx, width), np.float32)
        positions = np.zeros((rows, ctx + block), np.int64)
        new_mask = np.zeros((rows, ctx + block), np.int64)
        for r, seq in enumerate(self.rows):
            base = self.committed[seq]
            c = by_seq.get(seq)
            got = c.context.shape[0] if c is not None else 0
            if c is not None:
                ids[r, 0] = c.anchor
                hidden[r, :got] = c.context
                new_mask[r, ctx: ctx + c.n + info.candidate_offset] = 1
            else:
                new_mask[r, ctx] = 1  # an idle row: one slot so its softmax has something to read
            new_mask[r, :got] = 1
            positions[r] = row_positions(base, got, ctx, block)
            self.committed[seq] = base + got
        mask = np.concatenate([self.mask, new_mask], axis=1)
        self.request.infer({
            "input_ids": ids, "hidden_states": hidden, "position_ids": positions, "attention_mask": mask,
            "beam_idx": beam, "top_k": np.array(top_k, np.int64),
        }, share_inputs=True, share_outputs=True)
        self.mask = mask[:, : self.slots + ctx]
        self._maybe_compact()
        return [self._rows(self.rows.index(c.seq), c.n) for c in calls]

    def _rows(self, row: int, n: int, request: ov.InferRequest | None = None) -> DraftRows:
        return draft_rows(self.model, request or self.request, row, n)

    def _maybe_compact(self) -> None:
        real = self.mask.sum(axis=1)
        longest = int(real.max()) if real.size else 0
        if self.slots - longest > max(self.COMPACT_MIN_SLOTS, self.COMPACT_RATIO * longest):
            self.compact()

    def compact(self) -> None:
        """Move every row's own slots to the front of the state (the rest is dropped)."""
        real = self.mask.sum(axis=1)
        longest = int(real.max())
        for state in self.request.query_state():
            data = state.state.data
            packed = np.zeros((*data.shape[:2], longest, data.shape[3]), data.dtype)
            for r in range(data.shape[0]):
                keep = np.flatnonzero(self.mask[r])
                packed[r, :, : keep.size] = data[r, :, keep].transpose(1, 0, 2)
            state.state = ov.Tensor(packed)
        mask = np.zeros((self.mask.shape[0], longest), np.int64)
        for r in range(mask.shape[0]):
            mask[r, : int(real[r])] = 1
        self.mask = mask
        self.compactions += 1

    # ---- serial fallback (drafts that ignore attention_mask) --------------------------------------
    def _run_one(self, call: DraftCall, top_k: int) -> DraftRows:
        req = self._serial_requests.get(call.seq)
        if req is None:
            req = self._serial_requests[call.seq] = self.model.compiled.create_infer_request()
            self.committed[call.seq] = 0
        base = self.committed[call.seq]
        got = call.context.shape[0]
        block = call.n + self.info.candidate_offset
        ids = np.full((1, block), self.info.mask_token_id, np.int64)
        ids[0, 0] = call.anchor
        req.infer({
            "input_ids": ids, "hidden_states": np.ascontiguousarray(call.context, np.float32).reshape(1, got, -1),
            "position_ids": np.arange(base, base + got + block, dtype=np.int64).reshape(1, -1),
            "attention_mask": np.ones((1, base + got + block), np.int64),
            "beam_idx": np.zeros(1, np.int32), "top_k": np.array(top_k, np.int64),
        }, share_inputs=True, share_outputs=True)
        self.committed[call.seq] = base + got
        return self._rows(0, call.n, req)


def mask_probe(model: DraftModel, run: Callable[[ov.InferRequest, np.ndarray, np.ndarray, bool], np.ndarray]) -> bool:
    """Does masked padding leave a row's output unchanged? (False: the IR ignores its mask.)

    `run(request, hidden, ids, padded)` makes one draft call and returns last_hidden_state: 3 real
    context rows, and with `padded` 2 more rows of loud noise that its mask must hide."""
    info = model.info
    req = model.compiled.create_infer_request()
    rng = np.random.default_rng(0)
    ctx = rng.standard_normal((1, 3, info.context_width)).astype(np.float32)
    ids = np.full((1, 2 + info.candidate_offset), info.mask_token_id, np.int64)
    noise = 100 * rng.standard_normal((1, 2, info.context_width)).astype(np.float32)
    plain = run(req, ctx, ids, False).copy()
    padded = run(req, np.concatenate([ctx, noise], 1), ids, True)
    return bool(np.allclose(plain, padded, atol=1e-4, rtol=1e-4))


def padding_is_exact(model: DraftModel) -> bool:
    """The stateful path's probe: padding context rows in the state, masked."""
    def run(req: ov.InferRequest, hidden: np.ndarray, ids: np.ndarray, padded: bool) -> np.ndarray:
        req.reset_state()
        rows, block = hidden.shape[1], ids.shape[1]
        mask = np.ones((1, rows + block), np.int64)
        mask[0, 3:rows] = 0
        req.infer({"input_ids": ids, "hidden_states": hidden, "attention_mask": mask,
                   "position_ids": np.concatenate([np.arange(rows), np.arange(3, 3 + block)]).reshape(1, -1).astype(np.int64),
                   "beam_idx": np.zeros(1, np.int32), "top_k": np.array(1, np.int64)})
        return req.get_tensor("last_hidden_state").data

    return mask_probe(model, run)
