"""A draft's frequency-ranked sub-vocabulary (the FR-Spec idea): its lm_head scores only these tokens.

Why: the lm_head grafted onto the draft is the target's, [vocab, hidden], read in full on every
draft call; it was the largest single part of the call. The target's own answers use far fewer
tokens, and the most frequent of them cover nearly all held-out answer tokens (docs/engine.md, "The
draft's sub-vocabulary"), so scoring only those makes the call cheaper while a token outside the
set is simply never drafted. Output does not change: the target still
verifies every token, and a sampled draft's proposal is the distribution it actually sampled from
(zero outside the set), which is what exact rejection sampling needs.

A draft folder opts in with `draft_vocabulary.json`: the ids either as a list, {"ids": [...]}, or
as a bitmap over the vocabulary, {"vocab_size": V, "bitmap": base64 of numpy.packbits} (an eighth
of a byte per vocabulary entry: the shipped drafts share a size budget), plus "source" and
"coverage". `dflash-studio draft-vocab` writes the bitmap form from token counts of the target's
answers.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from engine.errors import ModelFolderError

if TYPE_CHECKING:
    import openvino as ov


def _ops() -> Any:
    """openvino's opset, imported when a graph is sliced: reading and writing the vocabulary file
    (train-draft on a GPU machine without openvino, prepare's markers) needs no runtime."""
    import openvino.opset13 as ops

    return ops

VOCAB_FILE = "draft_vocabulary.json"
DEFAULT_SIZE = 16384
_FIX = "Delete it, or write it again with `dflash-studio draft-vocab`."
_REBUILD = {  # the ops of a (de)compressed weight subgraph, rebuilt over sliced constants
    "Subtract": lambda node, a, b: _ops().subtract(a, b),
    "Multiply": lambda node, a, b: _ops().multiply(a, b),
    "Add": lambda node, a, b: _ops().add(a, b),
    "Convert": lambda node, a: _ops().convert(a, node.get_output_element_type(0)),
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
    """How often each token id occurs in `rows` (the target's answers, as token ids).

    An id outside 0..vocab_size-1 is a ValueError, not dropped: such answers come from another
    tokenizer (or vocab_size is wrong), and a set counted from them would cover the wrong tokens."""
    counts = np.zeros(vocab_size, np.int64)
    outside, seen = 0, (None, None)
    for row in rows:
        ids = np.asarray(row, np.int64)
        if not ids.size:
            continue
        bad = (ids < 0) | (ids >= vocab_size)
        if bad.any():
            outside += int(bad.sum())
            lo, hi = int(ids.min()), int(ids.max())
            seen = (lo if seen[0] is None else min(seen[0], lo), hi if seen[1] is None else max(seen[1], hi))
            continue
        counts += np.bincount(ids, minlength=vocab_size)
    if outside:
        raise ValueError(f"{outside:,} token ids lie outside the vocabulary 0..{vocab_size - 1:,} (seen "
                         f"{seen[0]:,}..{seen[1]:,}): the answers were tokenized by another tokenizer, or the "
                         "vocabulary size is wrong (--vocab-size, or the draft's config.json vocab_size).")
    return counts


def read_answer_rows(path: Path, field: str = "answer") -> list[list[int]]:
    """Token-id rows from a JSONL(.gz) file, one object per line with `field` (the training data format).

    A bad file is a ValueError naming the file and line (a missing file stays FileNotFoundError)."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    rows: list[list[int]] = []
    n = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                obj = json.loads(line)
                if not isinstance(obj, dict) or field not in obj:
                    have = ", ".join(sorted(obj)[:8]) if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
                    raise ValueError(f"{path} line {n} has no {field!r} field ({have}): pass --field NAME with "
                                     "the field that holds the token ids.")
                row = obj[field]
                if not isinstance(row, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                    raise ValueError(f"{path} line {n}: {field!r} is not a list of token ids (whole numbers).")
                rows.append(row)
    except gzip.BadGzipFile as exc:
        raise ValueError(f"{path} is not a gzip file ({exc}): give the .jsonl.gz as written, or drop the .gz "
                         "from the name of a plain JSONL file.") from exc
    except (EOFError, zlib.error) as exc:
        raise ValueError(f"{path} is a damaged gzip file ({exc or 'it ends early'}): write it again.") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} line {n + 1} is not UTF-8 text: give JSONL rows of token ids.") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {n} is not JSON ({exc.msg}): give one JSON object per line.") from exc
    return rows


def top_ids(counts: np.ndarray, size: int = DEFAULT_SIZE) -> np.ndarray:
    """The `size` most frequent ids (ties by id), sorted: the set a draft folder's vocabulary keeps."""
    if not 0 < size <= counts.size:
        raise ValueError(f"size must be between 1 and the vocabulary size {counts.size}, got {size}")
    return np.sort(np.argsort(-counts, kind="stable")[:size])


def write_draft_vocabulary(folder: Path, counts: np.ndarray, size: int = DEFAULT_SIZE, source: str = "",
                           heldout: np.ndarray | None = None) -> dict:
    """Keep the `size` most frequent ids (ties by id); returns what was written (with the coverages)."""
    ids = top_ids(counts, size)
    bits = np.zeros(counts.size, np.uint8)
    bits[ids] = 1
    record = {"vocab_size": int(counts.size), "size": int(size),
              "bitmap": base64.b64encode(np.packbits(bits).tobytes()).decode("ascii"), "source": source,
              "coverage": float(counts[ids].sum() / max(1, counts.sum()))}
    if heldout is not None:
        record["heldout_coverage"] = float(heldout[ids].sum() / max(1, heldout.sum()))
    path = Path(folder) / VOCAB_FILE
    tmp = path.with_name(f".{VOCAB_FILE}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, path)  # a crash never leaves half a file the draft would refuse to load
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
            return _ops().constant(np.ascontiguousarray(data[ids]), weight.get_element_type()).output(0)
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
