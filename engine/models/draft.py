"""DFlash-family drafts: folder metadata, the fit check against a target, and the compiled draft.

The draft IR (optimum-intel's DFlash contract) takes `inputs_embeds` and returns post-norm
`last_hidden_state`; it has no embedding or lm_head of its own. At load we graft the target's
embedding Gather and lm_head MatMul (their compressed-weight subgraphs, so int8 stays int8) onto it
and append a TopK, so one draft inference goes from token ids to candidate ids and no
full-vocabulary logits leave the graph (docs/engine.md).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from engine.errors import DraftMismatchError, ModelFolderError
from engine.models.target import _lm_head, check_target_dir, num_decoder_layers

DRAFT_FILES = ("openvino_model.xml", "openvino_model.bin")


@dataclass
class DraftInfo:
    """What a draft folder declares (IR rt_info first, config.json as a fallback)."""

    folder: Path
    variant: str  # "dflash_v1"
    mask_token_id: int
    target_layer_ids: list[int]
    block_size: int
    hidden_size: int  # width of inputs_embeds
    context_width: int  # width of hidden_states (= len(target_layer_ids) * target hidden)
    vocab_size: int | None  # from config.json, when it says

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def max_candidates(self) -> int:
        return self.block_size - 1


def _rt(model: ov.Model, *path: str) -> str | None:
    try:
        return model.get_rt_info(list(path)).astype(str)
    except RuntimeError:
        return None


def read_draft_info(folder: Path, core: ov.Core | None = None) -> DraftInfo:
    """Read a draft folder's metadata; raise ModelFolderError saying what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"Draft folder {folder} does not exist: choose a folder exported with "
                               "`dflash-studio export --kind draft`.")
    missing = [f for f in DRAFT_FILES if not (folder / f).is_file()]
    if missing:
        raise ModelFolderError(f"Draft folder {folder} lacks {', '.join(missing)}: export the draft again with "
                               "`dflash-studio export --kind draft`.")
    model = (core or ov.Core()).read_model(folder / "openvino_model.xml")
    if _rt(model, "dflash_mode") is None:
        raise ModelFolderError(f"{folder} holds an OpenVINO model that is not a DFlash draft (no dflash_mode in "
                               "its metadata): pick a DFlash/DSpark draft folder, or use it as a target.")
    names = {i.get_any_name() for i in model.inputs}
    if not {"inputs_embeds", "hidden_states", "position_ids", "attention_mask"} <= names:
        raise ModelFolderError(f"Draft {folder} has inputs {sorted(names)}, not the DFlash draft contract "
                               "(inputs_embeds, hidden_states, position_ids, attention_mask).")
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    dcfg = config.get("dflash_config", {})
    mask = _rt(model, "dflash", "mask_token_id") or dcfg.get("mask_token_id", config.get("mask_token_id"))
    layers = _rt(model, "dflash", "target_layer_ids")
    layer_ids = ([int(x) for x in layers.split(",")] if layers
                 else list(dcfg.get("target_layer_ids", config.get("target_layer_ids", []))))
    block = _rt(model, "dflash", "block_size") or config.get("block_size")
    if mask is None or not layer_ids or block is None:
        raise ModelFolderError(f"Draft {folder} does not say its mask_token_id, target_layer_ids and block_size "
                               "(IR metadata or config.json): re-export it with `dflash-studio export --kind draft`.")
    variant = _rt(model, "dflash", "variant") or "dflash_v1"
    return DraftInfo(
        folder=folder, variant=variant, mask_token_id=int(mask), target_layer_ids=layer_ids,
        block_size=int(block),
        hidden_size=int(model.input("inputs_embeds").get_partial_shape()[2].get_length()),
        context_width=int(model.input("hidden_states").get_partial_shape()[2].get_length()),
        vocab_size=config.get("vocab_size"),
    )


def check_draft_fits(target_dir: Path, draft_dir: Path, core: ov.Core | None = None) -> list[str]:
    """Reasons why the draft cannot serve the target; an empty list means it fits."""
    core = core or ov.Core()
    try:
        check_target_dir(Path(target_dir))
        info = read_draft_info(Path(draft_dir), core)
    except ModelFolderError as exc:
        return [str(exc)]
    target = core.read_model(Path(target_dir) / "openvino_model.xml")
    vocab = int(target.output("logits").get_partial_shape()[2].get_length())
    hidden = int(_lm_head(target).input_value(0).get_partial_shape()[2].get_length())
    layers = num_decoder_layers(target)
    reasons: list[str] = []
    if info.vocab_size is not None and info.vocab_size != vocab:
        reasons.append(f"Vocabulary: the draft was built for {info.vocab_size} tokens, the target has {vocab}. "
                       "Use a draft trained for this target's tokenizer.")
    if not 0 <= info.mask_token_id < vocab:
        reasons.append(f"Vocabulary: mask_token_id {info.mask_token_id} is outside the target's {vocab} tokens.")
    if info.hidden_size != hidden:
        reasons.append(f"Hidden size: the draft takes embeddings of width {info.hidden_size}, the target's are "
                       f"{hidden} wide. The draft belongs to another model size.")
    if info.context_width != len(info.target_layer_ids) * hidden:
        reasons.append(f"Hidden size: the draft expects context rows of width {info.context_width}, but "
                       f"{len(info.target_layer_ids)} target layers of width {hidden} give "
                       f"{len(info.target_layer_ids) * hidden}.")
    bad = [i for i in info.target_layer_ids if not 0 <= i < layers - 1]
    if bad:
        reasons.append(f"Layer ids: the draft taps target layers {bad}, but this target's tappable layers are "
                       f"0..{layers - 2} (layer {layers - 1} is after the final norm). The draft was trained "
                       "for a deeper target.")
    return reasons


def _source_param(out: ov.Output) -> str | None:
    """Name of the Parameter an output comes from through Converts, if any."""
    node = out.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_friendly_name() if node.get_type_name() == "Parameter" else None


def _embedding_weights(target: ov.Model) -> ov.Output:
    ids_param = target.input("input_ids").get_node().get_friendly_name()
    for op in target.get_ordered_ops():
        if op.get_type_name() == "Gather" and _source_param(op.input_value(1)) == ids_param:
            return op.input_value(0)
    raise ModelFolderError("Could not find the target's token embedding (a Gather over input_ids).")


def _to_f32(out: ov.Output) -> ov.Output:
    return out if out.get_element_type() == ov.Type.f32 else ops.convert(out, ov.Type.f32).output(0)


def graft_target_head(draft: ov.Model, target: ov.Model, top_k: int = 1) -> ov.Model:
    """Replace `inputs_embeds` by the target's embedding of `input_ids`; add lm_head + TopK outputs."""
    embeds = draft.input("inputs_embeds").get_node()
    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    input_ids.output(0).get_tensor().set_names({"input_ids"})
    gathered = _to_f32(ops.gather(_embedding_weights(target), input_ids, ops.constant(0, ov.Type.i64)).output(0))
    for consumer in list(embeds.output(0).get_target_inputs()):
        consumer.replace_source_output(gathered)
    draft.remove_parameter(embeds)
    draft.add_parameters([input_ids])
    head = _lm_head(target)
    hidden = draft.output("last_hidden_state").get_node().input_value(0)
    logits = ops.matmul(hidden, head.input_value(1), False, head.get_attributes()["transpose_b"])
    topk = ops.topk(_to_f32(logits.output(0)), top_k, -1, "max", "value", ov.Type.i32)
    ids = ops.result(topk.output(1))
    ids.output(0).get_tensor().set_names({"draft_token_ids"})
    full = ops.result(_to_f32(logits.output(0)))  # read only by sampled requests (zero-copy view)
    full.output(0).get_tensor().set_names({"draft_logits"})
    draft.add_results([ids, full])
    draft.validate_nodes_and_infer_types()
    return draft


class DraftModel:
    """A compiled DFlash draft for one sequence; its KV state holds committed context rows only."""

    def __init__(self, info: DraftInfo, target_folder: Path, core: ov.Core, device: str,
                 properties: dict[str, str]) -> None:
        self.info = info
        draft = core.read_model(info.folder / "openvino_model.xml")
        target = core.read_model(Path(target_folder) / "openvino_model.xml")
        self.compiled = core.compile_model(graft_target_head(draft, target), device, properties)
        self.request = self.compiled.create_infer_request()
        self.committed = 0  # context rows held in the draft's KV state
        self._beam = np.zeros(1, np.int32)
        self.last_model_ms = 0.0

    def reset(self) -> None:
        self.request.reset_state()
        self.committed = 0

    def draft(self, anchor: int, num_candidates: int, context: np.ndarray) -> np.ndarray:
        """Propose `num_candidates` tokens after `anchor`, feeding the new context rows `context` [T, n*H]."""
        rows = context.shape[0]
        block = num_candidates + 1
        total = self.committed + rows + block
        ids = np.full((1, block), self.info.mask_token_id, np.int64)
        ids[0, 0] = anchor
        t0 = time.perf_counter()
        self.request.infer({
            "input_ids": ids,
            "hidden_states": np.ascontiguousarray(context, dtype=np.float32).reshape(1, rows, -1),
            "position_ids": np.arange(self.committed, total, dtype=np.int64).reshape(1, -1),
            "attention_mask": np.ones((1, total), np.int64),
            "beam_idx": self._beam,
        }, share_inputs=True, share_outputs=True)
        self.last_model_ms = (time.perf_counter() - t0) * 1e3
        self.committed += rows
        return self.request.get_tensor("draft_token_ids").data.reshape(-1).copy()

    def last_logits(self) -> np.ndarray:
        """Full-vocabulary logits [N, V] of the last draft call (a view, valid until the next call)."""
        return self.request.get_tensor("draft_logits").data[0]
