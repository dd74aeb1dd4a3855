"""Export a DFlash draft checkpoint to the OpenVINO draft IR contract (spec §2.3).

The IR is the one optimum-intel 2.2.0 writes for Qwen3 DFlash drafts, so openvino_genai's DFlash
pipeline and our own engine read the same folder:

  inputs   inputs_embeds  f32 [B, block, H]          embeddings of [anchor, MASK...] (target's table)
           hidden_states  f32 [B, ctx, n*H]          NEW target context rows since the last call
           position_ids   i64 [B, ctx+block]         contiguous, starting at the state's length
           attention_mask i64 [B, past+ctx+block]    ones (padding only; attention is non-causal)
           beam_idx       i32 [B]                    reorders the state rows (stateful contract)
  state    past_key_values.{i}.{key,value}present.{i}.{key,value}: [B, Hkv, past+ctx, d], context only
  output   last_hidden_state f32 [B, block-1, H]     post final norm, seed row dropped (z-lab layout)

The block's own K/V never enter the state, so a rejected draft needs no state rollback.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import torch
from torch import nn

from engine.errors import ModelFolderError
from engine.export.dflash_v1 import DFLASH_V1_ARCH, DFlashV1Draft, load_checkpoint, read_config
from engine.models.draft_vocab import VOCAB_FILE

DRAFT_XML = "openvino_model.xml"
WEIGHT_FORMATS = ("fp32", "fp16", "int8")
VARIANT_DFLASH_V1 = "dflash_v1"

VARIANT_DSPARK = "dspark"
VARIANT_DFLASH_V2 = "dflash_v2"

# architectures[0] -> variant for the DFlash-family drafts exported by their own modules
# (engine/export/dspark.py, engine/export/dflash2.py; folder contract in docs/draft-contract.md).
_OTHER_VARIANTS = {
    "Qwen3DSparkModel": VARIANT_DSPARK,
    "DFlash2DraftModel": VARIANT_DFLASH_V2,
}


def past_input_name(layer: int, kind: str) -> str:
    return f"past_key_values.{layer}.{kind}"


def present_output_name(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"


def state_name(layer: int, kind: str) -> str:
    """Variable id the make-stateful pass gives a layer's K or V (input name + output name)."""
    return past_input_name(layer, kind) + present_output_name(layer, kind)


def detect_variant(config: dict[str, Any]) -> str:
    """Name the draft variant from config.json's architectures."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch == DFLASH_V1_ARCH:
        return VARIANT_DFLASH_V1
    if arch in _OTHER_VARIANTS:
        return _OTHER_VARIANTS[arch]
    raise ModelFolderError(f"not a DFlash draft checkpoint: architectures={archs!r}")


class _IRSignature(nn.Module):
    """Flat-tensor wrapper so tracing yields the IR's inputs/outputs in a fixed order."""

    def __init__(self, draft: DFlashV1Draft) -> None:
        super().__init__()
        self.draft = draft

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        hidden_states: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *past_flat: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]
        h, kv = self.draft(inputs_embeds, hidden_states, position_ids, past, attention_mask)
        flat = [t for pair in kv for t in pair]
        return (h[:, 1:, :], *flat)


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


def convert_draft(model: DFlashV1Draft) -> ov.Model:
    """Trace the torch draft into a stateless ov.Model with named past/present K/V ports."""
    c = model.cfg
    example, shapes, names = trace_inputs(model)
    wrapper = _IRSignature(model.float().eval())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript tracer chatter; the parity tests are the check
        ov_model = ov.convert_model(wrapper, example_input=tuple(example), input=shapes)
    for port, name in zip(ov_model.inputs, names):
        port.get_tensor().set_names({name})
    out_names = ["last_hidden_state"] + [
        present_output_name(i, kind) for i in range(c.num_hidden_layers) for kind in ("key", "value")
    ]
    for port, name in zip(ov_model.outputs, out_names):
        port.get_tensor().set_names({name})
    return ov_model


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


def add_rt_info(ov_model: ov.Model, config: dict[str, Any], variant: str) -> None:
    """The keys openvino_genai reads (dflash_mode, mask id, layer ids) plus our own layout keys."""
    dcfg = config.get("dflash_config") or {}
    ov_model.set_rt_info("True", ["dflash_mode"])
    ov_model.set_rt_info(str(dcfg["mask_token_id"]), ["dflash", "mask_token_id"])
    ov_model.set_rt_info(",".join(str(i) for i in dcfg["target_layer_ids"]), ["dflash", "target_layer_ids"])
    ov_model.set_rt_info(variant, ["dflash", "variant"])
    ov_model.set_rt_info(str(int(config.get("block_size", 16))), ["dflash", "block_size"])
    ov_model.set_rt_info("1", ["dflash", "candidate_position_offset"])
    # optimum-intel marks its stateful LLM exports so GPU fp16 inference scales activations down.
    ov_model.set_rt_info("8.0", ["runtime_options", "ACTIVATIONS_SCALE_FACTOR"])


def build_ir(model: DFlashV1Draft, config: dict[str, Any]) -> ov.Model:
    """Torch draft -> stateful ov.Model with rt_info (not yet saved)."""
    ov_model = convert_draft(model)
    make_stateful(ov_model, model.cfg.num_hidden_layers)
    add_rt_info(ov_model, config, VARIANT_DFLASH_V1)
    return ov_model


def save_ir(ov_model: ov.Model, folder: Path, weight_format: str) -> None:
    if weight_format == "int8":
        import nncf

        ov_model = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    ov.save_model(ov_model, str(folder / DRAFT_XML), compress_to_fp16=(weight_format == "fp16"))


def export_draft(input_dir: Path, output_dir: Path, weight_format: str = "fp32") -> Path:
    """Export a draft checkpoint folder to an IR folder; nothing appears at output_dir unless it all worked.

    The checkpoint's sub-vocabulary (draft_vocabulary.json, engine/models/draft_vocab.py) goes along."""
    out = _export_ir(Path(input_dir), Path(output_dir), weight_format)
    vocabulary = Path(input_dir) / VOCAB_FILE
    if vocabulary.is_file():
        shutil.copy2(vocabulary, out / VOCAB_FILE)
    return out


def _export_ir(input_dir: Path, output_dir: Path, weight_format: str) -> Path:
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")
    config = read_config(input_dir)
    variant = detect_variant(config)
    if variant == VARIANT_DSPARK:
        from engine.export.dspark import export_dspark_draft

        return export_dspark_draft(input_dir, output_dir, weight_format)
    if variant == VARIANT_DFLASH_V2:
        from engine.export.dflash2 import export_dflash2_draft

        return export_dflash2_draft(input_dir, output_dir, weight_format)
    model, config = load_checkpoint(input_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the final folder should look like any other
    try:
        ov_model = build_ir(model, config)
        save_ir(ov_model, tmp, weight_format)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        gen_cfg = input_dir / "generation_config.json"
        if gen_cfg.is_file():
            shutil.copy2(gen_cfg, tmp / gen_cfg.name)
        _replace_dir(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output_dir


def _replace_dir(new: Path, dest: Path) -> None:
    """Move `new` to `dest`; an existing `dest` is swapped out first and removed after."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
    try:
        new.rename(dest)
    except BaseException:
        if old is not None:
            old.rename(dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
