"""Move a stateful draft's KV cache out of the graph, into arrays the host owns.

Why: the CPU plugin re-plans a graph whose input shapes change. A stateful draft's KV state grows
by the committed context rows every step, so every call changes the shapes of the whole attention
path; on SmolLM2's 2-layer draft that re-planning cost ~3 ms per call against ~1 ms of actual
compute (docs/engine.md, "Draft KV on the host"). With the past keys/values as inputs the host can
hand the graph a buffer whose shape only changes when it doubles, pad the new rows to a steady
count, and the draft call keeps the same shapes step after step.

The rewrite handles the stateful pattern that optimum-intel's export (and ours) produces for each
cached tensor: ``ReadValue -> Gather(beam_idx, axis 0) -> Concat(past, new, axis 2) -> Assign``.
Each ReadValue (with its Gather) becomes a Parameter ``past.<variable>`` and the Concat's new part
becomes a Result ``new.<variable>``; the Assigns, variables and ``beam_idx`` go. A graph of any
other shape is left untouched (the caller keeps the stateful path).
"""
from __future__ import annotations

from dataclasses import dataclass

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
    seq_axis: int = 2

    @property
    def past_name(self) -> str:
        return PAST_PREFIX + self.variable

    @property
    def new_name(self) -> str:
        return NEW_PREFIX + self.variable


def _skip_converts(out: ov.Output) -> ov.Node:
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
            if _skip_converts(gather.input_value(1)).get_type_name() != "Parameter":
                return None
            past = gather
        else:
            past = op
        concat = _skip_converts(assign.input_value(0))
        if concat.get_type_name() != "Concat" or concat.get_input_size() != 2:
            return None
        if concat.input_value(0).get_node() is not past and _skip_converts(concat.input_value(0)) is not past:
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
    beam = {_skip_converts(g.input_value(1)) for _, g, _, _ in plan if g is not None}
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
    used = {id(i.get_node()) for op in model.get_ordered_ops() for i in op.input_values()}
    for node in beam:
        if id(node) not in used:
            model.remove_parameter(node)
    model.validate_nodes_and_infer_types()
    return kv
