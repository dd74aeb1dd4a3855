"""engine.export.target and engine.models.hidden_taps on the tiny offline targets."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from engine.errors import ModelFolderError
from engine.export import target as target_mod
from engine.export.target import REQUIRED_FILES, check_target_folder, export_target
from engine.models import hidden_taps

F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


def _read(ir_dir: Path) -> ov.Model:
    return ov.Core().read_model(ir_dir / "openvino_model.xml")


def _ov_taps(ir_dir: Path, ids: np.ndarray, use_annotation: bool) -> dict[int, np.ndarray]:
    """Run the stateful IR once on `ids` with every located layer output added as a Result."""
    model = _read(ir_dir)
    taps = hidden_taps.find_decoder_layer_outputs(model, use_annotation=use_annotation)
    model.add_outputs([out for _, out in sorted(taps.items())])
    compiled = ov.Core().compile_model(model, "CPU", F32)
    n = ids.shape[1]
    req = compiled.create_infer_request()
    req.infer(
        {
            "input_ids": ids,
            "attention_mask": np.ones((1, n), np.int64),
            "position_ids": np.arange(n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32),
        }
    )
    # add_outputs appends after `logits`, in the order given.
    return {layer: req.get_output_tensor(1 + k).data.copy() for k, layer in enumerate(sorted(taps))}


def _hf_hidden(hf_dir: Path, ids: np.ndarray) -> list[np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states]


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2"])
@pytest.mark.parametrize("use_annotation", [True, False])
def test_taps_equal_hf_hidden_states(kind: str, use_annotation: bool, request: pytest.FixtureRequest) -> None:
    """Tapped layer i == HF output_hidden_states[i+1] (the last one is post-norm in both)."""
    hf_dir = request.getfixturevalue(f"tiny_{kind}_hf")
    ir_dir = request.getfixturevalue(f"tiny_{kind}_target")
    ids = np.array([[1, 417, 85, 202, 348, 285, 561, 11, 91, 334, 338, 552, 2, 202, 1, 443, 514, 703, 202]], np.int64)
    taps = _ov_taps(ir_dir, ids, use_annotation)
    hidden = _hf_hidden(hf_dir, ids)
    assert sorted(taps) == list(range(len(hidden) - 1))
    for layer, value in taps.items():
        ref = hidden[layer + 1]
        assert value.shape == ref.shape
        # Activations reach ~100 at this init scale: compare relative to the layer's magnitude
        # (measured ~2e-6); a tap on the wrong side of a block differs by O(1).
        diff = float(np.max(np.abs(value - ref)))
        assert diff < 1e-5 * max(1.0, float(np.max(np.abs(ref)))), f"layer {layer}: max |diff| {diff}"


def test_llama_gets_annotation(tiny_llama_target: Path) -> None:
    """optimum does not annotate Llama: the exporter must, in optimum's exact format."""
    model = _read(tiny_llama_target)
    ann = hidden_taps.read_annotation(model)
    assert ann is not None
    assert sorted(ann["layers"], key=int) == ["0", "1", "2", "3"]
    assert ann["layers"]["0"] == {"producer": "__module.model.layers.0/aten::add/Add_1", "output_index": 0}
    assert ann["layers"]["3"]["producer"] == "__module.model.norm/aten::mul/Multiply"
    raw = model.get_rt_info(hidden_taps.RT_INFO_KEY).astype(str)
    assert raw == hidden_taps.annotation_for(hidden_taps.search_decoder_layer_outputs(model))


def test_qwen2_is_annotated_by_the_search_in_int8_too(tiny_qwen2_hf: Path, tiny_qwen2_target: Path, tmp_path: Path) -> None:
    """optimum leaves Qwen2 (q/k/v biases, untied head) unannotated: the exporter's graph search
    must find the layer outputs, not a bias Add of the same width, also after int8 compression."""
    fp32 = _read(tiny_qwen2_target)
    ann = hidden_taps.read_annotation(fp32)
    assert ann is not None and sorted(ann["layers"], key=int) == ["0", "1", "2", "3"]
    assert ann["layers"]["0"]["producer"].startswith("__module.model.layers.0/")
    assert ann["layers"]["3"]["producer"].startswith("__module.model.norm/")
    int8 = export_target(tiny_qwen2_hf, tmp_path / "int8", weight_format="int8")
    ann8 = hidden_taps.read_annotation(_read(int8))
    assert ann8 == ann, "int8 compression must not move the taps"


def test_search_reproduces_optimum_qwen3_annotation(tiny_qwen3_target: Path) -> None:
    model = _read(tiny_qwen3_target)
    optimum_written = hidden_taps.read_annotation(model)
    assert optimum_written is not None
    searched = json.loads(hidden_taps.annotation_for(hidden_taps.search_decoder_layer_outputs(model)))
    assert searched == optimum_written


def test_search_rejects_wrong_layer_count(tiny_llama_target: Path) -> None:
    with pytest.raises(hidden_taps.HiddenTapError):
        hidden_taps.search_decoder_layer_outputs(_read(tiny_llama_target), num_layers=5)


def test_broken_annotation_falls_back_to_search(tiny_llama_target: Path) -> None:
    model = _read(tiny_llama_target)
    good = hidden_taps.annotation_for(hidden_taps.find_decoder_layer_outputs(model))
    model.set_rt_info('{"layers":{"0":{"producer":"no-such-node","output_index":0}}}', hidden_taps.RT_INFO_KEY)
    assert hidden_taps.annotation_for(hidden_taps.find_decoder_layer_outputs(model)) == good


def test_exported_folder_contents(tiny_llama_target: Path, tiny_qwen3_target: Path) -> None:
    for ir in (tiny_llama_target, tiny_qwen3_target):
        check_target_folder(ir)
        info = json.loads((ir / target_mod.EXPORT_INFO_FILE).read_text())
        assert info["weight_format"] == "fp32" and info["annotated_layers"] == 4
        assert not list(ir.parent.glob(f".{ir.name}.*")), "staging folders left behind"


def test_genai_chat_template_and_ids(tiny_llama_target: Path, tiny_llama_hf: Path) -> None:
    import openvino_genai
    from transformers import AutoTokenizer

    ov_tok = openvino_genai.Tokenizer(str(tiny_llama_target))
    hf_tok = AutoTokenizer.from_pretrained(tiny_llama_hf)
    text = "def foo(x):\n    return x + 1  # <|mask|>"
    assert ov_tok.encode(text).input_ids.data[0].tolist() == hf_tok(text).input_ids
    prompt = ov_tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("weight_format, weight_type", [("int8", ov.Type.u8), ("int4", ov.Type.u4)])
def test_compressed_export_is_annotated(tiny_llama_hf: Path, tmp_path: Path, weight_format: str, weight_type) -> None:
    out = export_target(tiny_llama_hf, tmp_path / weight_format, weight_format=weight_format)
    check_target_folder(out)
    model = _read(out)
    assert any(op.get_type_name() == "Constant" and op.get_element_type() == weight_type for op in model.get_ops())
    assert hidden_taps.read_annotation(model) is not None
    assert len(hidden_taps.find_decoder_layer_outputs(model, use_annotation=False)) == 4


def test_failed_export_leaves_no_folder(tiny_llama_hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_export(hf_dir: Path, out: Path, weight_format: str) -> None:
        out.mkdir(parents=True)
        (out / "openvino_model.xml").write_text("<half")
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(target_mod, "_run_optimum_export", half_export)
    out = tmp_path / "target"
    with pytest.raises(RuntimeError, match="simulated crash"):
        export_target(tiny_llama_hf, out, weight_format="fp32")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []

    # An existing good folder survives a failed re-export untouched.
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(RuntimeError):
        export_target(tiny_llama_hf, out, weight_format="fp32")
    assert (out / "keep.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["target"]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="weight_format"):
        export_target(tmp_path, tmp_path / "out", weight_format="int3")
    with pytest.raises(ModelFolderError, match="config.json"):
        export_target(tmp_path, tmp_path / "out", weight_format="fp32")


@pytest.mark.parametrize("missing", list(REQUIRED_FILES))
def test_check_target_folder_names_missing_file(tiny_llama_target: Path, tmp_path: Path, missing: str) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    for name in REQUIRED_FILES:
        if name != missing:
            shutil.copy(tiny_llama_target / name, folder / name)
    with pytest.raises(ModelFolderError, match=missing.replace(".", r"\.")) as err:
        check_target_folder(folder)
    assert "dflash-studio" in str(err.value)


def test_check_target_folder_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match="does not exist"):
        check_target_folder(tmp_path / "nope")
