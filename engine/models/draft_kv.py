"""Move a stateful draft's KV cache out of the graph, into arrays the host owns.

Why: the CPU plugin re-plans a graph whose input shapes change. A stateful draft's KV state grows
by the committed context rows every step, so every call changes the shapes of the whole attention
path; on a small draft that re-planning costs more than the call's actual compute (docs/engine.md,
"Draft KV on the host"). With the past keys/values as inputs the host can
hand the graph a buffer whose shape only changes when it doubles, pad the new rows to a steady
count, and the draft call keeps the same shapes step after step.

The rewrite handles the stateful pattern that optimum-intel's export (and ours) produces for each
cached tensor: ``ReadValue -> Gather(beam_idx, axis 0) -> Concat(past, new, axis 2) -> Assign``.
Each ReadValue (with its Gather) becomes a Parameter ``past.<variable>`` and the Concat's new part
becomes a Result ``new.<variable>``; the Assigns, variables and ``beam_idx`` go. A graph of any
other shape is left untouched (the caller keeps the stateful path). `split_past_attention` then
lets each attention read the past arrays in place instead of copying them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import openvino as ov
import openvino.opset13 as ops

PAST_PREFIX = "past."
NEW_PREFIX = "new."


@dataclass
class KVInput:
    """One cached tensor: its Parameter name, its Result name, and its static dims."""

    variable: str
    heads: int
    head_size: int

    @property
    def past_name(self) -> str:
        return PAST_PREFIX + self.variable

    @property
    def new_name(self) -> str:
        return NEW_PREFIX + self.variable


def skip_converts(out: ov.Output) -> ov.Node:
    """The node an output comes from, through any Converts."""
    node = out.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node


def _plan(model: ov.Model) -> list[tuple[ov.Node, ov.Node | None, ov.Node, ov.Node]] | None:
    """(ReadValue, Gather or None, Concat, Assign) per variable, or None if the pattern does not hold."""
    assigns = {a.get_variable_id(): a for a in model.get_sinks() if a.get_type_name() == "Assign"}
    plan = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "ReadValue":
            continue
        var = op.get_variable_id()
        assign = assigns.get(var)
        if assign is None:
            return None
        consumers = [t.get_node() for t in op.output(0).get_target_inputs()]
        gather = None
        if len(consumers) == 1 and consumers[0].get_type_name() == "Gather":
            gather = consumers[0]
            if skip_converts(gather.input_value(1)).get_type_name() != "Parameter":
                return None
            past = gather
        else:
            past = op
        concat = skip_converts(assign.input_value(0))
        if concat.get_type_name() != "Concat" or concat.get_input_size() != 2:
            return None
        if skip_converts(concat.input_value(0)) is not past:
            return None
        shape = op.get_output_partial_shape(0)
        axis = concat.get_attributes()["axis"] % shape.rank.get_length()
        if shape.rank.get_length() != 4 or axis != 2 or not (shape[1].is_static and shape[3].is_static):
            return None
        plan.append((op, gather, concat, assign))
    return plan or None


def externalize_kv(model: ov.Model) -> list[KVInput] | None:
    """Rewrite `model` in place (see the module docstring); None, and no change, if it does not fit."""
    plan = _plan(model)
    if plan is None:
        return None
    beam = {skip_converts(g.input_value(1)) for _, g, _, _ in plan if g is not None}
    kv: list[KVInput] = []
    for read, gather, concat, assign in plan:
        var = read.get_variable_id()
        shape = read.get_output_partial_shape(0)
        item = KVInput(var, heads=shape[1].get_length(), head_size=shape[3].get_length())
        param = ops.parameter([-1, item.heads, -1, item.head_size], read.get_output_element_type(0), name=item.past_name)
        param.output(0).get_tensor().set_names({item.past_name})
        source = (gather or read).output(0)
        for target in list(source.get_target_inputs()):
            target.replace_source_output(param.output(0))
        result = ops.result(concat.input_value(1))
        result.output(0).get_tensor().set_names({item.new_name})
        model.add_parameters([param])
        model.add_results([result])
        model.remove_sink(assign)
        model.remove_variable(model.get_variable_by_id(var))
        kv.append(item)
    used = {i.get_node().get_friendly_name() for op in model.get_ordered_ops() for i in op.input_values()}
    for node in beam:
        if node.get_friendly_name() not in used:
            model.remove_parameter(node)
    model.validate_nodes_and_infer_types()
    return kv


_PASS_THROUGH = {"Reshape", "Broadcast", "Unsqueeze", "Convert"}


def _past_and_new(value: ov.Output, past_names: set[str]) -> tuple[ov.Output, list[ov.Output]] | None:
    """For an SDPA key/value input: (the past Parameter, the new parts concatenated after it), through
    the GQA expand (Reshape/Broadcast) and nested Concats on the sequence axis; None if it is not that."""
    node = value.get_node()
    while node.get_type_name() in _PASS_THROUGH:
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Concat":
        return None
    parts: list[ov.Output] = []

    def flatten(concat: ov.Node) -> None:
        for part in concat.input_values():
            inner = part.get_node()
            if inner.get_type_name() == "Concat" and inner.get_attributes()["axis"] % 4 == 2:
                flatten(inner)
            else:
                parts.append(part)

    if node.get_attributes()["axis"] % 4 != 2:
        return None
    flatten(node)
    first = parts[0].get_node()
    if first.get_type_name() != "Parameter" or not (parts[0].get_names() & past_names) or len(parts) < 2:
        return None
    return parts[0], parts[1:]


def split_past_attention(model: ov.Model, kv: list[KVInput]) -> int:
    """Rewrite each draft attention over [past ; new] keys so the past is read where it lies.

    Why: the exported attention concatenates the past keys/values with the new rows and, for GQA,
    repeats them per query head before its SDPA: several copies of the whole cache per layer per
    call, so a draft call grew with every cached row (docs/engine.md, "Draft KV on the host").
    Here the query heads of one KV head become extra query rows, the scores against the past and
    against the few new rows are two MatMuls, one softmax covers both, and the two weighted sums
    are added: the cache is read once and never copied. Returns how many attentions were rewritten
    (one that does not have the expected shape is left as it was)."""
    past_names = {k.past_name for k in kv}
    rewritten = 0
    for sdpa in [op for op in model.get_ordered_ops() if op.get_type_name() == "ScaledDotProductAttention"]:
        if sdpa.get_attributes().get("causal") or sdpa.get_input_size() < 4:
            continue
        keys = _past_and_new(sdpa.input_value(1), past_names)
        values = _past_and_new(sdpa.input_value(2), past_names)
        q, mask = sdpa.input_value(0), sdpa.input_value(3)
        q_shape = q.get_partial_shape()
        m_shape = mask.get_partial_shape()
        if (keys is None or values is None or q_shape.rank.get_length() != 4 or not q_shape[1].is_static
                or m_shape.rank.get_length() != 4 or not (m_shape[1].is_static and m_shape[1].get_length() == 1)):
            continue
        (k_past, k_new), (v_past, v_new) = keys, values
        heads, kv_heads = q_shape[1].get_length(), k_past.get_partial_shape()[1].get_length()
        head_size = q_shape[3].get_length()
        if heads % kv_heads:
            continue
        group = heads // kv_heads
        if mask.get_element_type() == ov.Type.boolean:
            mask = ops.select(mask, ops.constant(np.float32(0)), ops.constant(np.float32(-np.inf))).output(0)
        scale = (sdpa.input_value(4) if sdpa.get_input_size() > 4
                 else ops.constant(np.float32(1.0 / np.sqrt(head_size))).output(0))
        i64 = lambda v: ops.constant(np.array(v, np.int64))  # noqa: E731
        grouped = ops.reshape(q, i64([0, kv_heads, -1, head_size]), True)  # [B, Hkv, G*L, D]: row g*L + l
        k_cat = k_new[0] if len(k_new) == 1 else ops.concat(k_new, 2).output(0)
        v_cat = v_new[0] if len(v_new) == 1 else ops.concat(v_new, 2).output(0)
        scores = ops.concat([ops.matmul(grouped, k_past, False, True), ops.matmul(grouped, k_cat, False, True)], 3)
        scores = ops.multiply(scores, ops.convert_like(scale, scores))
        mask_rows = mask if group == 1 else ops.concat([mask] * group, 2).output(0)  # each group sees the same mask
        weights = ops.softmax(ops.add(scores, ops.convert_like(mask_rows, scores)), 3)
        past_len = ops.gather(ops.shape_of(k_past), i64([2]), i64(0))
        w_past, w_new = ops.variadic_split(weights, i64(3), ops.concat([past_len, i64([-1])], 0)).outputs()
        out = ops.add(ops.matmul(w_past, v_past, False, False), ops.matmul(w_new, v_cat, False, False))
        out = ops.reshape(out, i64([0, heads, -1, head_size]), True)
        for target in list(sdpa.output(0).get_target_inputs()):
            target.replace_source_output(out.output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten
