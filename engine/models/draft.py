"""DFlash-family drafts: folder metadata, the fit check against a target, and the compiled draft.

The draft IR (optimum-intel's DFlash contract) takes `inputs_embeds` and returns post-norm
`last_hidden_state`; it has no embedding or lm_head of its own. At load we graft the target's
embedding Gather and lm_head MatMul (their compressed-weight subgraphs, so int8 stays int8) onto it
and append a TopK, so one draft inference goes from token ids to candidate ids and no
full-vocabulary logits leave the graph (docs/engine.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from engine.errors import ModelFolderError
from engine.models.bound_inputs import BoundInputs
from engine.models.draft_kv import KVInput, externalize_kv, skip_converts, split_past_attention
from engine.models.draft_vocab import read_draft_vocabulary, slice_rows
from engine.models.files import check_folder, read_ir, read_optional_json_object
from engine.models.folders import TargetFolder, as_target_folder
from engine.models.int4_head import int4_weight
from engine.models.target import _lm_head

DRAFT_FILES = ("openvino_model.xml", "openvino_model.bin")
SCORER_FILE = "openvino_markov_head_model.xml"
DENSE_HEAD_FILE = "openvino_markov_head_dense_model.xml"
VARIANTS = ("dflash_v1", "dspark", "dflash_v2")
_REEXPORT = "export the draft again with `dflash-studio export --kind draft` (or copy the folder again)."


@dataclass
class DraftInfo:
    """What a draft folder declares (IR rt_info first, config.json as a fallback)."""

    folder: Path
    variant: str  # one of VARIANTS
    mask_token_id: int
    target_layer_ids: list[int]
    block_size: int
    hidden_size: int  # width of inputs_embeds
    context_width: int  # width of hidden_states (= len(target_layer_ids) * target hidden)
    vocab_size: int | None  # from config.json, when it says
    candidate_offset: int = 1  # 1: z-lab layout (anchor row dropped); 0: DSpark "sample from anchor"
    head_type: str = "none"  # none | vanilla | gated | selector
    markov_rank: int = 0
    default_top_k: int = 0  # the scorer's K when a request does not say
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0
    activations_scale_factor: float | None = None  # GPU compile floor (DFlash v2)
    confidence_source: str = "none"  # none | backbone | markov_head (DSpark confidence_head_with_markov)
    recommended_candidates: int | None = None  # config.json "num_assistant_tokens": the draft's tuned default
    sliding_window: int | None = None  # config.json: some layers only see keys this close (by slot index)
    head_bits: int = 8  # config.json "lm_head_bits": 4 stores the grafted sub-vocabulary rows as int4 (int4_head.py)
    model: ov.Model | None = field(default=None, repr=False, compare=False)  # the IR as read (clone it to edit)

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def max_candidates(self) -> int:
        """Candidates one block yields: the block minus the anchor row in the z-lab layout."""
        return self.block_size - self.candidate_offset

    @property
    def default_candidates(self) -> int:
        """Candidates per step when a request does not say: the draft's tuned value, else a full block."""
        rec = self.recommended_candidates
        return min(rec, self.max_candidates) if rec and rec > 0 else self.max_candidates

    @property
    def has_head(self) -> bool:
        return self.head_type != "none"

    @property
    def has_confidence(self) -> bool:
        """Whether drafted positions come with a confidence (DSpark confidence head)."""
        return self.confidence_source != "none"


def _rt(model: ov.Model, *path: str) -> str | None:
    try:
        return model.get_rt_info(list(path)).astype(str)
    except RuntimeError:
        return None


def read_draft_info(folder: Path, core: ov.Core | None = None) -> DraftInfo:
    """Read a draft folder's metadata; raise ModelFolderError saying what is missing."""
    folder = check_folder(folder, "Draft folder", "choose a folder exported with `dflash-studio export --kind draft`.")
    missing = [f for f in DRAFT_FILES if not (folder / f).is_file()]
    if missing:
        raise ModelFolderError(f"Draft folder {folder} lacks {', '.join(missing)}: export the draft again with "
                               "`dflash-studio export --kind draft`.")
    model = read_ir(core or ov.Core(), folder / "openvino_model.xml", _REEXPORT)
    if _rt(model, "dflash_mode") is None:
        raise ModelFolderError(f"{folder} holds an OpenVINO model that is not a DFlash draft (no dflash_mode in "
                               "its metadata): pick a DFlash/DSpark draft folder, or use it as a target.")
    names = {i.get_any_name() for i in model.inputs}
    if not {"inputs_embeds", "hidden_states", "position_ids", "attention_mask"} <= names:
        raise ModelFolderError(f"Draft {folder} has inputs {sorted(names)}, not the DFlash draft contract "
                               "(inputs_embeds, hidden_states, position_ids, attention_mask).")
    config = read_optional_json_object(folder / "config.json", _REEXPORT)
    dcfg = config.get("dflash_config") or {}
    if not isinstance(dcfg, dict):
        raise ModelFolderError(f"{folder / 'config.json'}: dflash_config is a {type(dcfg).__name__}, not an object: "
                               f"{_REEXPORT}")
    mask = _rt(model, "dflash", "mask_token_id") or dcfg.get("mask_token_id", config.get("mask_token_id"))
    layers = _rt(model, "dflash", "target_layer_ids")
    layer_ids = ([int(x) for x in layers.split(",")] if layers
                 else list(dcfg.get("target_layer_ids", config.get("target_layer_ids", []))))
    block = _rt(model, "dflash", "block_size") or config.get("block_size")
    if mask is None or not layer_ids or block is None:
        raise ModelFolderError(f"Draft {folder} does not say its mask_token_id, target_layer_ids and block_size "
                               "(IR metadata or config.json): re-export it with `dflash-studio export --kind draft`.")
    variant = _rt(model, "dflash", "variant") or "dflash_v1"
    if variant not in VARIANTS:
        raise ModelFolderError(f"Draft {folder} says variant {variant!r}; this version knows {', '.join(VARIANTS)}.")

    def num(key: str, default: float) -> float:
        value = _rt(model, "dflash", key)
        return float(value) if value not in (None, "") else default

    asf = _rt(model, "runtime_options", "ACTIVATIONS_SCALE_FACTOR")
    info = DraftInfo(
        folder=folder, variant=variant, mask_token_id=int(mask), target_layer_ids=layer_ids,
        block_size=int(block),
        hidden_size=int(model.input("inputs_embeds").get_partial_shape()[2].get_length()),
        context_width=int(model.input("hidden_states").get_partial_shape()[2].get_length()),
        vocab_size=config.get("vocab_size"),
        candidate_offset=int(num("candidate_position_offset", 0 if variant == "dspark" else 1)),
        head_type=_rt(model, "dflash", "markov_head_type") or "none",
        markov_rank=int(num("markov_rank", 0)),
        default_top_k=int(num("markov_head_top_k", 0)),
        input_embedding_scale=num("input_embedding_scale", 1.0),
        output_multiplier=num("output_multiplier", 1.0),
        final_logit_softcapping=num("final_logit_softcapping", 0.0),
        activations_scale_factor=float(asf) if asf else None,
        recommended_candidates=config.get("num_assistant_tokens") if isinstance(config.get("num_assistant_tokens"), int)
        else None,
        sliding_window=_sliding_window(config),
        head_bits=4 if config.get("lm_head_bits") == 4 else 8,
        confidence_source={"true": "backbone", "markov_head": "markov_head"}.get(
            (_rt(model, "dflash", "confidence_head") or "").lower(), "none"),
        model=model,
    )
    if info.has_head and not (folder / SCORER_FILE).is_file():
        raise ModelFolderError(f"Draft {folder} declares a {info.head_type} Markov head but {SCORER_FILE} is "
                               "missing: export the draft again, or copy the head files next to the backbone.")
    for name in (SCORER_FILE, DENSE_HEAD_FILE):
        for f in (folder / name, (folder / name).with_suffix(".bin")):
            if info.has_head and f.is_file() and f.stat().st_size == 0:
                raise ModelFolderError(f"{f} is empty (0 bytes; a copy or export that did not finish): {_REEXPORT}")
    return info


def _sliding_window(config: dict) -> int | None:
    """The window of the draft's sliding-attention layers, if it has any."""
    window = config.get("sliding_window")
    sliding = "sliding_attention" in (config.get("layer_types") or []) or config.get("use_sliding_window")
    return int(window) if sliding and window else None


def check_draft_fits(target: TargetFolder | Path, draft: DraftInfo | Path, core: ov.Core | None = None) -> list[str]:
    """Reasons why the draft cannot serve the target; an empty list means it fits. Folders already
    read (a TargetFolder, a DraftInfo) are not read again."""
    core = core or ov.Core()
    try:
        target = as_target_folder(target, core)
        info = draft if isinstance(draft, DraftInfo) else read_draft_info(Path(draft), core)
    except ModelFolderError as exc:
        return [str(exc)]
    vocab, hidden, layers = target.vocab_size, target.hidden_size, target.num_layers
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
    try:
        read_draft_vocabulary(info.folder, vocab)
    except ModelFolderError as exc:
        reasons.append(f"Vocabulary: {exc}")
    bad = [i for i in info.target_layer_ids if not 0 <= i < layers - 1]
    if bad:
        reasons.append(f"Layer ids: the draft taps target layers {bad}, but this target's tappable layers are "
                       f"0..{layers - 2} (layer {layers - 1} is after the final norm). The draft was trained "
                       "for a deeper target.")
    return reasons


def _source_param(out: ov.Output) -> str | None:
    """Name of the Parameter an output comes from through Converts, if any."""
    node = skip_converts(out)
    return node.get_friendly_name() if node.get_type_name() == "Parameter" else None


def _embedding_weights(target: ov.Model) -> ov.Output:
    ids_param = target.input("input_ids").get_node().get_friendly_name()
    for op in target.get_ordered_ops():
        if op.get_type_name() == "Gather" and _source_param(op.input_value(1)) == ids_param:
            return op.input_value(0)
    raise ModelFolderError("Could not find the target's token embedding (a Gather over input_ids).")


def _to_f32(out: ov.Output) -> ov.Output:
    return out if out.get_element_type() == ov.Type.f32 else ops.convert(out, ov.Type.f32).output(0)


def graft_target_head(draft: ov.Model, target: ov.Model, info: DraftInfo | None = None,
                      vocabulary: np.ndarray | None = None) -> bool:
    """Replace `inputs_embeds` by the target's embedding of `input_ids`; add lm_head + Top-K outputs.

    Outputs added: `draft_topk_ids` / `draft_topk_logits` ([1, N, k], k from the scalar input
    `top_k`), `draft_logits` (rows read by sampled requests and the dense walk). DFlash v2's
    scales apply here: embeddings x input_embedding_scale, U = softcap(output_multiplier x logits).
    With a `vocabulary` (engine/models/draft_vocab.py) the lm_head keeps only those rows: then
    `draft_logits` has one column per vocabulary id and `draft_topk_ids` are mapped back to token
    ids in the graph. Returns whether the vocabulary was applied (False: the weight's form could
    not be sliced, and the full vocabulary is scored).
    """
    embeds = draft.input("inputs_embeds").get_node()
    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    input_ids.output(0).get_tensor().set_names({"input_ids"})
    gathered = _to_f32(ops.gather(_embedding_weights(target), input_ids, ops.constant(0, ov.Type.i64)).output(0))
    if info is not None and info.input_embedding_scale != 1.0:
        gathered = ops.multiply(gathered, ops.constant(np.float32(info.input_embedding_scale))).output(0)
    for consumer in list(embeds.output(0).get_target_inputs()):
        consumer.replace_source_output(gathered)
    draft.remove_parameter(embeds)
    head = _lm_head(target)
    hidden = draft.output("last_hidden_state").get_node().input_value(0)
    transpose_b = head.get_attributes()["transpose_b"]
    weight = head.input_value(1)
    sliced = (slice_rows(weight, vocabulary, int(target.output("logits").get_partial_shape()[2].get_length()))
              if vocabulary is not None and transpose_b else None)
    if sliced is not None and info is not None and info.head_bits == 4:
        packed = int4_weight(sliced)
        sliced = sliced if packed is None else packed
    logits = _to_f32(ops.matmul(hidden, weight if sliced is None else sliced, False, transpose_b).output(0))
    if info is not None and info.output_multiplier != 1.0:
        logits = ops.multiply(logits, ops.constant(np.float32(info.output_multiplier))).output(0)
    if info is not None and info.final_logit_softcapping > 0.0:
        cap = ops.constant(np.float32(info.final_logit_softcapping))
        logits = ops.multiply(ops.tanh(ops.divide(logits, cap)), cap).output(0)
    top_k = ops.parameter([], ov.Type.i64, name="top_k")
    top_k.output(0).get_tensor().set_names({"top_k"})
    draft.add_parameters([input_ids, top_k])
    k = top_k if sliced is None else ops.minimum(top_k, ops.constant(np.int64(len(vocabulary))))  # a K past a tiny vocabulary
    topk = ops.topk(logits, k, -1, "max", "value", ov.Type.i32)
    topk_ids = topk.output(1)
    if sliced is not None:  # columns of the sub-vocabulary -> token ids
        topk_ids = ops.gather(ops.constant(vocabulary.astype(np.int32)), topk_ids, ops.constant(0, ov.Type.i64)).output(0)
    results = []
    for port, name in ((topk_ids, "draft_topk_ids"), (topk.output(0), "draft_topk_logits"), (logits, "draft_logits")):
        r = ops.result(port)
        r.output(0).get_tensor().set_names({name})
        results.append(r)
    draft.add_results(results)
    draft.validate_nodes_and_infer_types()
    return sliced is not None


class DraftModel:
    """A compiled DFlash-family draft (backbone + head IRs); engine/drafting/ runs it.

    Normally the draft's KV cache is moved out of the graph into host arrays (`kv` lists the cached
    tensors; engine/models/draft_kv.py says why) and engine/drafting/host_kv_batch.py runs it. A
    draft IR that does not have the usual stateful pattern keeps its KV state (`kv` is None) and
    engine/drafting/draft_batch.py runs its stateful `request`, one batch row per request."""

    KV_ON_HOST = True  # False keeps every draft stateful (tests of the stateful path)

    def __init__(self, info: DraftInfo, target: TargetFolder | Path, core: ov.Core, device: str,
                 properties: dict[str, str]) -> None:
        self.info = info
        self._target, self._core, self._device = as_target_folder(target, core), core, device
        self._props = props = draft_compile_properties(info, device, properties)
        self.kv: list[KVInput] | None = None
        # The exported masks measure a sliding window in slots, which host-side padding would stretch.
        self._compile(self.KV_ON_HOST and info.sliding_window is None)
        self.scorer = (core.compile_model(info.folder / SCORER_FILE, device, props).create_infer_request()
                       if info.has_head else None)
        self.dense_head = (core.compile_model(info.folder / DENSE_HEAD_FILE, device, props).create_infer_request()
                           if info.has_head and (info.folder / DENSE_HEAD_FILE).is_file() else None)
        self.scorer_inputs = BoundInputs(self.scorer) if self.scorer is not None else None
        self.dense_inputs = BoundInputs(self.dense_head) if self.dense_head is not None else None

    def _compile(self, kv_on_host: bool) -> None:
        draft = (self.info.model.clone() if self.info.model is not None
                 else self._core.read_model(self.info.folder / "openvino_model.xml"))
        target = self._target.fresh_model()
        self.kv = externalize_kv(draft) if kv_on_host else None
        self.split_attentions = split_past_attention(draft, self.kv) if self.kv else 0
        vocab_size = self._target.vocab_size
        wanted = read_draft_vocabulary(self.info.folder, vocab_size)  # draft_vocabulary.json, if the folder has one
        self.vocab_size = vocab_size
        self.vocabulary = wanted if graft_target_head(draft, target, self.info, wanted) else None
        self.compiled = self._core.compile_model(draft, self._device, self._props)
        self.request = self.compiled.create_infer_request()

    def use_state(self) -> None:
        """Recompile with the KV cache as the IR's own state (a draft whose masks the host path cannot trust)."""
        if self.kv is not None:
            self._compile(False)


def draft_compile_properties(info: DraftInfo, device: str, properties: dict[str, str]) -> dict[str, str]:
    """The draft's compile properties: DFlash v2 on GPU needs at least its ACTIVATIONS_SCALE_FACTOR."""
    props = dict(properties)
    if device.upper().startswith("GPU") and info.activations_scale_factor:
        current = float(props.get("ACTIVATIONS_SCALE_FACTOR", 0) or 0)
        props["ACTIVATIONS_SCALE_FACTOR"] = str(max(current, info.activations_scale_factor))
    return props
