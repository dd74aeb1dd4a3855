"""A float32 transformers model from a quantized GGUF (the first step of every `prepare` recipe).

transformers refuses save_pretrained on a GGUF-loaded model and from_pretrained(gguf_file=...)
wants `accelerate`; so the quantization marker is dropped, a meta-device shell gives the tensor
names, load_gguf_checkpoint dequantizes into it and the tensors go into a plain float model.
torch and transformers are imported inside: the runtime engine never needs them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelFolderError


def float_model_from_gguf(gguf_path: Path, architecture: str) -> Any:
    """The GGUF's weights in a float32 `architecture` (e.g. LlamaForCausalLM) model, in eval mode.

    Every weight must be filled (the lm_head may come from the tied embedding).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.rms_norm_eps = float(f"{config.rms_norm_eps:.6g}")  # GGUF stores e.g. 1e-5 as f32
    config.architectures = [architecture]
    for attr in ("_model_name_or_path", "_name_or_path"):
        if hasattr(config, attr):
            setattr(config, attr, "")
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(config)
    state = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=shell)["tensors"]
    del shell
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=False)
    del state
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise ModelFolderError(
            f"GGUF weights do not fit the model: missing {sorted(missing)[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    return model.eval()
