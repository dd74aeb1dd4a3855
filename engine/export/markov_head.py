"""The Markov head IRs of the draft folder contract (docs/draft-contract.md), built with the opset API.

Two stateless IRs sit beside a DSpark or DFlash v2 backbone:

- ``openvino_markov_head_model.xml``, the Top-K candidate scorer: for R rows (request, drafted
  position), K predecessor ids and K candidate ids per row and the row's draft hidden state, the
  bias ``edge_bias[r, i, j]`` that candidate j gets when predecessor i comes before it.
- ``openvino_markov_head_dense_model.xml``, the dense walk's head (DSpark only): for R rows, one
  predecessor id and the hidden state, the bias over the whole vocabulary.

All three head kinds share one shape, a rank-r bilinear form between a predecessor factor and a
successor factor, and differ only in how the predecessor factor is modulated:

    vanilla  (DSpark):   a = W1[pred]
    gated    (DSpark):   a = W1[pred] * sigmoid(G_h h + G_e W1[pred] + b)   (G = [G_h | G_e], [h ; e] order)
    selector (DFlash v2): a = A[pred] * (W_h h)
    edge_bias[r, i, j] = <a(r, pred_i), S[cand_j]>,   S = W2 (DSpark) or B (selector)
    dense bias[r, :]   = S @ a(r, prev_r)

The score semantics are "bias_only": the engine adds the backbone's unary logits itself. A DSpark
confidence head that also reads the Markov embedding (``confidence_head_with_markov``, the public
checkpoints) cannot live in the backbone, which never sees the walked predecessor; its
``sigmoid(w_h . h + w_e . W1[prev] + b)`` is an extra ``confidence`` output of both head IRs.

The weights and numpy references are engine/drafts/heads.py; the torch references are the head
modules in engine/drafts/dspark.py and engine/drafts/dflash2.py;
tests/engine/export/test_export_dspark_dflash2.py checks the IRs against them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from engine.drafts.heads import HEAD_GATED, HEAD_SELECTOR, HEAD_VANILLA, HeadWeights

SCORER_XML = "openvino_markov_head_model.xml"
DENSE_XML = "openvino_markov_head_dense_model.xml"
SCORE_SEMANTICS = "bias_only"

# --------------------------------------------------------------------------------------------
# IR builders
# --------------------------------------------------------------------------------------------
def _param(name: str, shape: list[int], etype: ov.Type) -> ov.Node:
    p = ops.parameter(ov.PartialShape(shape), etype, name=name)
    p.output(0).get_tensor().set_names({name})
    return p


def _result(node: ov.Output | ov.Node, name: str) -> ov.Node:
    r = ops.result(node)
    r.output(0).get_tensor().set_names({name})
    r.set_friendly_name(name)
    return r


def _const(a: np.ndarray) -> ov.Node:
    return ops.constant(np.ascontiguousarray(a, dtype=np.float32))


def _modulate(w: HeadWeights, e: ov.Output, hidden: ov.Output, expand_axis: int | None) -> ov.Output:
    """The IR twin of modulated_predecessor: e = W1[pred] ([R, K, r] or [R, r]), hidden [R, H]."""
    if w.head_type == HEAD_VANILLA:
        return e
    if w.head_type == HEAD_GATED:
        hsz = w.hidden_size
        gh = ops.matmul(hidden, _const(w.gate_weight[:, :hsz]), False, True)  # [R, r]
        if expand_axis is not None:
            gh = ops.unsqueeze(gh, ops.constant(np.int64(expand_axis)))  # [R, 1, r]
        ge = ops.matmul(e, _const(w.gate_weight[:, hsz:]), False, True)  # [R, (K,) r]
        gate = ops.sigmoid(ops.add(ops.add(gh, ge), _const(w.gate_bias)))
        return ops.multiply(e, gate).output(0)
    hp = ops.matmul(hidden, _const(w.hidden_projection), False, True)  # [R, r]
    if expand_axis is not None:
        hp = ops.unsqueeze(hp, ops.constant(np.int64(expand_axis)))
    return ops.multiply(e, hp).output(0)


def _confidence(w: HeadWeights, e: ov.Output, hidden: ov.Output, expand_axis: int | None) -> ov.Output:
    """sigmoid(w_h . h + w_e . W1[pred] + b): [R, K] (scorer) or [R] (dense)."""
    hsz = w.hidden_size
    ch = ops.matmul(hidden, _const(w.confidence_weight[:hsz, None]), False, False)  # [R, 1]
    ce = ops.matmul(e, _const(w.confidence_weight[hsz:, None]), False, False)  # [R, (K,) 1]
    ce = ops.squeeze(ce, ops.constant(np.array([-1], np.int64)))  # [R, (K)]
    if expand_axis is None:
        ch = ops.squeeze(ch, ops.constant(np.array([-1], np.int64)))  # [R]
    logit = ops.add(ops.add(ch, ce), ops.constant(np.float32(w.confidence_bias or 0.0)))
    return ops.sigmoid(logit).output(0)


def _set_head_rt_info(model: ov.Model, w: HeadWeights) -> None:
    model.set_rt_info(w.head_type, ["dflash_markov", "head_type"])
    model.set_rt_info(str(w.rank), ["dflash_markov", "rank"])
    model.set_rt_info(str(w.vocab_size), ["dflash_markov", "vocab_size"])
    model.set_rt_info(str(w.hidden_size), ["dflash_markov", "hidden_size"])
    model.set_rt_info(SCORE_SEMANTICS, ["dflash_markov", "score_semantics"])
    model.set_rt_info("True" if w.has_confidence else "False", ["dflash_markov", "confidence"])


def build_scorer_ir(w: HeadWeights) -> ov.Model:
    """The Top-K candidate scorer: (predecessor_ids, candidate_ids [R,K] i64, draft_hidden_states
    [R,H] f32) -> edge_bias [R,K,K] f32 (+ confidence [R,K] when the head has a Markov confidence)."""
    pred = _param("predecessor_ids", [-1, -1], ov.Type.i64)
    cand = _param("candidate_ids", [-1, -1], ov.Type.i64)
    hidden = _param("draft_hidden_states", [-1, w.hidden_size], ov.Type.f32)
    axis0 = ops.constant(np.int64(0))
    e = ops.gather(_const(w.predecessor), pred, axis0).output(0)  # [R, K, r]
    s = ops.gather(_const(w.successor), cand, axis0).output(0)  # [R, K, r]
    a = _modulate(w, e, hidden.output(0), expand_axis=1)
    results = [_result(ops.matmul(a, s, False, True).output(0), "edge_bias")]  # [R, K, K]
    if w.has_confidence:
        results.append(_result(_confidence(w, e, hidden.output(0), expand_axis=1), "confidence"))
    model = ov.Model(results, [pred, cand, hidden], "dflash_markov_head_scorer")
    _set_head_rt_info(model, w)
    return model


def build_dense_ir(w: HeadWeights) -> ov.Model:
    """The dense walk's head: (predecessor_ids [R] i64, draft_hidden_states [R,H] f32) -> bias [R,V]
    f32 (+ confidence [R] when the head has a Markov confidence)."""
    if w.head_type == HEAD_SELECTOR:
        raise ValueError("DFlash v2's selector has no dense walk (the contract refuses markov_head_top_k=0 for it)")
    prev = _param("predecessor_ids", [-1], ov.Type.i64)
    hidden = _param("draft_hidden_states", [-1, w.hidden_size], ov.Type.f32)
    e = ops.gather(_const(w.predecessor), prev, ops.constant(np.int64(0))).output(0)  # [R, r]
    a = _modulate(w, e, hidden.output(0), expand_axis=None)
    results = [_result(ops.matmul(a, _const(w.successor), False, True).output(0), "bias")]  # [R, V]
    if w.has_confidence:
        results.append(_result(_confidence(w, e, hidden.output(0), expand_axis=None), "confidence"))
    model = ov.Model(results, [prev, hidden], "dflash_markov_head_dense")
    _set_head_rt_info(model, w)
    return model


def save_head_ir(model: ov.Model, path: Path, weight_format: str = "fp32") -> None:
    """Save a head IR; fp16 halves the factor tables, int8 compresses them with NNCF like the backbone (an int4
    draft's too: the tables are a few MB, so int4 would save little there)."""
    if weight_format in ("int8", "int4"):
        import nncf

        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    ov.save_model(model, str(path), compress_to_fp16=(weight_format == "fp16"))
