"""What every draft IR export shares (DFlash v1, DSpark, DFlash v2): port and state names, the traced
backbone signature, the make-stateful pass, rt_info, saving and the all-or-nothing folder swap.

engine/export/draft.py (the dispatcher and the v1 export), dspark.py and dflash2.py build on it;
nothing here imports them, so the exports form no import cycle.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import openvino as ov
import torch
from torch import nn

from engine.drafts.dflash_v1 import DFlashV1Config, DFlashV1Draft
from engine.export.markov_head import save_head_ir
from engine.export.target import swap_into_place

DRAFT_XML = "openvino_model.xml"
WEIGHT_FORMATS = ("fp32", "fp16", "int8", "int4")
LM_HEAD_BITS = {"int4": 4}  # config.json "lm_head_bits": how the draft stores the target lm_head rows it grafts


def past_input_name(layer: int, kind: str) -> str:
    return f"past_key_values.{layer}.{kind}"


def present_output_name(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"


def state_name(layer: int, kind: str) -> str:
    """Variable id the make-stateful pass gives a layer's K or V (input name + output name)."""
    return past_input_name(layer, kind) + present_output_name(layer, kind)


def trace_inputs(model: DFlashV1Draft) -> tuple[list[torch.Tensor], list[tuple[ov.PartialShape, ov.Type]], list[str]]:
    """Example inputs, dynamic shapes and names of the backbone contract's ports (for ov.convert_model)."""
    c = model.cfg
    n_ctx = len(c.target_layer_ids) * c.hidden_size
    b, q, t, past = 1, max(c.block_size, 2), 3, 2
    example = [
        torch.randn(b, q, c.hidden_size),
        torch.randn(b, t, n_ctx),
        torch.arange(past, past + t + q, dtype=torch.int64)[None],
        torch.ones(b, past + t + q, dtype=torch.int64),
    ]
    shapes: list[tuple[ov.PartialShape, ov.Type]] = [
        (ov.PartialShape([-1, -1, c.hidden_size]), ov.Type.f32),
        (ov.PartialShape([-1, -1, n_ctx]), ov.Type.f32),
        (ov.PartialShape([-1, -1]), ov.Type.i64),
        (ov.PartialShape([-1, -1]), ov.Type.i64),
    ]
    names = ["inputs_embeds", "hidden_states", "position_ids", "attention_mask"]
    for i in range(c.num_hidden_layers):
        for kind in ("key", "value"):
            example.append(torch.randn(b, c.num_key_value_heads, past, c.head_dim))
            shapes.append((ov.PartialShape([-1, c.num_key_value_heads, -1, c.head_dim]), ov.Type.f32))
            names.append(past_input_name(i, kind))
    return example, shapes, names


def make_stateful(ov_model: ov.Model, num_layers: int) -> None:
    """Hide past/present K/V in variables, add beam_idx, and start each variable empty.

    Same recipe optimum-intel applies to decoders: a Gather by beam_idx on every past input,
    OpenVINO's MakeStateful pass, then a zero-length initial value whose batch comes from
    inputs_embeds (so the first call needs no state input).
    """
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    beam_idx = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name="beam_idx")
    beam_idx.output(0).get_tensor().set_names({"beam_idx"})
    ov_model.add_parameters([beam_idx])
    pairs: dict[str, str] = {}
    for i in range(num_layers):
        for kind in ("key", "value"):
            src = ov_model.input(past_input_name(i, kind))
            readers = list(src.get_target_inputs())
            gathered = ops.gather(src, beam_idx, ops.constant(np.int64(0)))
            for r in readers:
                r.replace_source_output(gathered.output(0))
            pairs[past_input_name(i, kind)] = present_output_name(i, kind)
    ov_model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(ov_model, pairs)

    embeds = ov_model.input("inputs_embeds")
    batch = ops.gather(ops.shape_of(embeds, output_type="i64"), ops.constant(np.array([0], np.int64)), ops.constant(np.int64(0)))
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        ps = op.get_output_partial_shape(0)  # [B, Hkv, S, d]
        dims = [batch] + [ops.constant(np.array([ps[k].get_length() if ps[k].is_static else 0], np.int64)) for k in (1, 2, 3)]
        init = ops.broadcast(ops.constant(np.float32(0.0)), ops.concat(dims, axis=0))
        op.set_arguments([init])
    ov_model.validate_nodes_and_infer_types()


def save_ir(ov_model: ov.Model, folder: Path, weight_format: str) -> None:
    """int8: symmetric per output channel (no zero point). It drafts the same tokens as asymmetric int8 and
    its call is cheaper on the CPU (docs/benchmarks.md, "Symmetric int8"); a draft stored as symmetric int8 rows
    (engine/drafts/checkpoint.py) keeps its own grid instead of being rounded a second time.
    int4: every matrix as symmetric int4 in groups of 128 columns (docs/engine.md, "int4 drafts")."""
    if weight_format == "int8":
        import nncf

        ov_model = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_SYM)
    elif weight_format == "int4":
        ov_model = _int4_sym(ov_model)
    ov.save_model(ov_model, str(folder / DRAFT_XML), compress_to_fp16=(weight_format == "fp16"))


def _int4_sym(ov_model: ov.Model) -> ov.Model:
    """Symmetric int4, groups of 128 columns (a width 128 does not divide gets a smaller group, not an error),
    every layer including the first and last: a draft call streams all its weights, so all of them count."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    return nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT4_SYM, ratio=1.0, group_size=128,
                                 all_layers=True, advanced_parameters=AdvancedCompressionParameters(
                                     group_size_fallback_mode=GroupSizeFallbackMode.ADJUST))


# --------------------------------------------------------------------------------------------
# Backbone IR (shared by DSpark and DFlash v2)
# --------------------------------------------------------------------------------------------
class _BackboneSignature(nn.Module):
    """Flat-tensor wrapper: candidate rows (anchor row dropped for offset 1), optional confidence, K/V."""

    def __init__(self, draft: DFlashV1Draft, offset: int, confidence: bool) -> None:
        super().__init__()
        self.draft, self.offset, self.confidence = draft, offset, confidence

    def forward(self, inputs_embeds, hidden_states, position_ids, attention_mask, *past_flat):
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]
        h, kv = self.draft(inputs_embeds, hidden_states, position_ids, past, attention_mask)
        rows = h[:, self.offset:, :] if self.offset else h
        outs = [rows]
        if self.confidence:
            outs.append(self.draft.backbone_confidence(rows))
        return (*outs, *[t for pair in kv for t in pair])


def convert_backbone(model: DFlashV1Draft, offset: int, confidence: bool = False) -> ov.Model:
    """Trace a DFlash-family backbone into a stateful ov.Model in the contract's signature (no rt_info)."""
    c = model.cfg
    example, shapes, names = trace_inputs(model)
    wrapper = _BackboneSignature(model.float().eval(), offset, confidence)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ov_model = ov.convert_model(wrapper, example_input=tuple(example), input=shapes)
    for port, name in zip(ov_model.inputs, names):
        port.get_tensor().set_names({name})
    out_names = ["last_hidden_state"] + (["confidence"] if confidence else []) + [
        present_output_name(i, kind) for i in range(c.num_hidden_layers) for kind in ("key", "value")
    ]
    for port, name in zip(ov_model.outputs, out_names):
        port.get_tensor().set_names({name})
    make_stateful(ov_model, c.num_hidden_layers)
    return ov_model


def set_rt_info(ov_model: ov.Model, entries: Mapping[tuple[str, ...], Any]) -> None:
    for path, value in entries.items():
        ov_model.set_rt_info(str(value), list(path))


def common_rt_info(cfg: DFlashV1Config, variant: str, offset: int) -> dict[tuple[str, ...], Any]:
    return {
        ("dflash_mode",): "True",
        ("dflash", "mask_token_id"): cfg.mask_token_id,
        ("dflash", "target_layer_ids"): ",".join(str(i) for i in cfg.target_layer_ids),
        ("dflash", "variant"): variant,
        ("dflash", "block_size"): cfg.block_size,
        ("dflash", "candidate_position_offset"): offset,
    }


def write_draft_folder(input_dir: Path, output_dir: Path, config: Mapping[str, Any], backbone: ov.Model,
                       heads: Mapping[str, ov.Model], weight_format: str) -> Path:
    """Save backbone + heads + config.json into a temp folder next to output_dir, then swap it in."""
    input_dir, output_dir = Path(input_dir), Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    tmp.chmod(0o755)
    try:
        save_ir(backbone, tmp, weight_format)
        for name, head in heads.items():
            save_head_ir(head, tmp / name, weight_format)
        saved = dict(config)
        if weight_format in LM_HEAD_BITS:
            saved["lm_head_bits"] = LM_HEAD_BITS[weight_format]
        (tmp / "config.json").write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
        gen_cfg = input_dir / "generation_config.json"
        if gen_cfg.is_file():
            shutil.copy2(gen_cfg, tmp / gen_cfg.name)
        swap_into_place(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output_dir


def check_weight_format(weight_format: str) -> None:
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")
