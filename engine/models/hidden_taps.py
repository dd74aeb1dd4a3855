"""Locate each decoder layer's output (the residual stream) inside a target IR.

DFlash drafts are conditioned on the target's hidden states `hidden_states[L+1]` (the output of
decoder layer L, HF convention). optimum-intel writes their location into the IR's rt_info
(`hidden_states_decoder_layers`) only for some model types (qwen3, qwen3_moe, qwen3_5, gemma4);
Llama exports (SmolLM2, the embedded default) carry none. This module reads the annotation when
present and otherwise finds the same tensors by the graph's structure, so the runtime engine and
the exporter agree on one convention:

- layers 0..L-2 -> the second residual `Add` of the layer (attention add, then MLP add);
- layer L-1     -> the input of the lm_head MatMul, i.e. AFTER the final norm (like HF's last
                   `hidden_states` entry). Never feed that one to a draft (spec §1.2, §9.1).

Only openvino is imported here (no torch, no Qt): the runtime engine calls this on every load.
"""
from __future__ import annotations

import json
import logging
import re
from collections import Counter
from typing import Any

import openvino as ov

log = logging.getLogger(__name__)

RT_INFO_KEY = "hidden_states_decoder_layers"

_LAYER_NAME = re.compile(r"(?:^|[./])layers\.(\d+)(?=[./]|$)")
# How far back from the lm_head input we look for the final norm's residual input. An RMSNorm is
# ~6 ops deep (Power, ReduceMean, Add eps, Sqrt, Divide, Multiply x2, maybe Converts).
_NORM_SEARCH_LIMIT = 64


class HiddenTapError(ValueError):
    """The graph does not have the pre-norm decoder structure this search understands."""


def find_decoder_layer_outputs(
    model: ov.Model,
    *,
    use_annotation: bool = True,
    num_layers: int | None = None,
) -> dict[int, ov.Output]:
    """Return {layer index: output of that decoder layer} for every layer, in layer order.

    Uses the `hidden_states_decoder_layers` rt_info when present (what openvino_genai reads), else
    a structural search. `num_layers` (from config.json) makes the search check its layer count.
    Raises HiddenTapError when neither works.
    """
    if use_annotation:
        annotation = read_annotation(model)
        if annotation is not None:
            try:
                return _resolve_annotation(model, annotation)
            except HiddenTapError as exc:
                log.warning("Ignoring a broken %s annotation (%s); searching the graph.", RT_INFO_KEY, exc)
    return search_decoder_layer_outputs(model, num_layers=num_layers)


def read_annotation(model: ov.Model) -> dict[str, Any] | None:
    """The parsed annotation, or None when the IR has none (or it is not JSON)."""
    if not model.has_rt_info(RT_INFO_KEY):
        return None
    raw = model.get_rt_info(RT_INFO_KEY).astype(str)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        log.warning("%s rt_info is not JSON: %.80r", RT_INFO_KEY, raw)
        return None
    return data if isinstance(data, dict) and isinstance(data.get("layers"), dict) else None


def annotation_for(outputs: dict[int, ov.Output]) -> str:
    """The rt_info JSON string optimum-intel writes, for the given located outputs."""
    layers = {
        str(i): {"producer": out.get_node().get_friendly_name(), "output_index": int(out.get_index())}
        for i, out in sorted(outputs.items())
    }
    return json.dumps({"layers": layers}, separators=(",", ":"))


def annotate(model: ov.Model, *, num_layers: int | None = None) -> dict[int, ov.Output]:
    """Write the annotation into `model`'s rt_info from a graph search (the graph is untouched).

    Producer names must be unique, since the annotation locates nodes by friendly name only.
    """
    outputs = search_decoder_layer_outputs(model, num_layers=num_layers)
    counts = Counter(op.get_friendly_name() for op in model.get_ops())
    for i, out in outputs.items():
        name = out.get_node().get_friendly_name()
        if counts[name] != 1:
            raise HiddenTapError(f"layer {i}: producer name {name!r} is not unique in the graph")
    model.set_rt_info(annotation_for(outputs), RT_INFO_KEY)
    return outputs


def _resolve_annotation(model: ov.Model, annotation: dict[str, Any]) -> dict[int, ov.Output]:
    by_name: dict[str, list[ov.Node]] = {}
    for op in model.get_ops():
        by_name.setdefault(op.get_friendly_name(), []).append(op)
    result: dict[int, ov.Output] = {}
    for key, loc in annotation["layers"].items():
        try:
            layer = int(key)
            name = str(loc["producer"])
            index = int(loc.get("output_index", 0))
        except (TypeError, ValueError, KeyError) as exc:
            raise HiddenTapError(f"bad entry for layer {key!r}: {loc!r}") from exc
        nodes = by_name.get(name, [])
        if len(nodes) != 1:
            raise HiddenTapError(f"layer {layer}: producer {name!r} found {len(nodes)} times")
        if index >= nodes[0].get_output_size():
            raise HiddenTapError(f"layer {layer}: {name!r} has no output {index}")
        result[layer] = nodes[0].output(index)
    if sorted(result) != list(range(len(result))):
        raise HiddenTapError(f"layer indices are not 0..N-1: {sorted(result)}")
    return dict(sorted(result.items()))


# ----------------------------------------------------------------------------- graph search


def _static_last_dim(out: ov.Output) -> int | None:
    shape = out.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 3 or shape[2].is_dynamic:
        return None
    return shape[2].get_length()


def _is_residual_add(node: ov.Node, hidden: int) -> bool:
    """An Add of two hidden-width activations: the residual stream (not an eps or RoPE add)."""
    if node.get_type_name() != "Add" or _static_last_dim(node.output(0)) != hidden:
        return False
    for inp in node.inputs():
        src = inp.get_source_output()
        if src.get_node().get_type_name() == "Constant" or _static_last_dim(src) != hidden:
            return False
    return True


def _lm_head_input(model: ov.Model) -> ov.Output:
    """The hidden-width activation feeding the MatMul that makes `logits`."""
    try:
        logits = model.output("logits")
    except RuntimeError as exc:
        raise HiddenTapError("the model has no 'logits' output: is this a causal LM export?") from exc
    # The Result's own port is not usable (openvino-notes pitfall 7): start from its input.
    node = logits.get_node().input_value(0).get_node()
    # Skip shape-preserving ops after the head (Convert, a softcap Multiply/Tanh, ...).
    for _ in range(8):
        if node.get_type_name() == "MatMul":
            break
        node = node.input_value(0).get_node()
    else:
        raise HiddenTapError("no MatMul (lm_head) found in front of 'logits'")
    candidates = [
        inp.get_source_output()
        for inp in node.inputs()
        if _static_last_dim(inp.get_source_output()) is not None
        and inp.get_source_output().get_node().get_type_name() != "Constant"
    ]
    if len(candidates) != 1:
        raise HiddenTapError(f"lm_head MatMul {node.get_friendly_name()!r} has {len(candidates)} activation inputs")
    return candidates[0]


def _final_norm_input(start: ov.Output, hidden: int) -> ov.Node:
    """Breadth-first search back from the lm_head input to the nearest residual Add."""
    frontier = [start.get_node()]
    seen: set[str] = set()
    steps = 0
    while frontier and steps < _NORM_SEARCH_LIMIT:
        node = frontier.pop(0)
        steps += 1
        if _is_residual_add(node, hidden):
            return node
        for inp in node.inputs():
            src = inp.get_source_output().get_node()
            key = src.get_name()
            if key not in seen and src.get_type_name() != "Constant":
                seen.add(key)
                frontier.append(src)
    raise HiddenTapError("no residual Add found in front of the final norm")


def search_decoder_layer_outputs(model: ov.Model, *, num_layers: int | None = None) -> dict[int, ov.Output]:
    """Find the layer outputs from the graph alone (pre-norm Llama/Qwen/Mistral-style blocks).

    Walks the residual chain back from the final norm: every block adds two sublayer outputs
    (attention, MLP) to the stream, so the chain holds 2*L Adds and layer i ends at Add 2i+1.
    The chain is followed through the input that is itself a residual Add (the skip path); the
    other input is the sublayer's projection. Checked against the layer count (config or KV
    state count) and, where friendly names carry `layers.{i}`, against the names.
    """
    head_in = _lm_head_input(model)
    hidden = _static_last_dim(head_in)
    if hidden is None:
        raise HiddenTapError("the lm_head input has no static hidden width")
    add = _final_norm_input(head_in, hidden)

    chain: list[ov.Node] = []
    while add is not None:
        chain.append(add)
        skip = [
            inp.get_source_output().get_node()
            for inp in add.inputs()
            if _is_residual_add(inp.get_source_output().get_node(), hidden)
        ]
        if len(skip) > 1:
            raise HiddenTapError(f"{add.get_friendly_name()!r}: both inputs look like the residual stream")
        add = skip[0] if skip else None
    chain.reverse()

    if len(chain) % 2:
        raise HiddenTapError(f"found {len(chain)} residual Adds; a pre-norm block has two per layer")
    layers = len(chain) // 2
    expected = num_layers
    if expected is None:
        kv_states = sum(1 for op in model.get_ops() if op.get_type_name() == "ReadValue")
        expected = kv_states // 2 if kv_states else None
    if expected is not None and expected != layers:
        raise HiddenTapError(f"found {layers} decoder layers in the residual chain, expected {expected}")
    if layers < 1:
        raise HiddenTapError("no decoder layers found")

    result: dict[int, ov.Output] = {i: chain[2 * i + 1].output(0) for i in range(layers - 1)}
    result[layers - 1] = head_in
    # Names are only a cross-check: when they carry a layer index it must agree with the chain.
    for i in range(layers):
        for node in (chain[2 * i], chain[2 * i + 1]):
            m = _LAYER_NAME.search(node.get_friendly_name())
            if m and int(m.group(1)) != i:
                raise HiddenTapError(
                    f"residual Add {node.get_friendly_name()!r} sits at layer {i} of the chain but is named for layer {m.group(1)}"
                )
    return result
