"""The target IR: folder checks and the graph edits that make one inference return what a step needs.

engine/models/paged_target.py compiles the edited model as a PagedAttention model. Edits made
before compiling (docs/engine.md):
- `logits_indices` (i64 [n]) gathers the rows whose logits are needed before the lm_head, so a
  prefill computes one row of logits instead of one per prompt token;
- `next_token_ids` (TopK k=1 inside the graph) so greedy steps read token ids, not
  full-vocabulary logits;
- `target_hidden` = concat of the tapped decoder-layer outputs (the draft's context rows).
"""
from __future__ import annotations

from pathlib import Path

import openvino as ov
import openvino.opset13 as ops

from engine.errors import ModelFolderError
from engine.models.files import check_folder

HIDDEN_ANNOTATION = "hidden_states_decoder_layers"
REQUIRED_TARGET_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml")


def check_target_dir(path: Path) -> None:
    """Raise ModelFolderError naming the missing file and the fix."""
    path = check_folder(path, "Target folder", "choose an OpenVINO model folder (export one with "
                        "`dflash-studio export --kind target`).")
    missing = [f for f in REQUIRED_TARGET_FILES if not (path / f).is_file()]
    if missing:
        raise ModelFolderError(
            f"Target folder {path} lacks {', '.join(missing)}: it is not a complete OpenVINO LLM export. "
            "Export the Hugging Face model again with `dflash-studio export --kind target`.")


def layer_outputs(model: ov.Model) -> dict[int, ov.Output]:
    """Decoder-layer outputs of the target (annotation first, else a graph search)."""
    from engine.models.hidden_taps import find_decoder_layer_outputs

    return find_decoder_layer_outputs(model)


def num_decoder_layers(model: ov.Model) -> int:
    return len(layer_outputs(model))


def _lm_head(model: ov.Model) -> ov.Node:
    node = model.output("logits").get_node().input_value(0).get_node()
    if node.get_type_name() != "MatMul":
        raise ModelFolderError("The target's logits do not come straight from an lm_head MatMul; "
                               "this architecture is not supported yet.")
    return node


def edit_target_graph(model: ov.Model, tap_layers: list[int] | None, row_axis: int = 1) -> ov.Model:
    """Add logits_indices, next_token_ids and (with taps) target_hidden to the read model.

    `row_axis` is the token axis of the lm_head input: 1 for [batch, tokens, H], 0 for the paged
    model's [tokens, 1, H]."""
    lm_head = _lm_head(model)
    hidden_in = lm_head.input_value(0)
    indices = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    indices.output(0).get_tensor().set_names({"logits_indices"})
    gathered = ops.gather(hidden_in, indices, ops.constant(row_axis, ov.Type.i64))
    lm_head.input(0).replace_source_output(gathered.output(0))
    model.add_parameters([indices])
    topk = ops.topk(model.output("logits").get_node().input_value(0), 1, -1, "max", "none", ov.Type.i32)
    ids = ops.result(topk.output(1))
    ids.output(0).get_tensor().set_names({"next_token_ids"})
    results = [ids]
    if tap_layers:
        taps = layer_outputs(model)
        last = max(taps)
        for layer in tap_layers:
            if layer not in taps:
                raise ModelFolderError(f"Target layer {layer} does not exist: the target has layers 0..{last}.")
            if layer == last:
                raise ModelFolderError(
                    f"Target layer {layer} is the last decoder layer, whose output is taken after the final "
                    "norm; DFlash drafts must tap earlier layers. The draft does not fit this target.")
        cat = ops.concat([taps[i] for i in tap_layers], -1)
        hid = ops.result(cat)
        hid.output(0).get_tensor().set_names({"target_hidden"})
        results.append(hid)
    model.add_results(results)
    model.validate_nodes_and_infer_types()
    return model
