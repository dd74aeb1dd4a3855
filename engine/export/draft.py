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

import shutil
import warnings
from pathlib import Path
from typing import Any

import openvino as ov
import torch
from torch import nn

from engine.drafts import VARIANT_DFLASH_V1, VARIANT_DFLASH_V2, VARIANT_DSPARK, detect_variant  # noqa: F401
from engine.drafts.dflash_v1 import DFlashV1Draft, load_checkpoint, read_config
from engine.export.ir import (  # noqa: F401  (DRAFT_XML, WEIGHT_FORMATS, state_name: the folder contract's names)
    DRAFT_XML,
    WEIGHT_FORMATS,
    check_weight_format,
    make_stateful,
    present_output_name,
    state_name,
    trace_inputs,
    write_draft_folder,
)
from engine.models.draft_vocab import VOCAB_FILE


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


def export_draft(input_dir: Path, output_dir: Path, weight_format: str = "fp32") -> Path:
    """Export a draft checkpoint folder to an IR folder; nothing appears at output_dir unless it all worked.

    The checkpoint's sub-vocabulary (draft_vocabulary.json, engine/models/draft_vocab.py) goes along."""
    out = _export_ir(Path(input_dir), Path(output_dir), weight_format)
    vocabulary = Path(input_dir) / VOCAB_FILE
    if vocabulary.is_file():
        shutil.copy2(vocabulary, out / VOCAB_FILE)
    return out


def _export_ir(input_dir: Path, output_dir: Path, weight_format: str) -> Path:
    check_weight_format(weight_format)
    config = read_config(input_dir)
    variant = detect_variant(config)
    if variant == VARIANT_DSPARK:
        from engine.export.dspark import export_dspark_draft

        return export_dspark_draft(input_dir, output_dir, weight_format)
    if variant == VARIANT_DFLASH_V2:
        from engine.export.dflash2 import export_dflash2_draft

        return export_dflash2_draft(input_dir, output_dir, weight_format)
    model, config = load_checkpoint(input_dir)
    return write_draft_folder(input_dir, output_dir, config, build_ir(model, config), {}, weight_format)
