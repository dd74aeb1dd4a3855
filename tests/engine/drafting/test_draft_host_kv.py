"""The draft's KV cache on the host (engine/models/draft_kv.py, engine/drafting/host_kv_batch.py).

The rewrites (state -> inputs/outputs, attention split into past and new parts) must keep a
draft's candidates what the stateful IR gives, grow and shrink its arrays
without changing a token, and hand every draft it cannot serve exactly back to the stateful path.
Precision is pinned to f32 (greedy speculative output is then exact: tests/engine/test_pipeline.py).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from engine.config import GenerationConfig
from engine.drafting.draft_batch import DraftBatch
from engine.drafting.host_kv_batch import HostKVBatch
from engine.models.draft import DraftModel
from engine.models.draft_kv import externalize_kv
from engine.pipeline import SpeculativePipeline
from fixtures.tiny_drafts import TRAIN_PROMPTS

PROMPTS = list(TRAIN_PROMPTS[:4])
CFG = GenerationConfig(max_new_tokens=32, ignore_eos=True, draft_policy="always")  # full windows: acceptance compared


@pytest.fixture(scope="module")
def qwen_alone(tiny_qwen3_target: Path) -> SpeculativePipeline:
    return SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")


def test_rewrite_turns_state_into_inputs_and_outputs(tiny_qwen3_drafts) -> None:
    model = ov.Core().read_model(tiny_qwen3_drafts["b8_trained"] / "openvino_model.xml")
    variables = {v.get_info().variable_id for v in model.get_variables()}
    kv = externalize_kv(model)
    assert kv is not None and {k.variable for k in kv} == variables
    inputs = {i.get_any_name() for i in model.inputs}
    outputs = {o.get_any_name() for o in model.outputs}
    assert "beam_idx" not in inputs and not model.get_sinks() and not model.get_variables()
    assert {k.past_name for k in kv} <= inputs and {k.new_name for k in kv} <= outputs
    for k in kv:
        assert model.input(k.past_name).get_partial_shape()[1].get_length() == k.heads
        assert model.output(k.new_name).get_partial_shape()[3].get_length() == k.head_size


def test_rewrite_leaves_other_graphs_alone() -> None:
    """A state that is not ReadValue -> Concat -> Assign is not touched (the draft keeps its state)."""
    x = ops.parameter([1, 2, 3, 4], ov.Type.f32, name="x")
    info = ov.op.util.VariableInfo()
    info.data_shape, info.data_type, info.variable_id = ov.PartialShape([1, 2, 3, 4]), ov.Type.f32, "v"
    var = ov.op.util.Variable(info)
    read = ops.read_value(x, var)
    summed = ops.add(read, x)
    assign = ops.assign(summed, var)
    model = ov.Model([ops.result(summed)], [assign], [x])
    assert externalize_kv(model) is None
    assert len(model.get_sinks()) == 1 and [i.get_any_name() for i in model.inputs] == ["x"]


def _run(target: Path, draft: Path, staggered: bool = True) -> tuple[list[list[int]], list[int]]:
    """Token ids and accepted counts per request; the second request joins after a few steps."""
    pipe = SpeculativePipeline.load(target, draft, precision="f32")
    rids = [pipe.add_request(PROMPTS[0], CFG, chat=False)]
    accepted: dict[int, int] = {}
    steps = 0
    while pipe.has_unfinished() or len(rids) < len(PROMPTS):
        if len(rids) < len(PROMPTS) and (not staggered or steps % 3 == 2):
            rids.append(pipe.add_request(PROMPTS[len(rids)], CFG, chat=False))
        for ev in pipe.step():
            accepted[ev.request_id] = accepted.get(ev.request_id, 0) + ev.accepted
        steps += 1
    return [pipe.result(r).token_ids for r in rids], [accepted.get(r, 0) for r in rids]


def test_host_kv_is_the_default_and_drafts_what_the_state_drafts(monkeypatch, tiny_qwen3_target,
                                                                 tiny_qwen3_drafts, qwen_alone) -> None:
    """Same tokens as the target alone, and the same accepted drafts as the stateful IR, request by request."""
    draft = tiny_qwen3_drafts["b8_trained"]
    host_pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    assert isinstance(host_pipe.drafts, HostKVBatch)
    layers = sum(op.get_type_name() == "ScaledDotProductAttention"
                 for op in ov.Core().read_model(draft / "openvino_model.xml").get_ordered_ops())
    assert host_pipe.draft.split_attentions == layers > 0  # every attention reads the past in place
    host_ids, host_acc = _run(tiny_qwen3_target, draft)
    monkeypatch.setattr(DraftModel, "KV_ON_HOST", False)
    state_pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    assert isinstance(state_pipe.drafts, DraftBatch)
    state_ids, state_acc = _run(tiny_qwen3_target, draft)
    for prompt, ids in zip(PROMPTS, host_ids):
        assert ids == qwen_alone.generate(prompt, CFG, chat=False).token_ids
    assert host_ids == state_ids
    assert host_acc == state_acc and sum(host_acc) > len(PROMPTS)  # the trained draft is accepted


def test_capacity_doubles_and_shrinks_without_changing_a_token(monkeypatch, tiny_qwen3_target, tiny_qwen3_drafts,
                                                               qwen_alone) -> None:
    monkeypatch.setattr(HostKVBatch, "MIN_CAPACITY", 4)
    pipe = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32")
    long_cfg = CFG.copy(max_new_tokens=80)
    capacities = set()
    rid = pipe.add_request(PROMPTS[0], long_cfg, chat=False)
    while pipe.has_unfinished():
        pipe.step()
        capacities.add(pipe.drafts.capacity)
    assert pipe.result(rid).token_ids == qwen_alone.generate(PROMPTS[0], long_cfg, chat=False).token_ids
    grown = pipe.drafts.capacity
    for kv, buf in zip(pipe.drafts.model.kv, pipe.drafts.buffers):  # the cache is the request's own past input
        assert np.shares_memory(buf, pipe.drafts.request.get_tensor(kv.past_name).data)
    assert len(capacities) >= 3 and grown >= 64 and grown & (grown - 1) == 0  # doubled a few times
    short = pipe.add_request(PROMPTS[1], CFG.copy(max_new_tokens=4), chat=False)
    while pipe.has_unfinished():
        pipe.step()
    assert pipe.drafts.capacity < grown  # the long request left: its room went with it
    assert pipe.result(short).token_ids == qwen_alone.generate(PROMPTS[1], CFG.copy(max_new_tokens=4),
                                                                chat=False).token_ids


def _mask_ignoring_copy(src: Path, dst: Path) -> Path:
    """A copy of a draft whose graph reads attention_mask but ignores it (all ones of the same shape)."""
    shutil.copytree(src, dst)
    core = ov.Core()
    model = core.read_model(src / "openvino_model.xml")
    mask = model.input("attention_mask")
    ones = ops.broadcast(ops.constant(np.int64(1)), ops.shape_of(mask))
    for target in list(mask.get_target_inputs()):
        if target.get_node() is not ones.input_value(1).get_node():
            target.replace_source_output(ones.output(0))
    ov.save_model(model, dst / "openvino_model.xml", compress_to_fp16=False)
    return dst


def test_a_draft_that_ignores_its_mask_falls_back_to_one_request_per_sequence(tmp_path, tiny_qwen3_target,
                                                                              tiny_qwen3_drafts, qwen_alone) -> None:
    draft = _mask_ignoring_copy(tiny_qwen3_drafts["b8_trained"], tmp_path / "no-mask")
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    assert isinstance(pipe.drafts, DraftBatch) and pipe.drafts.serial and pipe.draft.kv is None
    rids = [pipe.add_request(p, CFG, chat=False) for p in PROMPTS[:2]]
    while pipe.has_unfinished():
        pipe.step()
    for prompt, rid in zip(PROMPTS, rids):
        assert pipe.result(rid).token_ids == qwen_alone.generate(prompt, CFG, chat=False).token_ids
