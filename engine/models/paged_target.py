"""The target as a PagedAttention model: many sequences of different lengths in one inference.

At load the stateful optimum-intel IR goes through openvino's `paged_attention_transformation`
(the same SDPA -> PagedAttention rewrite openvino_genai applies): the KV cache becomes per-layer
`key_cache.i` / `value_cache.i` tensors of fixed-size blocks that we allocate once, and each
inference names, per sequence, its new tokens, how many it already has (`past_lens`) and which
blocks hold them (engine/models/kv_blocks.py). Rolling back a rejection is a shorter length.
The graph edits of engine/models/target.py are applied on top (rows gathered before the lm_head,
argmax ids in the graph, the tapped layers' rows concatenated).

Row invariance (`rows`, docs/engine.md "Row invariance"): the CPU plugin's PagedAttention scores
a sequence of one new token with other kernels than a sequence of several, and which one-row kernel
it takes depends on what else shares the call; int8 dynamic quantization turns their last-bit
differences into different logits. So on CPU ("split") every position is always computed by the
same kernel, whatever shares its call:
- a generated position (past a chunk's `prompt_rows`: a decode row, a verify window's rows, a
  recompute of generated tokens) is scored as its own one-row sequence over the sequence's blocks (the plugin
  writes every new key/value before it attends, so row j sees rows < j of the same call), and a
  call without a multi-row sequence gets an empty one: the one-row kernel is then the per-head one
  (`exec_kernel_one_bh`), never the context-split one that a lone one-row sequence would take;
- a prompt position is scored in a multi-row sequence (a chunk's prompt rows): a one-row prompt
  chunk gets a padding row (the same token one position further, its key/value slot in the
  sequence's next slot or a scratch block, never read by a real row). A chunk with both (a
  recompute) is two inferences, its prompt rows first: a multi-row sequence's kernel assumes that
  nothing is written past its end in its last block during the call (the plugin zeroes that tail
  and reads it), and the generated rows would write there;
- where the matmuls do not compute a row alike for one row and several (no dynamic quantization,
  or weights it does not apply to), a call never has one row: a dummy row in the scratch block, and
  the lm_head gathers the one row twice.
"padded" (every chunk a multi-row sequence, one-row chunks padded) is what this replaced, kept for
`dflash-studio row-invariance`; "plain" sends the chunks as they are (other devices).

Window models (`window_sizes`): a call whose row count differs from the previous call's costs the CPU plugin
several milliseconds (it prepares every node for the new shape), about four verify rows of a small target. The
draft policy's cut alternates between two window sizes at one request (engine/draft_policy.py), so the same
graph is compiled once more per size the caller names (both, or the long one where memory allows one copy:
engine/pipeline.window_sizes), every request bound to the one KV cache (the cache is an input of the paged
model), and a call of that many rows runs on its own compiled model, which keeps its shape. The same graph on
the same plugin computes the same rows; the cost is memory (the plugin packs the weights again for each
compiled model at its first inference: docs/benchmarks.md, issue 25).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType

import numpy as np
import openvino as ov

from engine.errors import ModelFolderError
from engine.models.bound_inputs import BoundInputs
from engine.models.kv_blocks import BlockTable
from engine.models.folders import TargetFolder, as_target_folder
from engine.models.target import edit_target_graph

PA_INPUTS = ("input_ids", "position_ids", "past_lens", "subsequence_begins", "block_indices",
             "block_indices_begins", "max_context_len", "logits_indices")
ROW_MODES = ("split", "padded", "plain")
CALL_ROWS = 64  # rows per call at most on CPU: prefill is as fast in 64-row chunks there (docs/engine.md)


@dataclass
class SeqChunk:
    """One sequence's part of a batched inference."""

    seq: int  # block-table key
    ids: list[int]  # new tokens, appended at positions past..past+len-1
    past: int  # tokens of this sequence already in the cache
    logit_rows: int  # how many of the LAST rows need logits / argmax ids (0: none)
    prompt_rows: int | None = None  # leading rows at prompt positions (None: all); the rest are generated


@dataclass
class BatchOutput:
    """A batched inference's outputs, split per chunk (views; copy what must outlive the next call)."""

    next_ids: list[np.ndarray]  # per chunk: [logit_rows] argmax ids
    logits: list[np.ndarray | None]  # per chunk: [logit_rows, V] float32 when asked for
    hidden: list[np.ndarray | None]  # per chunk: [len(ids), n*H] tapped rows (with taps)


@dataclass
class _Sub:
    """One sequence of the plugin's call: a chunk, a row of one, a padded chunk or a dummy."""

    ids: list[int]
    past: int
    table: list[int]


class PagedTarget:
    """A compiled PagedAttention target plus its block table."""

    def __init__(self, folder: TargetFolder | Path, core: ov.Core, device: str, properties: dict[str, str],
                 tap_layers: list[int] | None = None, num_blocks: int | None = None,
                 cache_size_mb: int = 512, rows: str = "split", max_call_rows: int = 0,
                 window_sizes: tuple[int, ...] = ()) -> None:
        from openvino._offline_transformations import paged_attention_transformation

        if rows not in ROW_MODES:
            raise ValueError(f"rows={rows!r} is not one of {', '.join(ROW_MODES)}.")
        target = as_target_folder(folder, core)
        self.folder = target.path
        self.device = device
        self.config = target.config
        model = target.fresh_model()
        self.num_layers = target.num_layers
        self.vocab_size = target.vocab_size
        self.hidden_size = target.hidden_size
        if not any(op.get_type_name() == "ScaledDotProductAttention" for op in model.get_ops()):
            raise ModelFolderError(f"{self.folder.name} has no ScaledDotProductAttention: export it again with "
                                   "optimum-intel (`dflash-studio export --kind target`), task text-generation-with-past.")
        compressed = all_weights_compressed(model)
        paged_attention_transformation(model, False, False)
        self.tap_layers = list(tap_layers) if tap_layers else []
        edit_target_graph(model, self.tap_layers, row_axis=0)
        self.compiled = core.compile_model(model, device, properties)
        self.request = self.compiled.create_infer_request()
        # one more compiled model per call size that should never reshape the main one (window models)
        sizes = sorted({int(s) for s in window_sizes if int(s) > 0}) if rows == "split" else []
        extra = {size: core.compile_model(model, device, properties).create_infer_request() for size in sizes}
        caches = [p for p in self.compiled.inputs if p.get_any_name().startswith(("key_cache.", "value_cache."))]
        unknown = [p.get_any_name() for p in self.compiled.inputs
                   if p.get_any_name() not in PA_INPUTS and p not in caches]
        if unknown:
            raise ModelFolderError(f"{self.folder.name}: the paged model has inputs this engine does not fill "
                                   f"({', '.join(unknown)}); this architecture is not supported yet.")
        shapes = {p.get_any_name(): [d.get_length() for d in list(p.get_partial_shape())[1:]] for p in caches}
        self.block_size = shapes["value_cache.0"][1]
        block_bytes = sum(int(np.prod(s)) * p.get_element_type().size for p, s in zip(caches, shapes.values()))
        self.bytes_per_block = block_bytes
        if num_blocks is None:
            num_blocks = max(1, (cache_size_mb << 20) // block_bytes)
        self.blocks = BlockTable(int(num_blocks), self.block_size)
        self.rows = rows
        self.scratch_block = self.blocks.num_blocks  # one block past the table's: padding and dummy rows' slots
        self._caches = [p.get_any_name() for p in caches]
        for port in caches:
            name = port.get_any_name()
            shape = [self.blocks.num_blocks + 1, *shapes[name]]
            tensor = ov.Tensor(port.get_element_type(), shape)
            for request in (self.request, *extra.values()):  # one cache, whichever compiled model runs a call
                request.set_tensor(name, tensor)
        self._zero_cache(...)
        self.inputs = BoundInputs(self.request)
        self._window_models = {size: BoundInputs(request) for size, request in extra.items()}
        self.inferences = 0
        # A one-row matmul computes a row like a many-row one only under dynamic quantization of every weight,
        # and then only where this CPU's kernels do: an AVX-512 VNNI core gives the same row for one and many,
        # an AVX2 core runs a one-row call through another path. So the machine is asked once, at load.
        self.one_row_matmul_differs = not (compressed and _dynamic_quantization(self.compiled)) \
            or self._one_row_call_differs()
        self.pad_matmul_rows = rows != "plain" and self.one_row_matmul_differs
        # Past some number of rows a call's matmuls take another kernel on some CPUs (an AVX2 core: over 80
        # rows), so a row would depend on how many rows share its call: calls are kept to CALL_ROWS rows, or
        # fewer where the machine says so at load (None: the caller's largest call is within what agrees).
        self.call_rows: int | None = self._call_row_limit(max_call_rows) if rows != "plain" else None
        self.inferences = 0  # the probes' are not the engine's

    def _one_row_call_differs(self) -> bool:
        """One generated row scored alone and beside a dummy row (two matmul rows): are its logits apart?
        Two inferences on a block outside every request, zeroed again after."""
        seq, layout = -2, self.rows
        (block,) = self.blocks.grow(seq, 1)
        self.rows = "split"  # the row beside an empty sequence (and the dummy row), as a split decode lays it out
        try:
            chunk = [SeqChunk(seq, [0], 0, 1, prompt_rows=0)]
            self.pad_matmul_rows = False
            alone = np.array(self._infer(chunk, want_logits=True).logits[0])
            self.pad_matmul_rows = True
            paired = np.array(self._infer(chunk, want_logits=True).logits[0])
        finally:
            self.rows = layout
            self.blocks.release(seq)
            self._zero_cache(block)
        return not np.array_equal(alone, paired)

    def _call_row_limit(self, largest: int) -> int | None:
        """The most rows a call may hold (None: `largest`, the caller's largest call, is fine): a generated row
        scored beside a prompt chunk that fills a call of `largest` rows, then of min(largest, CALL_ROWS) rows
        and of half as many until the row is the same as beside nothing. Kernels switch at a size, so a call
        that agrees vouches for the smaller ones. A CPU whose kernels agree at `largest` (an AVX-512 VNNI core:
        prefill in one call is faster there than in 64-row ones) gets no limit, one whose kernels switch (an
        AVX2 core: past 80 rows) CALL_ROWS or fewer. Inferences on blocks outside every request (the cache's
        size bounds the probe), zeroed after."""
        largest = min(largest, (self.blocks.num_blocks - 1) * self.blocks.block_size)
        if largest <= 2:
            return None
        seq, other = -2, -3
        self.blocks.grow(seq, 1)
        try:
            alone = self._probe_row([])
            size = min(largest, CALL_ROWS)
            sizes = [largest] if largest > size else []
            while size > 2:
                sizes.append(size)
                size //= 2
            for size in sizes:
                self.blocks.grow(other, size - 1)
                try:
                    beside = self._probe_row([SeqChunk(other, list(range(1, size)), 0, 1)])
                finally:
                    for b in self.blocks.blocks(other):
                        self._zero_cache(b)
                    self.blocks.release(other)
                if np.array_equal(alone, beside):
                    return None if size >= largest else size
            return 2
        finally:
            for b in self.blocks.blocks(seq):
                self._zero_cache(b)
            self.blocks.release(seq)

    def _probe_row(self, beside: list[SeqChunk]) -> np.ndarray:
        chunk = SeqChunk(-2, [0], 0, 1, prompt_rows=0)
        return np.array(self._infer([chunk, *beside], want_logits=True).logits[0])

    def _zero_cache(self, index: int | EllipsisType) -> None:
        """Zero the KV cache at `index` (... for all of it): unused slots are never read, and zeros keep
        garbage out of any reduction."""
        for name in self._caches:
            try:
                self.request.get_tensor(name).data[index] = 0
            except (RuntimeError, TypeError, ValueError):
                pass  # element types numpy cannot view (bf16); the plugin never reads unwritten slots

    def infer(self, chunks: list[SeqChunk], want_logits: bool = False) -> BatchOutput:
        """One inference for every chunk, or several where one would make a row depend on its neighbours: a
        chunk with prompt and generated rows runs its prompt rows first, and a call is kept to `call_rows` rows
        (a longer chunk is split in order, each part in a later inference). The caller has grown each chunk's
        blocks to past + len(ids)."""
        pieces = [self._pieces(c) for c in chunks]
        if all(len(p) == 1 for p in pieces) and self._fits(chunks):
            return self._infer(chunks, want_logits)
        parts: list[list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]] = [[] for _ in chunks]
        while any(pieces):
            call: list[SeqChunk] = []
            owners: list[int] = []
            for i, queue in enumerate(pieces):  # at most one piece of a chunk per call: its parts go in order
                if queue and (not call or self._fits([*call, queue[0]])):
                    call.append(queue.pop(0))
                    owners.append(i)
            out = self._infer(call, want_logits)
            for j, i in enumerate(owners):  # copies: the next call overwrites the outputs
                parts[i].append((out.next_ids[j].copy(), None if out.logits[j] is None else out.logits[j].copy(),
                                 None if out.hidden[j] is None else out.hidden[j].copy()))
        merged = BatchOutput([], [], [])
        for got in parts:
            ids, logits, hidden = zip(*got)
            merged.next_ids.append(np.concatenate(ids))
            merged.logits.append(None if logits[0] is None else np.concatenate(logits))
            merged.hidden.append(None if hidden[0] is None else np.concatenate(hidden))
        return merged

    def _pieces(self, c: SeqChunk) -> list[SeqChunk]:
        """The chunk as the parts that go in separate inferences, in order: its prompt rows, then its generated
        rows (split layout), each cut to fit a call; every part keeps the chunk's last `logit_rows` rows it holds."""
        n = len(c.ids)
        m = n if c.prompt_rows is None or self.rows != "split" else c.prompt_rows
        cuts = sorted({0, n, *([m] if 0 < m < n else [])})
        if self.call_rows is not None:
            step = max(1, self.call_rows - 1)  # room for a one-row prompt part's padding row
            cuts = sorted({x for a, b in zip(cuts, cuts[1:]) for x in range(a, b, step)} | {n})
        if len(cuts) <= 2:
            return [c]
        first_logit = n - c.logit_rows
        return [SeqChunk(c.seq, c.ids[a:b], c.past + a, max(0, b - max(a, first_logit)),
                         prompt_rows=None if b <= m and c.prompt_rows is None else (b - a if b <= m else 0))
                for a, b in zip(cuts, cuts[1:])]

    @property
    def window_sizes(self) -> tuple[int, ...]:
        """The call sizes with a compiled model of their own (no change of shape on the main one)."""
        return tuple(self._window_models)

    def window_model_calls(self) -> dict[int, int]:
        """Inferences each window model ran, by its call size."""
        return {size: inputs.runs for size, inputs in self._window_models.items()}

    def call_size(self, chunks: list[SeqChunk]) -> int:
        """The rows one call of these chunks runs (padding and dummy rows counted)."""
        return sum(len(s.ids) for s in self._sequences(chunks)[0])

    def _fits(self, chunks: list[SeqChunk]) -> bool:
        """Whether one call of these chunks stays within `call_rows` rows."""
        return self.call_rows is None or self.call_size(chunks) <= self.call_rows

    def _infer(self, chunks: list[SeqChunk], want_logits: bool) -> BatchOutput:
        subs, starts = self._sequences(chunks)
        lens = [len(s.ids) for s in subs]
        begins = np.zeros(len(subs) + 1, np.int32)
        np.cumsum(lens, out=begins[1:])
        ids = np.fromiter((t for s in subs for t in s.ids), np.int64, int(begins[-1]))
        positions = np.fromiter((s.past + j for s in subs for j in range(len(s.ids))), np.int64, int(begins[-1]))
        table_starts = np.zeros(len(subs) + 1, np.int32)
        np.cumsum([len(s.table) for s in subs], out=table_starts[1:])
        # the real rows' logits: the LAST logit_rows rows of each chunk (a padding row is after them)
        rows = np.concatenate([np.arange(s + len(c.ids) - c.logit_rows, s + len(c.ids), dtype=np.int64)
                               for c, s in zip(chunks, starts)])
        gathered = rows
        if self.pad_matmul_rows and rows.size == 1:
            gathered = np.repeat(rows, 2)  # a one-row lm_head takes another kernel without dynamic quantization
        feeds = {
            "input_ids": ids,
            "position_ids": positions,
            "past_lens": np.array([s.past for s in subs], np.int32),
            "subsequence_begins": begins,
            "block_indices": np.fromiter((b for s in subs for b in s.table), np.int32, int(table_starts[-1])),
            "block_indices_begins": table_starts,
            "max_context_len": np.array(max(s.past + n for s, n in zip(subs, lens)), np.int32),
            "logits_indices": gathered if gathered.size else np.zeros(1, np.int64),
        }
        inputs = self._window_models.get(int(begins[-1]), self.inputs)
        inputs.feed(feeds)
        inputs.run()
        self.inferences += 1
        request = inputs.request
        next_ids = request.get_tensor("next_token_ids").data.reshape(-1)
        logits = request.get_tensor("logits").data.reshape(-1, self.vocab_size) if want_logits else None
        hidden = (request.get_tensor("target_hidden").data.reshape(int(begins[-1]), -1)
                  if self.tap_layers else None)
        out = BatchOutput([], [], [])
        at = 0
        for c, s in zip(chunks, starts):
            out.next_ids.append(next_ids[at: at + c.logit_rows])
            out.logits.append(logits[at: at + c.logit_rows] if logits is not None else None)
            out.hidden.append(hidden[s: s + len(c.ids)] if hidden is not None else None)
            at += c.logit_rows
        return out

    def _sequences(self, chunks: list[SeqChunk]) -> tuple[list[_Sub], list[int]]:
        """The plugin's sequences for the chunks (module docstring) and each chunk's first row. A chunk's
        rows stay contiguous and in order; padding follows its chunk, dummies come last."""
        subs: list[_Sub] = []
        starts: list[int] = []
        at = 0
        multi = False
        for c in chunks:
            starts.append(at)
            m = len(c.ids) if c.prompt_rows is None or self.rows != "split" else c.prompt_rows
            ids = list(c.ids[:m])
            if ids or not c.ids:  # prompt rows (an empty chunk is an empty sequence)
                if self.rows != "plain" and len(ids) == 1:
                    ids.append(ids[0])  # the padding row
                multi = multi or len(ids) > 1
                subs.append(_Sub(ids, c.past, self._table(c, len(ids))))
                at += len(ids)
            owned = self.blocks.blocks(c.seq)
            for j in range(m, len(c.ids)):
                subs.append(_Sub([c.ids[j]], c.past + j, owned[: self.blocks.blocks_for(c.past + j + 1)]))
                at += 1
        if self.rows == "split" and not multi:
            if self.pad_matmul_rows and at == 1:
                subs.append(_Sub([0], 0, [self.scratch_block]))  # a dummy row: two matmul rows
            subs.append(_Sub([], 0, []))  # an empty multi-row sequence: the one-row kernel is the per-head one
        return subs, starts

    def _table(self, chunk: SeqChunk, rows: int) -> list[int]:
        """The chunk's block table for `rows` rows: a padding row past the sequence's blocks gets the
        scratch block (several sequences may share it in one call: its slots hold padding only)."""
        owned = self.blocks.blocks(chunk.seq)
        need = self.blocks.blocks_for(chunk.past + rows)
        if len(owned) >= need:
            return owned[:need]
        return owned[: self.blocks.blocks_for(chunk.past + len(chunk.ids))] + [self.scratch_block]


def all_weights_compressed(model: ov.Model) -> bool:
    """Whether every MatMul with a constant weight reads it from integer constants (int8/int4 weights,
    which dynamic quantization applies to); the rotary embedding's MatMul of positions does not count."""
    for op in model.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        node = op.input_value(1).get_node()
        while node.get_type_name() in ("Convert", "Multiply", "Subtract", "Reshape", "Transpose"):
            node = node.input_value(0).get_node()
        if node.get_type_name() == "Constant" and not node.get_output_element_type(0).is_integral():
            return False
    return True


def _dynamic_quantization(compiled: ov.CompiledModel) -> bool:
    try:
        return int(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) > 0
    except (RuntimeError, TypeError, ValueError):
        return False  # a plugin without the property: assume the matmuls depend on the row count
