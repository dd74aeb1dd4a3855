"""Input tensors that stay bound to an infer request between calls, written in place.

Why: handing `InferRequest.infer` fresh numpy arrays on every call (even with share_inputs) wraps
and re-binds every input each time, a cost that is a visible share of a small target's decode step
(docs/benchmarks.md). openvino_genai's model runner fills the request's tensors in place
instead, and so does this: a tensor is replaced (and re-bound) only when its shape changes, which in
steady decoding is rare (the block table grows by one block every block_size tokens).
"""
from __future__ import annotations

import numpy as np
import openvino as ov


class BoundInputs:
    """The inputs of one infer request, each kept as a bound tensor and its numpy view."""

    def __init__(self, request: ov.InferRequest) -> None:
        self.request = request
        self.types = {p.get_any_name(): p.get_element_type() for p in request.model_inputs}
        self._bound: dict[str, tuple[ov.Tensor, np.ndarray]] = {}
        self.runs = 0

    def array(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The bound input `name` with `shape` (a new zeroed tensor when the shape differs), as a
        writable numpy view: writes to it are what the next call reads."""
        bound = self._bound.get(name)
        if bound is None or bound[1].shape != tuple(shape):
            tensor = ov.Tensor(self.types[name], list(shape))
            view = tensor.data
            view[...] = 0
            self.request.set_tensor(name, tensor)
            bound = self._bound[name] = (tensor, view)
        return bound[1]

    def feed(self, values: dict[str, np.ndarray]) -> None:
        """Copy each value into its bound input (re-binding only the inputs whose shape changed)."""
        for name, value in values.items():
            self.array(name, value.shape)[...] = value

    def run(self) -> None:
        """One inference on what is bound (outputs are read from the request afterwards)."""
        self.request.start_async()
        self.request.wait()
        self.runs += 1
