"""A quantized GGUF as a float32 transformers model: the project's one GGUF reader.

Used by both `prepare` recipes (GGUF -> Hugging Face folder -> IR) and by `train-draft` (the target a
draft learns from). The weights are dequantized with the `gguf` package alone, not through
transformers' GGUF converter, which wants `accelerate`, refuses save_pretrained on what it loaded
and changes between versions; llama.cpp permutes the q/k rows of Llama models only, which is undone
here. The config comes from the GGUF's metadata (`gguf_config`), so what a recipe checks before any
weight is loaded is what the model is built from. torch, transformers and gguf are imported inside:
the runtime engine never needs them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelFolderError

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # Qwen2: q/k/v biases; Qwen3: q/k norms
_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}


def read_gguf(path: Path) -> Any:
    """The GGUF's reader (memory-mapped: metadata and tensors are read on demand)."""
    from gguf import GGUFReader

    return GGUFReader(str(path))


def gguf_field(r: Any, name: str, default: Any = None) -> Any:
    fld = r.fields.get(name)
    return fld.contents() if fld is not None else default


def required_field(r: Any, name: str, path: Path) -> Any:
    """A metadata field the caller cannot go on without: ModelFolderError naming it when absent."""
    fld = r.fields.get(name)
    if fld is None:
        raise ModelFolderError(f"{Path(path).name} has no {name} field.")
    return fld.contents()


def gguf_config(r: Any, path: Path) -> tuple[str, dict[str, Any], list[str], str | None]:
    """(architecture, HF config kwargs, vocabulary, chat template) of a GGUF's metadata."""
    arch = gguf_field(r, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFolderError(f"{path}: architecture {arch!r} is not supported "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    tokens = list(gguf_field(r, "tokenizer.ggml.tokens") or [])
    heads = int(gguf_field(r, f"{arch}.attention.head_count"))
    kv = int(gguf_field(r, f"{arch}.attention.head_count_kv", heads))
    hidden = int(gguf_field(r, f"{arch}.embedding_length"))
    names = {t.name for t in r.tensors}
    eos = int(gguf_field(r, "tokenizer.ggml.eos_token_id", 2))
    kw = dict(
        vocab_size=int(gguf_field(r, f"{arch}.vocab_size", len(tokens))), hidden_size=hidden,
        intermediate_size=int(gguf_field(r, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(gguf_field(r, f"{arch}.block_count")), num_attention_heads=heads,
        num_key_value_heads=kv, max_position_embeddings=int(gguf_field(r, f"{arch}.context_length", 4096)),
        # GGUF stores the epsilon as f32 (1e-5 reads back as 9.99999974e-06): the written value is meant
        rms_norm_eps=float(f"{float(gguf_field(r, f'{arch}.attention.layer_norm_rms_epsilon', 1e-6)):.6g}"),
        rope_theta=float(gguf_field(r, f"{arch}.rope.freq_base", 10000.0)),
        head_dim=int(gguf_field(r, f"{arch}.attention.key_length", hidden // heads)),
        bos_token_id=int(gguf_field(r, "tokenizer.ggml.bos_token_id", eos)), eos_token_id=eos,
        pad_token_id=int(gguf_field(r, "tokenizer.ggml.padding_token_id", eos)),
        tie_word_embeddings="output.weight" not in names,
    )
    return arch, kw, tokens, gguf_field(r, "tokenizer.chat_template")


def _reverse_permute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation of Llama models (HF rotate-half order <- GGML interleaved)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def gguf_state_dict(r: Any, arch: str, kw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The HF state dict (float32 torch tensors) of a GGUF's tensors."""
    import torch
    from gguf.quants import dequantize

    state: dict[str, torch.Tensor] = {}
    for t in r.tensors:
        shape = [int(s) for s in reversed(list(t.shape))]
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).to(torch.float32).reshape(shape)
        name, kind = t.name.rsplit(".", 1)
        if name == "token_embd":
            key = "model.embed_tokens.weight"
        elif name == "output_norm":
            key = "model.norm.weight"
        elif name == "output":
            key = "lm_head.weight"
        elif name.startswith("blk."):
            _, idx, part = name.split(".", 2)
            if part not in _NAMES:
                raise ModelFolderError(f"{path}: unexpected tensor {t.name}")
            key = f"model.layers.{idx}.{_NAMES[part]}.{kind}"
            if arch == "llama" and part == "attn_q":
                w = _reverse_permute(w, kw["num_attention_heads"])
            elif arch == "llama" and part == "attn_k":
                w = _reverse_permute(w, kw["num_key_value_heads"])
        elif name == "rope_freqs":
            continue  # llama3 RoPE scaling factors: recomputed by transformers from the config
        else:
            raise ModelFolderError(f"{path}: unexpected tensor {t.name}")
        state[key] = w
    return state


def hf_config(arch: str, kw: dict[str, Any]) -> Any:
    """A transformers config of `arch` from GGUF kwargs (RoPE base set in both spellings)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    kw = dict(kw)
    theta = float(kw.pop("rope_theta"))
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    cfg = cls(rope_theta=theta, **kw)
    if isinstance(getattr(cfg, "rope_parameters", None), dict):
        cfg.rope_parameters["rope_theta"] = theta
    cfg.rope_theta = theta
    return cfg


def check_rope(model: Any, theta: float) -> None:
    """Fail loudly if this transformers version ignored the RoPE base (a silent acceptance killer)."""
    inv = getattr(model.model.rotary_emb, "inv_freq", None)
    if inv is not None:
        d = model.config.head_dim
        want = 1.0 / theta ** (2.0 / d)
        if abs(float(inv[1]) - want) > 1e-6 * max(1.0, want) + 1e-9:
            raise RuntimeError(f"RoPE base not applied: inv_freq[1]={float(inv[1])}, expected {want} (theta {theta})")


def float_model_from_gguf(gguf_path: Path, architecture: str | None = None) -> Any:
    """The GGUF's weights in a float32 transformers causal LM, in eval mode. `architecture` (e.g.
    LlamaForCausalLM), when given, must be what the GGUF holds; it is written as the config's
    `architectures`. Every weight must be filled (the lm_head may come from the tied embedding)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    r = read_gguf(gguf_path)
    arch, kw, _tokens, _template = gguf_config(r, gguf_path)
    config = hf_config(arch, kw)
    built = type(config).__name__.removesuffix("Config") + "ForCausalLM"
    if architecture is not None and architecture != built:
        raise ModelFolderError(f"{gguf_path} holds a {arch} model ({built}), not a {architecture}")
    config.architectures = [built]
    unk = gguf_field(r, "tokenizer.ggml.unknown_token_id")
    if unk is not None:
        config.unk_token_id = int(unk)
    state = gguf_state_dict(r, arch, kw, gguf_path)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    res = model.load_state_dict(state, strict=False)
    del state
    missing = set(res.missing_keys) - ({"lm_head.weight"} if kw["tie_word_embeddings"] else set())
    if missing or res.unexpected_keys:
        raise ModelFolderError(f"{gguf_path}: weights do not fit the {arch} architecture: missing "
                               f"{sorted(missing)[:4]}, unexpected {res.unexpected_keys[:4]}")
    model.tie_weights()
    check_rope(model, kw["rope_theta"])
    return model.eval()
