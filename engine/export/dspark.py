"""Torch reference of the DeepSpec DSpark draft (``Qwen3DSparkModel``, spec §3), written for this project,
and its export to the draft folder contract (docs/draft-contract.md).

DSpark is the DFlash backbone (engine/export/dflash_v1.py, same tensor names) in the "sample from
anchor" layout: the block ``[anchor, MASK x (N-1)]`` yields N candidate rows, row k predicting the
token k+1 places after the anchor (candidate_position_offset 0). On top of the backbone's unary
logits ``U_k = lm_head(h_k)`` a Markov head adds a bias that depends on the token drafted before:

    vanilla: B_k = W2 W1[x_{k-1}]
    gated:   B_k = W2 (W1[x_{k-1}] * sigmoid(G [h_k ; W1[x_{k-1}]] + b))

(x_{-1} = the anchor; W1 = markov_head.markov_w1 [V, r], W2 = markov_head.markov_w2 [V, r],
G = markov_head.gate_proj [r, H + r]). An optional confidence head predicts each position's
acceptance, from h_k alone or from [h_k ; W1[x_{k-1}]] (``confidence_head_with_markov``).

Config fields are top-level (mask_token_id, target_layer_ids, block_size, markov_rank,
markov_head_type, enable_confidence_head, confidence_head_with_markov); the checkpoint may also carry
embed_tokens / lm_head copies of the target's, which the engine does not need (it grafts the
target's) but which are kept for torch-side use.

This module also holds what the DSpark and DFlash v2 exports share: the backbone conversion with a
candidate offset, folder writing, and the greedy reference walks the engine's parity tests compare
against (`reference_walk`).
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import openvino as ov
import torch
from torch import nn

from engine.errors import ModelFolderError
from engine.export.dflash_v1 import (
    DFLASH_V1_ARCH,
    DFlashV1Config,
    DFlashV1Draft,
    KVCache,
    default_target_layer_ids,
    random_draft_config,
    read_config,
)
from engine.export.markov_head import (
    DENSE_XML,
    HEAD_GATED,
    HEAD_NONE,
    HEAD_VANILLA,
    SCORER_XML,
    HeadWeights,
    build_dense_ir,
    build_scorer_ir,
    save_head_ir,
)

DSPARK_ARCH = "Qwen3DSparkModel"
VARIANT_DSPARK = "dspark"
DSPARK_DEFAULT_TOP_K = 8  # the scorer's K when nothing says otherwise (docs/draft-contract.md)
DSPARK_ACTIVATIONS_SCALE_FACTOR = 8.0  # as optimum-intel writes for v1 drafts
OPTIONAL_COPIES = ("embed_tokens.weight", "lm_head.weight")
WALK_MODES = ("none", "topk", "dense")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
def backbone_config(cfg: Mapping[str, Any], mask_token_id: Any, target_layer_ids: Any, block_size: Any,
                    what: str) -> DFlashV1Config:
    """Parse the DFlash backbone fields of a variant's config with the v1 parser (one validation)."""
    n_layers = cfg.get("num_hidden_layers")
    if mask_token_id is None:
        raise ModelFolderError(f"{what} config.json lacks mask_token_id")
    if not target_layer_ids:
        if cfg.get("num_target_layers") is None or n_layers is None:
            raise ModelFolderError(f"{what} config.json has neither target_layer_ids nor num_target_layers")
        target_layer_ids = default_target_layer_ids(int(cfg["num_target_layers"]), int(n_layers))
    shim = dict(cfg)
    shim["architectures"] = [DFLASH_V1_ARCH]
    shim["dflash_config"] = {"mask_token_id": int(mask_token_id), "target_layer_ids": [int(i) for i in target_layer_ids]}
    if block_size is None:
        raise ModelFolderError(f"{what} config.json lacks block_size")
    shim["block_size"] = int(block_size)
    return DFlashV1Config.from_dict(shim)


@dataclass(frozen=True)
class DSparkConfig:
    backbone: DFlashV1Config
    vocab_size: int
    markov_rank: int
    markov_head_type: str  # none | vanilla | gated
    enable_confidence_head: bool
    confidence_head_with_markov: bool

    @staticmethod
    def from_dict(cfg: Mapping[str, Any]) -> "DSparkConfig":
        archs = cfg.get("architectures") or []
        if not archs or archs[0] != DSPARK_ARCH:
            raise ModelFolderError(f"not a DSpark draft config: architectures={archs!r} (expected ['{DSPARK_ARCH}'])")
        for key in ("vocab_size", "markov_rank"):
            if key not in cfg:
                raise ModelFolderError(f"DSpark config.json lacks '{key}'")
        backbone = backbone_config(cfg, cfg.get("mask_token_id"), cfg.get("target_layer_ids"), cfg.get("block_size"),
                                   "DSpark")
        rank = int(cfg["markov_rank"])
        if rank < 0:
            raise ModelFolderError(f"DSpark markov_rank must be >= 0, got {rank}")
        head = HEAD_NONE
        if rank > 0:
            head = str(cfg.get("markov_head_type") or "")
            if head == "rnn":
                raise ModelFolderError(
                    "DSpark drafts with an rnn Markov head are not supported: its recurrent state along the walked path "
                    "does not fit the Top-K scorer (docs/draft-contract.md); vanilla and gated heads are"
                )
            if head not in (HEAD_VANILLA, HEAD_GATED):
                raise ModelFolderError(f"DSpark markov_head_type must be vanilla or gated when markov_rank > 0, got {head!r}")
        conf = bool(cfg.get("enable_confidence_head", False))
        with_markov = conf and bool(cfg.get("confidence_head_with_markov", False))
        if with_markov and rank == 0:
            raise ModelFolderError("DSpark confidence_head_with_markov needs a Markov head (markov_rank > 0)")
        return DSparkConfig(backbone, int(cfg["vocab_size"]), rank, head, conf, with_markov)


def random_dspark_config(
    target_config: Mapping[str, Any] | Any,
    num_layers: int,
    block_size: int,
    target_layer_ids: Sequence[int],
    mask_token_id: int,
    markov_rank: int = 256,
    markov_head_type: str = HEAD_VANILLA,
    enable_confidence_head: bool = True,
    confidence_head_with_markov: bool = True,
    num_anchors: int = 512,
) -> dict[str, Any]:
    """A DeepSpec-style config.json for a fresh DSpark draft of `target_config`'s target.

    markov_rank 0 gives the headless kind (deepseek-ai/dflash_*_block7); block_size counts the block's
    rows incl. the anchor, which in this layout is also the number of candidates.
    """
    cfg = random_draft_config(target_config, num_layers, block_size, target_layer_ids, mask_token_id)
    dcfg = cfg.pop("dflash_config")
    cfg["architectures"] = [DSPARK_ARCH]
    cfg.pop("auto_map", None)
    cfg["mask_token_id"] = dcfg["mask_token_id"]
    cfg["target_layer_ids"] = dcfg["target_layer_ids"]
    cfg["num_anchors"] = int(num_anchors)
    cfg["markov_rank"] = int(markov_rank)
    if markov_rank > 0:
        cfg["markov_head_type"] = markov_head_type
    cfg["enable_confidence_head"] = bool(enable_confidence_head)
    cfg["confidence_head_with_markov"] = bool(enable_confidence_head and confidence_head_with_markov and markov_rank > 0)
    cfg["tie_word_embeddings"] = False
    DSparkConfig.from_dict(cfg)  # validate
    return cfg


# --------------------------------------------------------------------------------------------
# Modules (attribute names = DeepSpec safetensors names)
# --------------------------------------------------------------------------------------------
class MarkovHead(nn.Module):
    """DSpark's first-order head: a rank-r bias on the next token given the one before."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int, head_type: str) -> None:
        super().__init__()
        if head_type not in (HEAD_VANILLA, HEAD_GATED):
            raise ValueError(f"head_type must be vanilla or gated, got {head_type!r}")
        self.head_type = head_type
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        if head_type == HEAD_GATED:
            self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def prev_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(ids)

    def modulated(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """W1[ids] (vanilla) or W1[ids] * gate; `hidden` broadcasts against ids' shape + [H]."""
        e = self.markov_w1(ids)
        if self.head_type == HEAD_GATED:
            h = hidden.expand(*e.shape[:-1], hidden.shape[-1])
            e = e * torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1)))
        return e

    def dense_bias(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """prev [...] ids, hidden [..., H] -> [..., V]."""
        return self.markov_w2(self.modulated(prev, hidden))

    def edge_bias(self, pred: torch.Tensor, cand: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """pred, cand [R, K] ids, hidden [R, H] -> [R, K, K] (edge_bias[r, i, j] for pred i, cand j)."""
        a = self.modulated(pred, hidden[:, None, :])
        return torch.einsum("nik,njk->nij", a, self.markov_w2.weight[cand])


class ConfidenceHead(nn.Module):
    """DeepSpec's acceptance predictor: one linear unit over [h] or [h ; W1[prev]] (logit out)."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkDraft(DFlashV1Draft):
    """DSpark draft: DFlash backbone + optional Markov head + optional confidence head."""

    variant = VARIANT_DSPARK
    candidate_offset = 0

    def __init__(self, config: Mapping[str, Any] | DSparkConfig) -> None:
        dc = config if isinstance(config, DSparkConfig) else DSparkConfig.from_dict(config)
        super().__init__(dc.backbone)
        self.dspark = dc
        h = dc.backbone.hidden_size
        self.markov_head = MarkovHead(dc.vocab_size, h, dc.markov_rank, dc.markov_head_type) if dc.markov_rank else None
        self.confidence_head = None
        if dc.enable_confidence_head:
            self.confidence_head = ConfidenceHead(h + (dc.markov_rank if dc.confidence_head_with_markov else 0))
        # Copies of the target's embedding / lm_head when the checkpoint has them (not exported).
        self.embed_tokens_weight: torch.Tensor | None = None
        self.lm_head_weight: torch.Tensor | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        super().reset_parameters(std)
        for m in self.modules():
            if isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, std)
            elif isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.zero_()

    # ---- metadata ----------------------------------------------------------------------------
    @property
    def head_type(self) -> str:
        return self.dspark.markov_head_type

    @property
    def default_top_k(self) -> int:
        return DSPARK_DEFAULT_TOP_K if self.markov_head is not None else 0

    @property
    def backbone_has_confidence(self) -> bool:
        """The confidence is a backbone output only when it does not read the walked predecessor."""
        return self.confidence_head is not None and not self.dspark.confidence_head_with_markov

    # ---- heads -------------------------------------------------------------------------------
    def unary_logits(self, rows: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        return rows @ lm_head.T

    def backbone_confidence(self, rows: torch.Tensor) -> torch.Tensor:
        assert self.confidence_head is not None and not self.dspark.confidence_head_with_markov
        return torch.sigmoid(self.confidence_head(rows))

    def confidence(self, rows: torch.Tensor, prev_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """Per-row acceptance probability; `prev_ids` (the token before each row) when it reads W1."""
        if self.confidence_head is None:
            return None
        if self.dspark.confidence_head_with_markov:
            if prev_ids is None:
                raise ValueError("this confidence head reads the Markov embedding of the previous token: pass prev_ids")
            rows = torch.cat([rows, self.markov_head.prev_embeddings(prev_ids).to(rows.dtype)], dim=-1)
        return torch.sigmoid(self.confidence_head(rows))

    def edge_bias(self, pred: torch.Tensor, cand: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.markov_head.edge_bias(pred, cand, hidden)

    def dense_bias(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.markov_head.dense_bias(prev, hidden)

    def head_weights(self) -> HeadWeights | None:
        """The Markov head (and a Markov-reading confidence head) as numpy weights for the head IRs."""
        if self.markov_head is None:
            return None
        mh = self.markov_head
        t = lambda p: p.detach().float().cpu().numpy()  # noqa: E731
        w = HeadWeights(
            head_type=mh.head_type,
            predecessor=t(mh.markov_w1.weight),
            successor=t(mh.markov_w2.weight),
            hidden_size=self.cfg.hidden_size,
            gate_weight=t(mh.gate_proj.weight) if mh.head_type == HEAD_GATED else None,
            gate_bias=t(mh.gate_proj.bias) if mh.head_type == HEAD_GATED else None,
        )
        if self.confidence_head is not None and self.dspark.confidence_head_with_markov:
            w.confidence_weight = t(self.confidence_head.proj.weight)[0]
            w.confidence_bias = float(self.confidence_head.proj.bias.detach()[0])
            w.__post_init__()
        return w


# --------------------------------------------------------------------------------------------
# Checkpoint folders
# --------------------------------------------------------------------------------------------
def read_state(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) safetensors checkpoint, 'model.' prefixes stripped."""
    from safetensors.torch import load_file

    files = sorted(Path(ckpt_dir).glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{ckpt_dir} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            state[k.removeprefix("model.")] = v
    return state


def load_state_into(model: nn.Module, state: Mapping[str, torch.Tensor], ckpt_dir: Path, what: str,
                    dtype: torch.dtype, optional: Sequence[str] = OPTIONAL_COPIES) -> None:
    """Strict load with errors that name the missing / unexpected / misshapen tensors."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelFolderError(f"{ckpt_dir}: weights missing from the checkpoint: {', '.join(missing[:8])}")
    extra = sorted(k for k in set(state) - set(expected) if k not in optional)
    if extra:
        raise ModelFolderError(f"{ckpt_dir}: unexpected weights (not a {what} draft of this config?): {', '.join(extra[:8])}")
    bad = [f"{k} {tuple(state[k].shape)} (config says {tuple(v.shape)})" for k, v in expected.items()
           if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise ModelFolderError(f"{ckpt_dir}: weights of the wrong shape: {', '.join(bad[:4])}")
    model.load_state_dict({k: state[k].to(dtype) for k in expected})


def load_variant_checkpoint(cls: type, what: str, ckpt_dir: Path, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    """Build `cls` from a checkpoint folder's config, load its weights (the optional embed_tokens /
    lm_head copies kept for torch use), cast to `dtype`."""
    ckpt_dir = Path(ckpt_dir)
    cfg = read_config(ckpt_dir)
    model = cls(cfg)
    state = read_state(ckpt_dir)
    load_state_into(model, state, ckpt_dir, what, dtype)
    if "embed_tokens.weight" in state:
        model.embed_tokens_weight = state["embed_tokens.weight"].to(dtype)
    if "lm_head.weight" in state:
        model.lm_head_weight = state["lm_head.weight"].to(dtype)
    return model.to(dtype).eval(), cfg


def load_dspark_checkpoint(ckpt_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[DSparkDraft, dict[str, Any]]:
    """Load a DeepSpec DSpark folder (config.json + *.safetensors) as float32 by default."""
    return load_variant_checkpoint(DSparkDraft, "DSpark", ckpt_dir, dtype)


def save_state(model: nn.Module, config: Mapping[str, Any], ckpt_dir: Path,
               extra: Mapping[str, torch.Tensor | None] | None = None) -> Path:
    from safetensors.torch import save_file

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(dict(config))
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    for k, v in (extra or {}).items():
        if v is not None:
            state[k] = v.detach().to("cpu").contiguous()
    cfg["torch_dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    save_file(state, str(ckpt_dir / "model.safetensors"), metadata={"format": "pt"})
    (ckpt_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return ckpt_dir


def save_dspark_checkpoint(model: DSparkDraft, config: Mapping[str, Any], ckpt_dir: Path) -> Path:
    """Write config.json + model.safetensors with DeepSpec's names (embed/lm_head copies when present)."""
    return save_state(model, config, ckpt_dir,
                      {"embed_tokens.weight": model.embed_tokens_weight, "lm_head.weight": model.lm_head_weight})


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
    from engine.export.draft import make_stateful, present_output_name, trace_inputs

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
    from engine.export.draft import _replace_dir, save_ir

    input_dir, output_dir = Path(input_dir), Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    tmp.chmod(0o755)
    try:
        save_ir(backbone, tmp, weight_format)
        for name, head in heads.items():
            save_head_ir(head, tmp / name, weight_format)
        (tmp / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n", encoding="utf-8")
        gen_cfg = input_dir / "generation_config.json"
        if gen_cfg.is_file():
            shutil.copy2(gen_cfg, tmp / gen_cfg.name)
        _replace_dir(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output_dir


def check_weight_format(weight_format: str) -> None:
    from engine.export.draft import WEIGHT_FORMATS

    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")


# --------------------------------------------------------------------------------------------
# DSpark export
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# Reference walks (greedy), for the engine's parity tests
# --------------------------------------------------------------------------------------------
@dataclass
class WalkResult:
    tokens: np.ndarray  # [N] int64: the drafted candidates
    rows: torch.Tensor  # [N, H]: the backbone's candidate rows (what the head IRs read)
    unary: torch.Tensor  # [N, V]: U per row (v2: scaled and soft-capped)
    confidence: np.ndarray | None  # [N] (DSpark with a confidence head), given the walked predecessors
    past_key_values: KVCache  # context K/V after this call (feed to the next call)


def as_tensor(x: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return x.detach().to(dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x), dtype=dtype)


def lattice_walk(
    unary: torch.Tensor,
    anchor: int,
    mode: str,
    top_k: int,
    edge_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None,
    dense_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    rows: torch.Tensor,
) -> list[int]:
    """The contract's greedy walks over unary logits U [N, V] (docs/draft-contract.md, engine/drafting)."""
    n = unary.shape[0]
    if mode == "none" or (edge_fn is None and dense_fn is None):
        return [int(t) for t in unary.argmax(-1)]
    if mode == "topk":
        if top_k < 1:
            raise ValueError("mode 'topk' needs top_k >= 1")
        vals, cand = torch.topk(unary, top_k, dim=-1)  # [N, K], best first
        pred = torch.empty_like(cand)
        pred[0] = anchor
        pred[1:] = cand[:-1]
        energy = vals[:, None, :] + edge_fn(pred, cand, rows)  # [N, K, K]
        out, prev = [], 0  # row 0: every predecessor is the anchor
        for p in range(n):
            j = int(energy[p, prev].argmax())
            out.append(int(cand[p, j]))
            prev = j
        return out
    if mode == "dense":
        if dense_fn is None:
            raise ValueError("this draft has no dense Markov walk (DFlash v2 refuses markov_head_top_k=0)")
        out, prev = [], anchor
        for p in range(n):
            logits = unary[p] + dense_fn(torch.tensor([prev]), rows[p: p + 1])[0]
            prev = int(logits.argmax())
            out.append(prev)
        return out
    raise ValueError(f"mode must be one of {', '.join(WALK_MODES)}, got {mode!r}")


def run_backbone(draft: DFlashV1Draft, embeds: torch.Tensor, context: Any, past_key_values: KVCache | None,
                 start_position: int | None) -> tuple[torch.Tensor, KVCache]:
    """One draft call for one sequence: embeds [L, H], context rows [T, n*H] -> (h [L, H], K/V)."""
    ctx = as_tensor(context).reshape(-1, len(draft.cfg.target_layer_ids) * draft.cfg.hidden_size)
    past_len = past_key_values[0][0].shape[2] if past_key_values else 0
    start = past_len if start_position is None else int(start_position)
    pos = torch.arange(start, start + ctx.shape[0] + embeds.shape[0])[None]
    h, kv = draft(embeds[None], ctx[None], pos, past_key_values)
    return h[0], kv


@torch.no_grad()
def reference_step(
    draft: DSparkDraft,
    embed: Any,
    lm_head: Any,
    anchor: int,
    context: Any,
    num_candidates: int,
    mode: str = "none",
    top_k: int | None = None,
    past_key_values: KVCache | None = None,
    start_position: int | None = None,
) -> WalkResult:
    """One DSpark draft step in torch: block [anchor, MASK x (N-1)] -> N greedy candidates.

    embed / lm_head: the target's [V, H] tables (numpy or torch; None = the checkpoint's copies).
    context: the NEW target context rows [T, n*H]; past_key_values from the previous step (None =
    fresh state); positions run on from the state's length unless start_position says otherwise.
    mode: "none" (argmax per row), "topk" (the Top-K scorer walk, K = top_k or the draft's default),
    "dense" (the dense Markov walk). A draft without a Markov head ignores the mode (argmax).
    """
    draft.eval()
    e = as_tensor(embed if embed is not None else draft.embed_tokens_weight)
    w = as_tensor(lm_head if lm_head is not None else draft.lm_head_weight)
    n = int(num_candidates)
    if n < 1:
        raise ValueError("num_candidates must be >= 1")
    ids = torch.tensor([int(anchor)] + [draft.cfg.mask_token_id] * (n - 1))
    h, kv = run_backbone(draft, e[ids], context, past_key_values, start_position)
    rows = h  # offset 0: every block row is a candidate row
    unary = draft.unary_logits(rows, w)
    has_head = draft.markov_head is not None
    tokens = lattice_walk(
        unary, int(anchor), mode, int(top_k or draft.default_top_k),
        draft.edge_bias if has_head else None, draft.dense_bias if has_head else None, rows,
    )
    conf = None
    if draft.confidence_head is not None:
        prev = torch.tensor([int(anchor)] + tokens[:-1])
        conf = draft.confidence(rows, prev if draft.dspark.confidence_head_with_markov else None).numpy()
    return WalkResult(np.array(tokens, np.int64), rows, unary, conf, kv)


def reference_walk(
    draft: DSparkDraft,
    embed: Any,
    lm_head: Any,
    anchor: int,
    context: Any,
    num_candidates: int,
    mode: str = "none",
    top_k: int | None = None,
) -> np.ndarray:
    """The N greedy candidates a DSpark draft proposes after `anchor` for fresh context rows [T, n*H]."""
    return reference_step(draft, embed, lm_head, anchor, context, num_candidates, mode, top_k).tokens
