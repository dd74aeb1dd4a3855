"""Torch reference of the DeepSpec DSpark draft (``Qwen3DSparkModel``, spec §3), written for this project:
config, modules, checkpoint folders and the greedy reference walks. Its export to the draft folder
contract (docs/draft-contract.md) is engine/export/dspark.py; its training engine/training.

DSpark is the DFlash backbone (engine/drafts/dflash_v1.py, same tensor names) in the "sample from
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
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from engine.drafts.checkpoint import load_variant_checkpoint, save_variant_checkpoint
from engine.drafts.dflash_v1 import (
    DFLASH_V1_ARCH,
    DFlashV1Config,
    DFlashV1Draft,
    KVCache,
    default_target_layer_ids,
    random_draft_config,
)
from engine.drafts.heads import HEAD_GATED, HEAD_NONE, HEAD_VANILLA, HeadWeights
from engine.drafts.walks import WALK_MODES, WalkResult, lattice_walk, reference_rows  # noqa: F401
from engine.errors import ModelFolderError

DSPARK_ARCH = "Qwen3DSparkModel"
VARIANT_DSPARK = "dspark"
DSPARK_DEFAULT_TOP_K = 8  # the scorer's K when nothing says otherwise (docs/draft-contract.md)


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

    def dense_bias(self, prev: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """prev [...] ids, hidden [..., H] -> [..., V], or [..., S] over the sub-vocabulary `ids` [S]."""
        m = self.modulated(prev, hidden)
        return self.markov_w2(m) if ids is None else m @ self.markov_w2.weight[ids].T

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

    def dense_bias(self, prev: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.markov_head.dense_bias(prev, hidden, ids)

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
def load_dspark_checkpoint(ckpt_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[DSparkDraft, dict[str, Any]]:
    """Load a DeepSpec DSpark folder (config.json + *.safetensors) as float32 by default."""
    return load_variant_checkpoint(DSparkDraft, "DSpark", ckpt_dir, dtype)


def save_dspark_checkpoint(model: DSparkDraft, config: Mapping[str, Any], ckpt_dir: Path) -> Path:
    """Write config.json + model.safetensors with DeepSpec's names (embed/lm_head copies when present)."""
    return save_variant_checkpoint(model, config, ckpt_dir)


# --------------------------------------------------------------------------------------------
# Reference walks (greedy), for the engine's parity tests
# --------------------------------------------------------------------------------------------
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
    rows, unary, kv = reference_rows(draft, embed, lm_head, anchor, context, num_candidates, 0, past_key_values,
                                     start_position)  # offset 0: every block row is a candidate row
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
