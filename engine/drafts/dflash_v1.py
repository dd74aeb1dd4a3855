"""Torch reference of the z-lab DFlash v1 draft (spec §1), written for this project.

The module is the single source of truth for the draft's math: the OpenVINO export
(engine/export/draft.py) traces it, and the trainer (engine/training/trainer.py)
optimises it. Parameter names equal the z-lab safetensors names, so a checkpoint folder
loads with a plain ``load_state_dict`` and saves back in the same form.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelFolderError

DFLASH_V1_ARCH = "DFlashDraftModel"
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

# Per layer: (key, value), each [B, Hkv, S_ctx, head_dim], post k_norm and RoPE.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DFlashV1Config:
    """The fields of a z-lab config.json the draft's math depends on (the dict is kept verbatim)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    layer_types: tuple[str, ...]
    sliding_window: int | None
    rope: dict[str, Any]

    @staticmethod
    def from_dict(cfg: Mapping[str, Any]) -> "DFlashV1Config":
        """Parse and validate; raises ModelFolderError naming the missing or bad field."""
        archs = cfg.get("architectures") or []
        if not archs or archs[0] != DFLASH_V1_ARCH:
            raise ModelFolderError(f"not a DFlash v1 draft config: architectures={archs!r} (expected ['{DFLASH_V1_ARCH}'])")
        dcfg = cfg.get("dflash_config") or {}
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in cfg:
                raise ModelFolderError(f"DFlash config.json lacks '{key}'")
        if "mask_token_id" not in dcfg:
            raise ModelFolderError("DFlash config.json lacks dflash_config.mask_token_id")
        n_layers = int(cfg["num_hidden_layers"])
        layer_ids = dcfg.get("target_layer_ids")
        if not layer_ids:
            n_target = cfg.get("num_target_layers")
            if n_target is None:
                raise ModelFolderError("DFlash config.json has neither dflash_config.target_layer_ids nor num_target_layers")
            layer_ids = default_target_layer_ids(int(n_target), n_layers)
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
        layer_types = cfg.get("layer_types") or [FULL_ATTENTION] * n_layers
        if len(layer_types) != n_layers:
            raise ModelFolderError(f"layer_types has {len(layer_types)} entries for {n_layers} layers")
        for t in layer_types:
            if t not in (FULL_ATTENTION, SLIDING_ATTENTION):
                raise ModelFolderError(f"unknown layer type {t!r} in layer_types")
        window = cfg.get("sliding_window")
        if SLIDING_ATTENTION in layer_types and not window:
            raise ModelFolderError("layer_types has sliding_attention layers but sliding_window is not set")
        return DFlashV1Config(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            block_size=int(cfg.get("block_size", 16)),
            mask_token_id=int(dcfg["mask_token_id"]),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            layer_types=tuple(layer_types),
            sliding_window=int(window) if window else None,
            rope=_rope_params(cfg),
        )


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps when a config names none: spread from layer 1 to L_t-3 (spec §1.1)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _rope_params(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Normalise transformers-4 (rope_theta + rope_scaling) and -5 (rope_parameters) spellings."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    for k, v in scaling.items():
        params.setdefault(k, v)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params.setdefault("rope_type", "default")
    if params["rope_type"] not in ("default", "linear", "llama3"):
        raise ModelFolderError(f"rope_type {params['rope_type']!r} is not supported by the DFlash v1 draft yet")
    return params


def random_draft_config(
    target_config: Mapping[str, Any] | Any,
    num_layers: int,
    block_size: int,
    target_layer_ids: Sequence[int],
    mask_token_id: int,
) -> dict[str, Any]:
    """A z-lab style config.json for a fresh draft of `target_config`'s target (fixtures, training init).

    The draft shares the target's embedding and lm_head, so hidden size, vocabulary and RoPE are the
    target's; heads, head_dim and MLP width follow the target too (Qwen3 drafts copy them).
    """
    t = target_config if isinstance(target_config, Mapping) else target_config.to_dict()
    n_target = int(t["num_hidden_layers"])
    ids = [int(i) for i in target_layer_ids]
    if not ids:
        raise ValueError("target_layer_ids must not be empty")
    if any(i < 0 or i >= n_target - 1 for i in ids):
        # The last layer's HF hidden state is the post-final-norm tensor (spec §1.2, §9.1).
        raise ValueError(f"target_layer_ids {ids} must lie in [0, {n_target - 2}] for a {n_target}-layer target")
    if block_size < 2:
        raise ValueError("block_size must be at least 2 (anchor + one mask)")
    hidden = int(t["hidden_size"])
    heads = int(t["num_attention_heads"])
    head_dim = int(t.get("head_dim") or hidden // heads)
    vocab = int(t["vocab_size"])
    if not 0 <= mask_token_id < vocab:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the target vocabulary (size {vocab})")
    cfg: dict[str, Any] = {
        "architectures": [DFLASH_V1_ARCH],
        "model_type": "qwen3",
        "block_size": int(block_size),
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": ids},
        "num_target_layers": n_target,
        "num_hidden_layers": int(num_layers),
        "hidden_size": hidden,
        "intermediate_size": int(t.get("intermediate_size") or 4 * hidden),
        "num_attention_heads": heads,
        "num_key_value_heads": int(t.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(t.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": int(t.get("max_position_embeddings", 4096)),
        "layer_types": [FULL_ATTENTION] * int(num_layers),
        "sliding_window": None,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "attention_bias": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    rope = _rope_params(t)
    cfg["rope_theta"] = float(rope["rope_theta"])
    if rope["rope_type"] != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return cfg


# --------------------------------------------------------------------------------------------
# Modules (attribute names = z-lab safetensors names)
# --------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in f32, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, c: DFlashV1Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = c.hidden_size
        self.q_proj = nn.Linear(h, self.n_heads * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.d, h, bias=False)
        self.q_norm = RMSNorm(self.d, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, c.rms_norm_eps)

    def _kv(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project rows to K (k_norm + RoPE) and V, heads first: [B, Hkv, S, d]."""
        b, s, _ = rows.shape
        k = self.k_norm(self.k_proj(rows).view(b, s, self.n_kv, self.d)).transpose(1, 2)
        v = self.v_proj(rows).view(b, s, self.n_kv, self.d).transpose(1, 2)
        return _rope(k, cos, sin), v

    def forward(
        self,
        u: torch.Tensor,
        ctx: torch.Tensor,
        rope_blk: tuple[torch.Tensor, torch.Tensor],
        rope_ctx: tuple[torch.Tensor, torch.Tensor],
        past: tuple[torch.Tensor, torch.Tensor] | None,
        bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Block queries attend to [past ctx ; new ctx ; block] keys; returns output and ctx K/V."""
        b, q_len, _ = u.shape
        q = self.q_norm(self.q_proj(u).view(b, q_len, self.n_heads, self.d)).transpose(1, 2)
        q = _rope(q, *rope_blk)
        k_ctx, v_ctx = self._kv(ctx, *rope_ctx)  # context rows: KV injection, never run through layers
        if past is not None:
            k_ctx = torch.cat([past[0], k_ctx], dim=2)
            v_ctx = torch.cat([past[1], v_ctx], dim=2)
        k_blk, v_blk = self._kv(u, *rope_blk)
        k = _repeat_kv(torch.cat([k_ctx, k_blk], dim=2), self.n_heads // self.n_kv)
        v = _repeat_kv(torch.cat([v_ctx, v_blk], dim=2), self.n_heads // self.n_kv)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.d**-0.5)
        a = a.transpose(1, 2).reshape(b, q_len, self.n_heads * self.d)
        return self.o_proj(a), (k_ctx, v_ctx)


class MLP(nn.Module):
    def __init__(self, c: DFlashV1Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: DFlashV1Config) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class DFlashV1Draft(nn.Module):
    """z-lab DFlash v1 draft backbone: fused target context in, post-norm block hidden out."""

    def __init__(self, config: Mapping[str, Any] | DFlashV1Config) -> None:
        super().__init__()
        c = config if isinstance(config, DFlashV1Config) else DFlashV1Config.from_dict(config)
        self.cfg = c
        h = c.hidden_size
        self.fc = nn.Linear(len(c.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, c.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(h, c.rms_norm_eps)
        # default/linear/llama3 RoPE only: none of them scales cos/sin (yarn would).
        self.register_buffer("inv_freq", _inv_freq(c.head_dim, c.rope), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """HF-style init: normal(0, std) linears, unit norms (what a fresh random draft looks like)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, std)
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)

    # ---- public forwards -------------------------------------------------------------------
    def forward(
        self,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """One draft call (spec §1.3).

        noise_embedding [B,Q,H] = E_target[anchor, MASK...]; target_hidden [B,T,n*H] = NEW context rows;
        position_ids [B,T+Q] contiguous from the cache length; past_key_values: per-layer context K/V;
        attention_mask [B, past+T+Q] (1 = attend) for padding only - there is no causal mask.
        Returns (post-norm block hidden [B,Q,H], context K/V per layer [B,Hkv,past+T,d]).
        """
        t_len, q_len = target_hidden.shape[1], noise_embedding.shape[1]
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        kv_len = past_len + t_len + q_len
        pos_ctx, pos_blk = position_ids[:, :t_len], position_ids[:, t_len:]
        # Key index j vs query index i in one contiguous frame; positions are contiguous by contract.
        q_idx = torch.arange(kv_len - q_len, kv_len, device=noise_embedding.device)
        k_idx = torch.arange(kv_len, device=noise_embedding.device)
        allowed = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=noise_embedding.device)
        if attention_mask is not None:
            allowed = allowed & (attention_mask[:, None, None, -kv_len:] > 0)
        biases = self._biases(allowed, q_idx[:, None] - k_idx[None, :])
        return self._run(noise_embedding, target_hidden, pos_blk, pos_ctx, past_key_values, biases)

    def forward_packed(
        self,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        block_position_ids: torch.Tensor,
        context_position_ids: torch.Tensor,
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        """Many blocks in one call (training, spec §1.6): `allowed` [B|1, 1, Qtot, T+Qtot] says which
        context/block keys each block query sees. Returns post-norm hidden [B, Qtot, H]."""
        dist = block_position_ids[:, None, :, None] - torch.cat([context_position_ids, block_position_ids], 1)[:, None, None, :]
        h, _ = self._run(
            noise_embedding, target_hidden, block_position_ids, context_position_ids, None, self._biases(allowed, dist)
        )
        return h

    # ---- internals -------------------------------------------------------------------------
    def _biases(self, allowed: torch.Tensor, dist: torch.Tensor) -> dict[str, torch.Tensor]:
        """Additive masks per layer type; sliding layers only see keys less than `window` back."""
        neg = torch.finfo(torch.float32).min
        zero = torch.zeros((), dtype=torch.float32, device=allowed.device)
        out = {FULL_ATTENTION: torch.where(allowed, zero, neg)}
        if SLIDING_ATTENTION in self.cfg.layer_types:
            out[SLIDING_ATTENTION] = torch.where(allowed & (dist < self.cfg.sliding_window), zero, neg)
        return out

    def _run(
        self,
        x: torch.Tensor,
        target_hidden: torch.Tensor,
        pos_blk: torch.Tensor,
        pos_ctx: torch.Tensor,
        past: KVCache | None,
        biases: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, KVCache]:
        ctx = self.hidden_norm(self.fc(target_hidden.to(x.dtype)))  # C = RMSNorm(fc(target_hidden))
        rope_blk = self._cos_sin(pos_blk, x.dtype)
        rope_ctx = self._cos_sin(pos_ctx, x.dtype)
        new_kv: KVCache = []
        for i, layer in enumerate(self.layers):
            a, kv = layer.self_attn(
                layer.input_layernorm(x), ctx, rope_blk, rope_ctx, past[i] if past else None,
                biases[self.cfg.layer_types[i]],
            )
            x = x + a
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            new_kv.append(kv)
        return self.norm(x), new_kv

    def _cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B,1,S,d] at absolute positions (head axis broadcast)."""
        freqs = pos.to(torch.float32)[..., None] * self.inv_freq  # [B,S,d/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """GQA: repeat each KV head n_rep times; reshape/expand keeps OpenVINO's SDPA GQA fusion happy."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x.reshape(b, h, 1, s, d).expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def _inv_freq(head_dim: int, rope: Mapping[str, Any]) -> torch.Tensor:
    base = float(rope["rope_theta"])
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(rope["factor"])
    elif kind == "llama3":
        factor = float(rope["factor"])
        low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old_ctx = float(rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_ctx / wavelen - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > old_ctx / low, inv / factor, torch.where(wavelen < old_ctx / high, inv, mid))
    return inv


# --------------------------------------------------------------------------------------------
# Checkpoint folders
# --------------------------------------------------------------------------------------------
def read_config(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise ModelFolderError(f"{ckpt_dir} has no config.json")
    return json.loads(path.read_text(encoding="utf-8"))


def load_checkpoint(ckpt_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[DFlashV1Draft, dict[str, Any]]:
    """Load a z-lab DFlash v1 folder (config.json + *.safetensors, possibly sharded) as float32 by default."""
    from safetensors.torch import load_file

    ckpt_dir = Path(ckpt_dir)
    cfg = read_config(ckpt_dir)
    model = DFlashV1Draft(cfg)
    files = sorted(ckpt_dir.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{ckpt_dir} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            state[k.removeprefix("model.")] = v
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise ModelFolderError(f"{ckpt_dir}: weights missing from the checkpoint: {', '.join(missing[:8])}")
    extra = sorted(k for k in set(state) - expected if not k.startswith(("embed_tokens.", "lm_head.")))
    if extra:
        raise ModelFolderError(f"{ckpt_dir}: unexpected weights (not a DFlash v1 draft?): {', '.join(extra[:8])}")
    model.load_state_dict({k: state[k].to(dtype) for k in expected})
    return model.to(dtype).eval(), cfg


def save_checkpoint(model: DFlashV1Draft, config: Mapping[str, Any], ckpt_dir: Path) -> Path:
    """Write config.json + model.safetensors in z-lab's layout (unprefixed names, no embed/lm_head)."""
    from safetensors.torch import save_file

    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(dict(config))
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    cfg["torch_dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    save_file(state, str(ckpt_dir / "model.safetensors"), metadata={"format": "pt"})
    (ckpt_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return ckpt_dir
