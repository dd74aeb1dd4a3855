"""Export a DSpark checkpoint folder (engine/drafts/dspark.py) to the draft folder contract
(docs/draft-contract.md): the backbone IR with candidate offset 0 and the Markov head IRs."""
from __future__ import annotations

from pathlib import Path

import openvino as ov

from engine.drafts.dspark import VARIANT_DSPARK, DSparkDraft, load_dspark_checkpoint
from engine.export.ir import check_weight_format, common_rt_info, convert_backbone, set_rt_info, write_draft_folder
from engine.export.markov_head import DENSE_XML, SCORER_XML, build_dense_ir, build_scorer_ir

DSPARK_ACTIVATIONS_SCALE_FACTOR = 8.0  # as optimum-intel writes for v1 drafts


def build_dspark_irs(model: DSparkDraft) -> tuple[ov.Model, dict[str, ov.Model]]:
    """(backbone, {file name: head IR}) for a DSpark draft, rt_info set."""
    backbone = convert_backbone(model, offset=0, confidence=model.backbone_has_confidence)
    dc = model.dspark
    info = common_rt_info(model.cfg, VARIANT_DSPARK, 0)
    info[("dflash", "markov_head_type")] = dc.markov_head_type
    info[("dflash", "markov_rank")] = dc.markov_rank
    info[("dflash", "markov_head_top_k")] = model.default_top_k
    if model.confidence_head is not None:
        # "True": the backbone outputs `confidence`; "markov_head": the head IRs do (it reads W1[prev]).
        info[("dflash", "confidence_head")] = "True" if model.backbone_has_confidence else "markov_head"
    info[("runtime_options", "ACTIVATIONS_SCALE_FACTOR")] = DSPARK_ACTIVATIONS_SCALE_FACTOR
    set_rt_info(backbone, info)
    heads: dict[str, ov.Model] = {}
    w = model.head_weights()
    if w is not None:
        heads[SCORER_XML] = build_scorer_ir(w)
        heads[DENSE_XML] = build_dense_ir(w)
    return backbone, heads


def export_dspark_draft(input_dir: Path, output_dir: Path, weight_format: str = "fp32") -> Path:
    """Export a DSpark checkpoint folder; nothing appears at output_dir unless it all worked."""
    check_weight_format(weight_format)
    model, config = load_dspark_checkpoint(Path(input_dir))
    backbone, heads = build_dspark_irs(model)
    return write_draft_folder(input_dir, output_dir, config, backbone, heads, weight_format)
