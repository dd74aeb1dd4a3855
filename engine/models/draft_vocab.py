"""A draft's frequency-ranked sub-vocabulary (the FR-Spec idea): its lm_head scores only these tokens.

Why: the lm_head grafted onto the draft is the target's, [vocab, hidden] (49,152 x 576 int8 on
SmolLM2), read in full on every draft call; it was the largest single part of the call. The
target's own answers use far fewer tokens (21,863 distinct in 8 M answer tokens; the 16,384 most
frequent cover 99.3% of held-out answer tokens), so scoring only those makes the call cheaper
while a token outside the set is simply never drafted. Output does not change: the target still
verifies every token, and a sampled draft's proposal is the distribution it actually sampled from
(zero outside the set), which is what exact rejection sampling needs.

A draft folder opts in with `draft_vocabulary.json`: the ids either as a list, {"ids": [...]}, or
as a bitmap over the vocabulary, {"vocab_size": V, "bitmap": base64 of numpy.packbits} (8 KB for
SmolLM2 instead of 107 KB: the shipped drafts share a 50 MB budget), plus "source" and
"coverage". `dflash-studio draft-vocab` writes the bitmap form from token counts of the target's
answers.
"""
from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from engine.errors import ModelFolderError

VOCAB_FILE = "draft_vocabulary.json"
DEFAULT_SIZE = 16384
_FIX = "Delete it, or write it again with `dflash-studio draft-vocab`."
_REBUILD = {  # the ops of a (de)compressed weight subgraph, rebuilt over sliced constants
    "Subtract": lambda node, a, b: ops.subtract(a, b),
    "Multiply": lambda node, a, b: ops.multiply(a, b),
    "Add": lambda node, a, b: ops.add(a, b),
    "Convert": lambda node, a: ops.convert(a, node.get_output_element_type(0)),
}


def read_draft_vocabulary(folder: Path, vocab_size: int) -> np.ndarray | None:
    """The folder's sub-vocabulary as sorted int64 ids, None if it has none; raises on a bad file."""
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if "bitmap" in record:
            if int(record["vocab_size"]) != vocab_size:
                raise ModelFolderError(f"{path} was written for a vocabulary of {record['vocab_size']} tokens, the "
                                       f"target has {vocab_size}: it belongs to another tokenizer. {_FIX}")
            bits = np.unpackbits(np.frombuffer(base64.b64decode(record["bitmap"]), np.uint8))[:vocab_size]
            ids = np.flatnonzero(bits).astype(np.int64)
        else:
            ids = np.asarray(record["ids"], dtype=np.int64)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFolderError(f"{path} is not a draft vocabulary ({exc}). {_FIX}") from exc
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != ids.size:
        raise ModelFolderError(f"{path} must list distinct token ids below the target's vocabulary size {vocab_size}: "
                               f"it was written for another tokenizer. {_FIX}")
    return np.sort(ids)


def count_answer_tokens(rows: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    """How often each token id occurs in `rows` (the target's answers, as token ids)."""
    counts = np.zeros(vocab_size, np.int64)
    for row in rows:
        ids = np.asarray(row, np.int64)
        if ids.size:
            counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def read_answer_rows(path: Path, field: str = "answer") -> list[list[int]]:
    """Token-id rows from a JSONL(.gz) file, one object per line with `field` (the training data format)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def write_draft_vocabulary(folder: Path, counts: np.ndarray, size: int = DEFAULT_SIZE, source: str = "",
                           heldout: np.ndarray | None = None) -> dict:
    """Keep the `size` most frequent ids (ties by id); returns what was written (with the coverages)."""
    if not 0 < size <= counts.size:
        raise ValueError(f"size must be between 1 and the vocabulary size {counts.size}, got {size}")
    ids = np.sort(np.argsort(-counts, kind="stable")[:size])
    bits = np.zeros(counts.size, np.uint8)
    bits[ids] = 1
    record = {"vocab_size": int(counts.size), "size": int(size),
              "bitmap": base64.b64encode(np.packbits(bits).tobytes()).decode("ascii"), "source": source,
              "coverage": float(counts[ids].sum() / max(1, counts.sum()))}
    if heldout is not None:
        record["heldout_coverage"] = float(heldout[ids].sum() / max(1, heldout.sum()))
    (Path(folder) / VOCAB_FILE).write_text(json.dumps(record), encoding="utf-8")
    return record


def slice_rows(weight: ov.Output, ids: np.ndarray, vocab_size: int) -> ov.Output | None:
    """The weight subgraph of an lm_head MatMul ([vocab, hidden], possibly int8/u8 with scale and zero
    point) rebuilt with only the rows `ids`, the compression kept; None if the subgraph holds something
    this does not know how to slice (the caller keeps the full vocabulary)."""
    node = weight.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        shape = list(weight.get_shape())
        if len(shape) >= 1 and shape[0] == vocab_size:
            try:
                data = node.get_data()
            except RuntimeError:  # packed low-bit types have no numpy view
                return None
            return ops.constant(np.ascontiguousarray(data[ids]), weight.get_element_type()).output(0)
        return weight if all(d == 1 for d in shape) else None  # scalars broadcast as they are
    if kind not in _REBUILD:
        return None
    inputs = []
    for value in node.input_values():
        sliced = slice_rows(value, ids, vocab_size)
        if sliced is None:
            return None
        inputs.append(sliced)
    return _REBUILD[kind](node, *inputs).output(0)
