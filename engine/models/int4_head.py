"""The draft's grafted lm_head rows stored again as grouped int4 (symmetric, one scale per group).

Why: the draft scores its sub-vocabulary with the target's lm_head rows, int8 as the target keeps them;
that MatMul is the largest node of a draft call and, unlike the draft's small layers, it reads more than
the CPU's caches hold, so its time is the bytes it reads (docs/engine.md, "int4 drafts").
Half the bytes make the call cheaper. What the target verifies is untouched: a draft only proposes,
so greedy output is the target's whatever the head's precision; only which tokens get drafted may move
(docs/benchmarks.md measures tokens per step both ways).
"""
from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops

GROUPS = (128, 64, 32, 16)  # columns per scale, the largest that divides the width (128: nncf's int4 default)
_EVAL = {
    "Subtract": np.subtract,
    "Multiply": np.multiply,
    "Add": np.add,
}


def weight_values(weight: ov.Output) -> np.ndarray | None:
    """The float32 values of a constant weight subgraph (Constant, Convert, Subtract, Multiply, Add: the
    forms `slice_rows` rebuilds); None for anything else (the caller keeps the weight as it is)."""
    node = weight.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        try:
            return np.asarray(node.get_data(), dtype=np.float32)
        except RuntimeError:  # packed low-bit constants have no numpy view
            return None
    if kind == "Convert":
        return weight_values(node.input_value(0))
    if kind in _EVAL:
        a, b = weight_values(node.input_value(0)), weight_values(node.input_value(1))
        return None if a is None or b is None else _EVAL[kind](a, b).astype(np.float32, copy=False)
    return None


def group_size(cols: int) -> int | None:
    """The columns one scale covers for rows `cols` wide; None if no group size divides them."""
    return next((g for g in GROUPS if cols % g == 0), None)


def int4_rows(values: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 codes [rows, groups, group] in -8..7 and their float32 scales [rows, groups, 1]."""
    rows, cols = values.shape
    if cols % group:
        raise ValueError(f"{cols} columns do not split into groups of {group}")
    grouped = values.reshape(rows, cols // group, group)
    scale = np.abs(grouped).max(axis=2, keepdims=True) / 7.0
    scale[scale == 0] = 1.0  # an all-zero group: any scale gives zeros
    codes = grouped / scale  # one temporary, rounded and clipped in place
    np.clip(np.rint(codes, out=codes), -8, 7, out=codes)
    return codes.astype(np.int8), scale.astype(np.float32, copy=False)


def _i4_constant(codes: np.ndarray) -> ov.Node:
    """An i4 Constant of `codes` (int8 in -8..7, an even count), packed here two to a byte, low nibble first as
    OpenVINO stores i4: `ops.constant(codes, ov.Type.i4)` converts element by element, slow enough to show in
    every draft load."""
    nibbles = codes.reshape(-1).view(np.uint8) & 0x0F
    tensor = ov.Tensor(ov.Type.i4, list(codes.shape))
    tensor.data[:] = (nibbles[0::2] | (nibbles[1::2] << 4)).view(np.int8).reshape(tensor.data.shape)
    return ov.op.Constant(tensor)


def int4_weight(weight: ov.Output) -> ov.Output | None:
    """`weight` ([rows, hidden], a constant subgraph) rebuilt as int4 codes x scales, in the
    decompression form the CPU plugin folds into its compressed MatMul; None if it cannot be read or
    its width does not split into groups."""
    values = weight_values(weight)
    group = group_size(values.shape[-1]) if values is not None and values.ndim == 2 else None
    if group is None:
        return None
    codes, scale = int4_rows(values, group)
    decoded = ops.multiply(ops.convert(_i4_constant(codes), ov.Type.f32), ops.constant(scale))
    return ops.reshape(decoded, ops.constant(np.array(values.shape, np.int64)), False).output(0)
