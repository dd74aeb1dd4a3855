"""BoundInputs: values written in place reach the inference; a tensor is re-bound only on a new shape."""
from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from engine.models.bound_inputs import BoundInputs


def _request() -> ov.InferRequest:
    x = ops.parameter([-1], ov.Type.i64, name="x")
    y = ops.parameter([-1, 2], ov.Type.f32, name="y")
    out = ops.add(ops.convert(x, ov.Type.f32), ops.reduce_sum(y, ops.constant(1, ov.Type.i64)))
    model = ov.Model([ops.result(out)], [x, y])
    return ov.Core().compile_model(model, "CPU").create_infer_request()


def test_values_reach_the_inference_and_shapes_rebind_only_when_changed() -> None:
    req = _request()
    inputs = BoundInputs(req)
    inputs.feed({"x": np.array([1, 2, 3]), "y": np.ones((3, 2), np.float32)})
    inputs.run()
    np.testing.assert_array_equal(req.get_output_tensor(0).data, [3, 4, 5])
    bound_x = req.get_tensor("x")
    view = inputs.array("x", (3,))

    inputs.feed({"x": np.array([10, 20, 30]), "y": np.zeros((3, 2), np.float32)})
    inputs.run()
    np.testing.assert_array_equal(req.get_output_tensor(0).data, [10, 20, 30])
    assert np.shares_memory(view, req.get_tensor("x").data), "same shape: the bound tensor is written in place"
    assert req.get_tensor("x").data.ctypes.data == bound_x.data.ctypes.data

    inputs.feed({"x": np.array([7, 8]), "y": np.full((2, 2), 0.5, np.float32)})
    inputs.run()
    np.testing.assert_array_equal(req.get_output_tensor(0).data, [8, 9])
    assert not np.shares_memory(view, req.get_tensor("x").data), "a new shape binds a new tensor"


def test_a_view_written_directly_is_what_the_next_call_reads() -> None:
    req = _request()
    inputs = BoundInputs(req)
    inputs.feed({"x": np.zeros(2, np.int64)})
    y = inputs.array("y", (2, 2))
    assert not y.any(), "a new bound tensor starts zeroed"
    y[1] = 4.0  # as HostKVBatch._commit writes new KV rows into its buffers
    inputs.run()
    np.testing.assert_array_equal(req.get_output_tensor(0).data, [0, 8])
