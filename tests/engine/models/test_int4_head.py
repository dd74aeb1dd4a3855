"""The draft's lm_head rows stored again as grouped int4 (engine/models/int4_head.py).

What must hold: the int4 graph computes exactly codes x scales (what the CPU plugin runs is the weight the
numpy side made), each weight lands within half a step of its group's grid, and a weight form that cannot be
read is left alone. That a draft folder asking for it (config.json "lm_head_bits": 4) keeps greedy output and its
candidates inside the sub-vocabulary is in tests/engine/models/test_draft_vocab.py.
"""
from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from engine.models.int4_head import group_size, int4_rows, int4_weight, weight_values


def _u8_rows(rows: int, hidden: int) -> tuple[ov.Output, np.ndarray]:
    """int8 rows as optimum-intel's export keeps an lm_head (u8, zero point, f16 scale), and their values."""
    rng = np.random.default_rng(4)
    w = rng.integers(0, 255, (rows, hidden)).astype(np.uint8)
    zp = rng.integers(100, 150, (rows, 1)).astype(np.uint8)
    scale = (rng.random((rows, 1)) * 0.01).astype(np.float16)
    graph = ops.convert(ops.multiply(ops.subtract(ops.convert(ops.constant(w), ov.Type.f16),
                                                  ops.convert(ops.constant(zp), ov.Type.f16)), ops.constant(scale)),
                        ov.Type.f32).output(0)
    # in float32, as the plugin decompresses (the f16 subgraph's own rounding is not what it runs)
    values = (w.astype(np.float32) - zp.astype(np.float32)) * scale.astype(np.float32)
    return graph, values


@pytest.mark.parametrize("hidden", [896, 64])
def test_the_int4_graph_runs_the_codes_times_scales(hidden: int) -> None:
    weight, values = _u8_rows(96, hidden)
    np.testing.assert_array_equal(weight_values(weight), values)
    packed = int4_weight(weight)
    assert packed is not None
    group = group_size(hidden)
    codes, scale = int4_rows(values, group)
    assert codes.min() >= -8 and codes.max() <= 7
    grid = (codes * scale).reshape(values.shape)
    # within half a step of the group's grid: the rounding is to nearest, the largest weight is on the grid
    assert np.all(np.abs(grid - values) <= scale.repeat(group, axis=2).reshape(values.shape) / 2 + 1e-7)
    x = ops.parameter([3, hidden], ov.Type.f32, name="x")
    model = ov.Model([ops.result(ops.matmul(x, packed, False, True))], [x])
    inputs = np.random.default_rng(5).standard_normal((3, hidden)).astype(np.float32)
    # the plugin's dynamic quantization of activations is a rounding of its own: off, so the weight is what is checked
    out = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                 "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})(inputs)[0]
    np.testing.assert_allclose(out, inputs @ grid.T, rtol=1e-4, atol=1e-4)


def test_a_weight_it_cannot_read_is_left_alone() -> None:
    x = ops.parameter([4, 64], ov.Type.f32, name="w")
    assert weight_values(x.output(0)) is None and int4_weight(x.output(0)) is None
    odd = ops.constant(np.ones((4, 24), np.float32)).output(0)  # 24 columns: no group size divides them
    assert group_size(24) is None and int4_weight(odd) is None
