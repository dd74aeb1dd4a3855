"""Export a DFlash v2 checkpoint folder (engine/drafts/dflash2.py) to the draft folder contract
(docs/draft-contract.md): the backbone IR with candidate offset 1 and the selector IR."""
from __future__ import annotations

from pathlib import Path

import openvino as ov

from engine.drafts.dflash2 import VARIANT_DFLASH_V2, DFlash2Draft, load_dflash2_checkpoint
from engine.drafts.heads import HEAD_SELECTOR
from engine.export.ir import check_weight_format, common_rt_info, convert_backbone, set_rt_info, write_draft_folder
from engine.export.markov_head import SCORER_XML, build_scorer_ir


def build_dflash2_irs(model: DFlash2Draft) -> tuple[ov.Model, dict[str, ov.Model]]:
    """(backbone, {scorer file: selector IR}), rt_info set. No dense head: v2 refuses the dense walk."""
    backbone = convert_backbone(model, offset=1)
    vc = model.v2
    info = common_rt_info(model.cfg, VARIANT_DFLASH_V2, 1)
    info[("dflash", "markov_head_type")] = HEAD_SELECTOR
    info[("dflash", "markov_rank")] = vc.selector_rank
    info[("dflash", "markov_head_top_k")] = vc.selector_top_k
    info[("dflash", "input_embedding_scale")] = repr(vc.input_embedding_scale)
    info[("dflash", "output_multiplier")] = repr(vc.output_multiplier)
    if vc.final_logit_softcapping is not None:  # absent = no soft-capping
        info[("dflash", "final_logit_softcapping")] = repr(vc.final_logit_softcapping)
    info[("runtime_options", "ACTIVATIONS_SCALE_FACTOR")] = repr(vc.activations_scale_factor)
    set_rt_info(backbone, info)
    return backbone, {SCORER_XML: build_scorer_ir(model.head_weights())}


def export_dflash2_draft(input_dir: Path, output_dir: Path, weight_format: str = "fp32") -> Path:
    """Export a DFlash v2 checkpoint folder; nothing appears at output_dir unless it all worked."""
    check_weight_format(weight_format)
    model, config = load_dflash2_checkpoint(Path(input_dir))
    backbone, heads = build_dflash2_irs(model)
    return write_draft_folder(input_dir, output_dir, config, backbone, heads, weight_format)
