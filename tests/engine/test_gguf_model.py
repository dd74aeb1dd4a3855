"""engine/gguf_model.py, the one GGUF reader (prepare and train-draft): a tiny model written as llama.cpp
writes a GGUF (its tensor names, the q/k row permutation of Llama models, the metadata keys) reads
back into the same transformers model, logits and all."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from engine.errors import ModelFolderError  # noqa: E402
from engine.gguf_model import float_model_from_gguf  # noqa: E402

_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
THETA = 50000.0  # not a default: a reader that ignored the RoPE base would give other logits


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permutation of Llama q/k rows (HF rotate-half -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny(arch: str, tied: bool):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    cfg = cls(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=THETA,
              bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=tied, initializer_range=0.3)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.uniform_(-0.5, 1.5)  # not the default zeros / ones: a misplaced tensor would not show
    return model


def _write_gguf(model, arch: str, path: Path) -> Path:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(THETA)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    for name, t in model.state_dict().items():
        a = t.numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        else:
            _, _, idx, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)
            out = f"blk.{idx}.{_LAYER[part]}.{kind}"
            if arch == "llama" and part == "self_attn.q_proj":
                a = _permute(a, cfg.num_attention_heads)
            elif arch == "llama" and part == "self_attn.k_proj":
                a = _permute(a, cfg.num_key_value_heads)
        w.add_tensor(out, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch,tied,cls", [("llama", True, "LlamaForCausalLM"), ("llama", False, "LlamaForCausalLM"),
                                           ("qwen2", False, "Qwen2ForCausalLM")])
def test_a_gguf_reads_back_into_the_model_it_was_written_from(tmp_path: Path, arch: str, tied: bool, cls: str) -> None:
    model = _tiny(arch, tied)
    path = _write_gguf(model, arch, tmp_path / f"{arch}.gguf")
    back = float_model_from_gguf(path, cls)
    assert type(back).__name__ == cls and back.config.architectures == [cls]
    assert back.config.rope_theta == pytest.approx(THETA) and back.config.tie_word_embeddings == tied
    ids = torch.tensor([[1, 5, 17, 42, 63, 8, 90]])
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), float((got - want).abs().max())


def test_a_gguf_of_another_architecture_than_asked_is_refused(tmp_path: Path) -> None:
    path = _write_gguf(_tiny("qwen2", False), "qwen2", tmp_path / "q.gguf")
    with pytest.raises(ModelFolderError, match="holds a qwen2 model.*not a LlamaForCausalLM"):
        float_model_from_gguf(path, "LlamaForCausalLM")
