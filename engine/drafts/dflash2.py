"""Torch reference of the z-lab DFlash v2 draft (``DFlash2DraftModel``, spec §4), written for this project:
config, modules, checkpoint folders and the greedy reference walk. Its export to the draft folder
contract (docs/draft-contract.md) is engine/export/dflash2.py.

DFlash v2 keeps the DFlash backbone (engine/drafts/dflash_v1.py, same tensor names) and adds:

- a grouped dynamic two-tap convolution around each sublayer. With u the normed sublayer input,
  one projection of u gives per-row kernel deltas for both sides, ``dyn = kernel_projection(u)``
  viewed as [.., 2, K, G] (G = H / conv_group_size groups of consecutive channels), and

      prepare(u)_t[c] = sum_{tap < K, tap <= t} (base_kernel[0, tap, c] + dyn_t[0, tap, g(c)]) u_{t-tap}[c]
      finish(o)_t[c]  = sum_{tap < K, tap <= t} (base_kernel[1, tap, c] + dyn_t[1, tap, g(c)]) o_{t-tap}[c]
      x <- x + finish(Attn(prepare(RMSNorm_in(x))));  x <- x + finish(MLP(prepare(RMSNorm_post(x))))

  t is the row's index inside its block: taps never cross a block boundary and the anchor row reads
  zero padding. Context rows only feed K/V, as in DFlash.
- the candidate selector over the top-K unary candidates ("gated Markov head of DFlash v2"):
  ``E[p, i, j] = u_p[j] + <A[pred_i] * (W_h h_p), B[cand_j]>`` with
  candidate_selector.{predecessor_codebook A, successor_codebook B, hidden_projection W_h}.
- scales the engine applies around the grafted target embedding / lm_head:
  ``inputs_embeds = input_embedding_scale * E[ids]`` and
  ``U = softcap(output_multiplier * lm_head(h))``, softcap(x) = c * tanh(x / c) when
  final_logit_softcapping = c is set. The backbone IR holds neither.

Layout: offset 1 (z-lab): the block [anchor, MASK x N] yields candidates from rows 1..N, the
anchor row is dropped by the export. Verified against the public trainers, not only assumed:
SpecForge's DFlash2DraftModel samples from ``draft_hidden[:, -block_size + 1:]`` (rows after the
anchor) and NeMo/ModelOpt label block row k with token anchor+k; llama.cpp's
``sample_from_anchor=true`` log line for the GGUF conversion is the only dissenting source (spec §4).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.drafts.checkpoint import load_variant_checkpoint, save_variant_checkpoint
from engine.drafts.dflash_v1 import FULL_ATTENTION, SLIDING_ATTENTION, DFlashV1Config, DFlashV1Draft, KVCache
from engine.drafts.dspark import backbone_config
from engine.drafts.heads import HEAD_SELECTOR, HeadWeights
from engine.drafts.walks import WalkResult, lattice_walk, reference_rows
from engine.errors import ModelFolderError

DFLASH2_ARCH = "DFlash2DraftModel"
VARIANT_DFLASH_V2 = "dflash_v2"
DFLASH2_ACTIVATIONS_SCALE_FACTOR = 32.0  # GPU fp16 headroom; a config may say otherwise


def _field(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """dflash_config first (where SpecForge/z-lab keep the v2 switches), then the top level."""
    dcfg = cfg.get("dflash_config") or {}
    if dcfg.get(key) is not None:
        return dcfg[key]
    return cfg.get(key, default) if cfg.get(key) is not None else default


@dataclass(frozen=True)
class DFlash2Config:
    backbone: DFlashV1Config
    vocab_size: int
    conv_group_size: int
    conv_kernel_size: int
    selector_rank: int
    selector_top_k: int
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float | None
    activations_scale_factor: float

    @staticmethod
    def from_dict(cfg: Mapping[str, Any]) -> "DFlash2Config":
        archs = cfg.get("architectures") or []
        if not archs or archs[0] != DFLASH2_ARCH:
            raise ModelFolderError(f"not a DFlash v2 draft config: architectures={archs!r} (expected ['{DFLASH2_ARCH}'])")
        if "vocab_size" not in cfg:
            raise ModelFolderError("DFlash v2 config.json lacks 'vocab_size'")
        backbone = backbone_config(cfg, _field(cfg, "mask_token_id"), _field(cfg, "target_layer_ids"),
                                   _field(cfg, "block_size"), "DFlash v2")
        vals: dict[str, int] = {}
        for key in ("conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k"):
            v = _field(cfg, key)
            if v is None:
                raise ModelFolderError(f"DFlash v2 config.json lacks dflash_config.{key}")
            vals[key] = int(v)
            if vals[key] < 1:
                raise ModelFolderError(f"DFlash v2 dflash_config.{key} must be >= 1, got {v}")
        h = backbone.hidden_size
        if h % vals["conv_group_size"]:
            raise ModelFolderError(f"DFlash v2 conv_group_size {vals['conv_group_size']} does not divide hidden_size {h}")
        if vals["conv_kernel_size"] > backbone.block_size:
            raise ModelFolderError(f"DFlash v2 conv_kernel_size {vals['conv_kernel_size']} exceeds block_size "
                                   f"{backbone.block_size}")
        if vals["selector_top_k"] > int(cfg["vocab_size"]):
            raise ModelFolderError(f"DFlash v2 selector_top_k {vals['selector_top_k']} exceeds the vocabulary")
        cap = _field(cfg, "final_logit_softcapping")
        if cap is not None and float(cap) <= 0:
            raise ModelFolderError(f"DFlash v2 final_logit_softcapping must be > 0 when set, got {cap}")
        asf = _field(cfg, "activations_scale_factor")
        if asf is None:
            asf = ((cfg.get("runtime_options") or {}).get("ACTIVATIONS_SCALE_FACTOR"))
        return DFlash2Config(
            backbone=backbone,
            vocab_size=int(cfg["vocab_size"]),
            input_embedding_scale=float(_field(cfg, "input_embedding_scale", 1.0)),
            output_multiplier=float(_field(cfg, "output_multiplier", 1.0)),
            final_logit_softcapping=float(cap) if cap is not None else None,
            activations_scale_factor=float(asf) if asf is not None else DFLASH2_ACTIVATIONS_SCALE_FACTOR,
            **vals,
        )


def random_dflash2_config(
    target_config: Mapping[str, Any] | Any,
    num_layers: int,
    block_size: int,
    target_layer_ids: Sequence[int],
    mask_token_id: int,
    conv_group_size: int = 16,
    conv_kernel_size: int = 2,
    selector_rank: int = 256,
    selector_top_k: int = 16,
    input_embedding_scale: float | None = None,
    output_multiplier: float | None = None,
    final_logit_softcapping: float | None = None,
    sliding_window: int | None = None,
    layer_types: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A z-lab style config.json for a fresh DFlash v2 draft of `target_config`'s target.

    block_size counts the block's rows incl. the anchor (block_size - 1 candidates). With a
    sliding_window and no layer_types, all layers but the last slide (as the public drafts do).
    """
    from engine.drafts.dflash_v1 import random_draft_config

    cfg = random_draft_config(target_config, num_layers, block_size, target_layer_ids, mask_token_id)
    cfg["architectures"] = [DFLASH2_ARCH]
    cfg.pop("block_size")
    dcfg = cfg["dflash_config"]
    dcfg.update(block_size=int(block_size), conv_group_size=int(conv_group_size),
                conv_kernel_size=int(conv_kernel_size), selector_rank=int(selector_rank),
                selector_top_k=int(selector_top_k))
    for key, value in (("input_embedding_scale", input_embedding_scale), ("output_multiplier", output_multiplier),
                       ("final_logit_softcapping", final_logit_softcapping)):
        if value is not None:
            dcfg[key] = float(value)
    if layer_types is None and sliding_window:
        layer_types = [SLIDING_ATTENTION] * (num_layers - 1) + [FULL_ATTENTION]
    if layer_types is not None:
        cfg["layer_types"] = list(layer_types)
    if sliding_window:
        cfg["sliding_window"] = int(sliding_window)
        cfg["use_sliding_window"] = True
    DFlash2Config.from_dict(cfg)  # validate
    return cfg


# --------------------------------------------------------------------------------------------
# Modules (attribute names = z-lab / SpecForge safetensors names)
# --------------------------------------------------------------------------------------------
class GroupedDynamicConv(nn.Module):
    """Depthwise causal convolution inside each block whose per-row kernels come from the row itself."""

    def __init__(self, hidden_size: int, taps: int, group_size: int) -> None:
        super().__init__()
        self.taps, self.group_size, self.num_groups = int(taps), int(group_size), hidden_size // group_size
        base = torch.zeros(2, self.taps, hidden_size)
        base[:, 0] = 1.0  # identity: a fresh conv leaves the DFlash backbone unchanged
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * self.taps * self.num_groups, bias=False)

    def kernels(self, u: torch.Tensor) -> torch.Tensor:
        """Per-row kernel deltas of both sides: [B, S, 2, taps, G]."""
        return self.kernel_projection(u).unflatten(-1, (2, self.taps, self.num_groups))

    def apply(self, x: torch.Tensor, side: int, dyn: torch.Tensor, block_len: int | None) -> torch.Tensor:
        """Side 0 = prepare, 1 = finish. block_len None: x is one block; else blocks of block_len rows."""
        # [B, S, taps, G] -> [B, S, taps, H]: group g covers channels g*gs .. g*gs+gs-1.
        coef = self.base_kernel[side] + (dyn[:, :, side, :, :, None] * x.new_ones(self.group_size)).flatten(-2)
        out = coef[:, :, 0] * x
        for tap in range(1, self.taps):
            shifted = F.pad(x, (0, 0, tap, 0))[:, : x.shape[1]]  # row t reads row t - tap
            if block_len is not None:
                in_block = (torch.arange(x.shape[1], device=x.device) % block_len) >= tap
                shifted = shifted * in_block[None, :, None].to(x.dtype)
            out = out + coef[:, :, tap] * shifted
        return out


class CandidateSelector(nn.Module):
    """DFlash v2's low-rank transition scorer over the top-K candidates of neighbouring rows."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def edge_bias(self, pred: torch.Tensor, cand: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """pred, cand [R, K] ids, hidden [R, H] -> [R, K, K]."""
        a = self.predecessor_codebook[pred] * self.hidden_projection(hidden)[:, None, :]
        return torch.einsum("nik,njk->nij", a, self.successor_codebook[cand])

    def transition(self, pred: torch.Tensor, cand: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """One predecessor per row: pred [...], cand [..., K], hidden [..., H] -> [..., K] (training)."""
        a = self.predecessor_codebook[pred] * self.hidden_projection(hidden)
        return torch.einsum("...k,...jk->...j", a, self.successor_codebook[cand])


class DFlash2Draft(DFlashV1Draft):
    """z-lab DFlash v2 draft: DFlash backbone with grouped dynamic convs + the candidate selector."""

    variant = VARIANT_DFLASH_V2
    candidate_offset = 1
    head_type = HEAD_SELECTOR

    def __init__(self, config: Mapping[str, Any] | DFlash2Config) -> None:
        vc = config if isinstance(config, DFlash2Config) else DFlash2Config.from_dict(config)
        super().__init__(vc.backbone)
        self.v2 = vc
        h = vc.backbone.hidden_size
        for layer in self.layers:
            layer.attention_conv = GroupedDynamicConv(h, vc.conv_kernel_size, vc.conv_group_size)
            layer.mlp_conv = GroupedDynamicConv(h, vc.conv_kernel_size, vc.conv_group_size)
        self.candidate_selector = CandidateSelector(h, vc.vocab_size, vc.selector_rank)
        self.embed_tokens_weight: torch.Tensor | None = None
        self.lm_head_weight: torch.Tensor | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """DFlash init + identity convs with zero dynamic part + a selector that starts as a no-op
        (zero successor codebook), so a fresh v2 draft equals a DFlash draft at step 0."""
        super().reset_parameters(std)
        for m in self.modules():
            if isinstance(m, GroupedDynamicConv):
                m.base_kernel.zero_()
                m.base_kernel[:, 0] = 1.0
                m.kernel_projection.weight.zero_()
            elif isinstance(m, CandidateSelector):
                m.predecessor_codebook.normal_(0.0, std)
                m.successor_codebook.zero_()

    @property
    def default_top_k(self) -> int:
        return self.v2.selector_top_k

    # ---- backbone ----------------------------------------------------------------------------
    def forward_packed(self, noise_embedding, target_hidden, block_position_ids, context_position_ids, allowed,
                       block_len: int | None = None):
        """Training: blocks of `block_len` rows (default: the trained block size) packed back to back."""
        dist = block_position_ids[:, None, :, None] - torch.cat([context_position_ids, block_position_ids], 1)[:, None, None, :]
        h, _ = self._run(noise_embedding, target_hidden, block_position_ids, context_position_ids, None,
                         self._biases(allowed, dist), block_len=block_len or self.cfg.block_size)
        return h

    def _run(self, x, target_hidden, pos_blk, pos_ctx, past, biases, block_len: int | None = None):
        ctx = self.hidden_norm(self.fc(target_hidden.to(x.dtype)))
        rope_blk = self._cos_sin(pos_blk, x.dtype)
        rope_ctx = self._cos_sin(pos_ctx, x.dtype)
        new_kv: KVCache = []
        for i, layer in enumerate(self.layers):
            u = layer.input_layernorm(x)
            dyn = layer.attention_conv.kernels(u)
            a, kv = layer.self_attn(
                layer.attention_conv.apply(u, 0, dyn, block_len), ctx, rope_blk, rope_ctx,
                past[i] if past else None, biases[self.cfg.layer_types[i]],
            )
            x = x + layer.attention_conv.apply(a, 1, dyn, block_len)
            u = layer.post_attention_layernorm(x)
            dyn = layer.mlp_conv.kernels(u)
            x = x + layer.mlp_conv.apply(layer.mlp(layer.mlp_conv.apply(u, 0, dyn, block_len)), 1, dyn, block_len)
            new_kv.append(kv)
        return self.norm(x), new_kv

    # ---- around the grafted embedding / lm_head ---------------------------------------------
    def scale_embeddings(self, e: torch.Tensor) -> torch.Tensor:
        s = self.v2.input_embedding_scale
        return e if s == 1.0 else e * s

    def unary_logits(self, rows: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """U = softcap(output_multiplier * lm_head(h))."""
        u = rows @ lm_head.T
        if self.v2.output_multiplier != 1.0:
            u = u * self.v2.output_multiplier
        cap = self.v2.final_logit_softcapping
        return torch.tanh(u / cap) * cap if cap else u

    def edge_bias(self, pred: torch.Tensor, cand: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.candidate_selector.edge_bias(pred, cand, hidden)

    def head_weights(self) -> HeadWeights:
        s = self.candidate_selector
        t = lambda p: p.detach().float().cpu().numpy()  # noqa: E731
        return HeadWeights(HEAD_SELECTOR, t(s.predecessor_codebook), t(s.successor_codebook), self.cfg.hidden_size,
                           hidden_projection=t(s.hidden_projection.weight))


# --------------------------------------------------------------------------------------------
# Checkpoint folders
# --------------------------------------------------------------------------------------------
def load_dflash2_checkpoint(ckpt_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[DFlash2Draft, dict[str, Any]]:
    """Load a z-lab DFlash v2 folder (config.json + *.safetensors) as float32 by default."""
    return load_variant_checkpoint(DFlash2Draft, "DFlash v2", ckpt_dir, dtype)


def save_dflash2_checkpoint(model: DFlash2Draft, config: Mapping[str, Any], ckpt_dir: Path) -> Path:
    return save_variant_checkpoint(model, config, ckpt_dir)


# --------------------------------------------------------------------------------------------
# Reference walk (greedy), for the engine's parity tests
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def reference_step(
    draft: DFlash2Draft,
    embed: Any,
    lm_head: Any,
    anchor: int,
    context: Any,
    num_candidates: int,
    mode: str = "topk",
    top_k: int | None = None,
    past_key_values: KVCache | None = None,
    start_position: int | None = None,
) -> WalkResult:
    """One DFlash v2 draft step in torch: block [anchor, MASK x N] -> N greedy candidates (rows 1..N).

    embed / lm_head: the target's [V, H] tables (numpy or torch; None = the checkpoint's copies).
    mode: "topk" (the selector walk, K = top_k or selector_top_k) or "none" (argmax of U per row);
    "dense" raises, as the engine refuses it for v2.
    """
    rows, unary, kv = reference_rows(draft, embed, lm_head, anchor, context, num_candidates, 1, past_key_values,
                                     start_position, draft.scale_embeddings)
    tokens = lattice_walk(unary, int(anchor), mode, int(top_k or draft.default_top_k), draft.edge_bias, None, rows)
    return WalkResult(np.array(tokens, np.int64), rows, unary, None, kv)


def reference_walk(
    draft: DFlash2Draft,
    embed: Any,
    lm_head: Any,
    anchor: int,
    context: Any,
    num_candidates: int,
    mode: str = "topk",
    top_k: int | None = None,
) -> np.ndarray:
    """The N greedy candidates a DFlash v2 draft proposes after `anchor` for fresh context rows [T, n*H]."""
    return reference_step(draft, embed, lm_head, anchor, context, num_candidates, mode, top_k).tokens
