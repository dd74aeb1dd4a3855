"""export --kind serving: the public checkpoint layouts, the README's launch command, and the round trip
back through `export --kind draft`, which must decode exactly as the draft it came from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli import main
from engine.config import GenerationConfig
from engine.errors import DraftMismatchError, ModelFolderError
from engine.export.serving import export_serving
from fixtures.tiny_drafts import TRAIN_PROMPTS


def _tensor_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as st:
        return set(st.keys())


def _decode_steps(target: Path, draft: Path, prompts) -> list[list[tuple]]:
    """Per prompt, per step: (drafted, accepted, tokens), greedy and f32."""
    from engine.pipeline import SpeculativePipeline

    pipe = SpeculativePipeline.load(target, draft, precision="f32")
    runs = []
    for p in prompts:
        steps: list[tuple] = []
        pipe.generate(p, GenerationConfig(max_new_tokens=24, draft_policy="always"), chat=False,  # full windows: step by step
                      on_event=lambda e: steps.append((tuple(e.drafted), e.accepted, tuple(e.tokens))))
        runs.append(steps)
    return runs


def _round_trip(tmp_path: Path, target_ov: Path, target_hf: Path, ckpt: Path, engine: str, prompts) -> Path:
    served = export_serving(target_hf, ckpt, engine, tmp_path / "serving")
    original, again = tmp_path / "original-ir", tmp_path / "again-ir"
    assert main(["export", "--kind", "draft", "--input", str(ckpt), "--output", str(original)]) == 0
    assert main(["export", "--kind", "draft", "--input", str(served), "--output", str(again)]) == 0
    first, second = _decode_steps(target_ov, original, prompts), _decode_steps(target_ov, again, prompts)
    assert first == second
    assert any(acc for run in first for _d, acc, _t in run), "the draft should be accepted somewhere"
    return served


def test_dflash_v1_layout_readme_and_round_trip(tmp_path, tiny_qwen3_hf, tiny_qwen3_target, tiny_qwen3_drafts):
    ckpt = tiny_qwen3_drafts["b8_trained"].with_name("b8_trained-ckpt")
    served = _round_trip(tmp_path, tiny_qwen3_target, tiny_qwen3_hf, ckpt, "vllm", TRAIN_PROMPTS[:2])
    cfg = json.loads((served / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 8
    assert set(cfg["dflash_config"]) >= {"mask_token_id", "target_layer_ids"}
    names = _tensor_names(served)
    assert "fc.weight" in names and not any(n.startswith(("embed_tokens", "lm_head", "model.")) for n in names)
    plan = json.loads((served / "serving.json").read_text())
    assert plan["method"] == "dflash" and plan["num_speculative_tokens"] == 7
    spec = json.loads(plan["command"].split("--speculative-config ")[1].strip("'"))
    assert spec == {"method": "dflash", "model": str(served.resolve()), "num_speculative_tokens": 7}
    readme = (served / "README.md").read_text()
    assert "vllm serve" in readme and str(tiny_qwen3_hf.resolve()) in readme and "z-lab/dflash" in readme


def test_sglang_readme_and_target_from_the_ir(tmp_path, tiny_qwen3_hf, tiny_qwen3_target, tiny_qwen3_drafts):
    ckpt = tiny_qwen3_drafts["b8_trained"].with_name("b8_trained-ckpt")
    served = export_serving(tiny_qwen3_target, ckpt, "sglang", tmp_path / "sg")  # the IR names its HF source
    plan = json.loads((served / "serving.json").read_text())
    assert plan["target"] == str(tiny_qwen3_hf.resolve())
    assert "--speculative-algorithm DFLASH" in plan["command"] and "--speculative-num-draft-tokens 8" in plan["command"]
    assert f"--speculative-draft-model-path {served.resolve()}" in plan["command"]


def test_refusals_say_what_to_pass(tmp_path, tiny_qwen3_hf, tiny_llama_hf, tiny_qwen3_drafts):
    ir = tiny_qwen3_drafts["b8_trained"]
    ckpt = ir.with_name("b8_trained-ckpt")
    with pytest.raises(ModelFolderError, match="OpenVINO draft IR"):
        export_serving(tiny_qwen3_hf, ir, "vllm", tmp_path / "x")
    bad = tmp_path / "bad-draft"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**json.loads((ckpt / "config.json").read_text()), "hidden_size": 7}))
    (bad / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    with pytest.raises(DraftMismatchError, match="hidden_size"):
        export_serving(tiny_qwen3_hf, bad, "vllm", tmp_path / "y")
    assert not (tmp_path / "y").exists()
    assert main(["export", "--kind", "serving", "--target", str(tiny_qwen3_hf), "--output", str(tmp_path / "z")]) == 2


@pytest.mark.smollm2
@pytest.mark.parametrize("name, arch", [("smollm2-dspark-b8", "Qwen3DSparkModel"),
                                        ("smollm2-dflash2-b8", "DFlash2DraftModel")])
def test_shipped_dspark_and_dflash2_round_trip(tmp_path, smollm2_home, name, arch):
    from engine.export.serving import RESOURCES_DRAFTS, resolve_target
    from engine.paths import default_target_dir

    target = default_target_dir()
    prompts = ["def fibonacci(n):\n    ", "The three primary colours are"]
    served = _round_trip(tmp_path, target, resolve_target(target), RESOURCES_DRAFTS / name, "vllm", prompts)
    cfg = json.loads((served / "config.json").read_text())
    assert cfg["architectures"] == [arch]
    names = _tensor_names(served)
    if arch == "Qwen3DSparkModel":  # DeepSpec keeps copies of the target's embedding and lm_head
        assert {"embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight"} <= names
        assert cfg["mask_token_id"] == 16 and cfg["block_size"] == 8
        assert json.loads((served / "serving.json").read_text())["num_speculative_tokens"] == 8
    else:
        assert cfg["dflash_config"]["block_size"] == 8 and "candidate_selector.successor_codebook" in names


def test_an_int8_checkpoint_serves_as_float(tmp_path, tiny_qwen3_hf, monkeypatch):
    """A draft saved as int8 rows (train-draft's ship_dtype int8) exports to the public layout in float:
    no int8 tensors, no scales, no weight_storage key, and the values the rows stood for."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from engine.drafts import checkpoint, load_draft, save_draft
    from engine.drafts.dspark import DSparkDraft, random_dspark_config

    monkeypatch.setattr(checkpoint, "INT8_MIN_COLUMNS", 16)  # the tiny draft's rows are narrow
    tcfg = AutoConfig.from_pretrained(tiny_qwen3_hf)
    cfg = random_dspark_config(tcfg, 1, 6, [1, 2], tcfg.vocab_size - 1, markov_rank=8)
    torch.manual_seed(0)
    save_draft(DSparkDraft(cfg), {**cfg, "weight_storage": "int8"}, tmp_path / "ckpt")
    stored = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert stored["fc.weight"].dtype == torch.int8 and "fc.weight_scale" in stored
    served = export_serving(tiny_qwen3_hf, tmp_path / "ckpt", "vllm", tmp_path / "serving")
    out = load_file(str(served / "model.safetensors"))
    assert all(v.is_floating_point() for v in out.values()) and not any(k.endswith("_scale") for k in out)
    assert "weight_storage" not in json.loads((served / "config.json").read_text())
    model, _, _ = load_draft(tmp_path / "ckpt")  # the dequantized values
    assert torch.allclose(out["fc.weight"].float(), model.state_dict()["fc.weight"], atol=1e-3)
