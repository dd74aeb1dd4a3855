"""Draft export: our IR equals our torch DFlash v1 module and optimum-intel's own DFlash export."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

torch = pytest.importorskip("torch")

from engine.errors import ModelFolderError  # noqa: E402
from engine.drafts.dflash_v1 import (  # noqa: E402
    DFlashV1Draft,
    load_checkpoint,
    random_draft_config,
    save_checkpoint,
)
from engine.export.draft import DRAFT_XML, export_draft, state_name  # noqa: E402

F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
TARGET = {
    "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 96, "vocab_size": 300, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}


def _make_ckpt(folder: Path, *, block: int = 8, layer_ids=(1, 2), sliding: bool = False, seed: int = 0) -> Path:
    cfg = random_draft_config(TARGET, num_layers=2, block_size=block, target_layer_ids=list(layer_ids), mask_token_id=299)
    if sliding:  # one SWA layer whose window is shorter than context + block, so it really masks
        cfg["layer_types"] = ["sliding_attention", "full_attention"]
        cfg["sliding_window"] = 5
        cfg["use_sliding_window"] = True
    torch.manual_seed(seed)
    model = DFlashV1Draft(cfg)
    with torch.no_grad():  # norms away from 1 so a wrong norm placement shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return save_checkpoint(model, cfg, folder)


def _feeds(steps, block: int, n_ctx: int, seed: int = 1):
    """Consecutive draft calls: (T new context rows, inputs) with contiguous positions."""
    g = torch.Generator().manual_seed(seed)
    past = 0
    for t in steps:
        yield t, {
            "inputs_embeds": torch.randn(1, block, TARGET["hidden_size"], generator=g).numpy(),
            "hidden_states": torch.randn(1, t, n_ctx, generator=g).numpy(),
            "position_ids": np.arange(past, past + t + block, dtype=np.int64)[None],
            "attention_mask": np.ones((1, past + t + block), np.int64),
            "beam_idx": np.zeros(1, np.int32),
        }
        past += t


def _request(xml: Path) -> ov.InferRequest:
    return ov.Core().compile_model(str(xml), "CPU", F32).create_infer_request()


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "swa"])
def test_ir_matches_torch_over_consecutive_calls(tmp_path: Path, sliding: bool) -> None:
    ckpt = _make_ckpt(tmp_path / "ckpt", sliding=sliding)
    out = export_draft(ckpt, tmp_path / "ir")
    model, cfg = load_checkpoint(ckpt)
    req = _request(out / DRAFT_XML)
    past = None
    total = 0
    for t, feed in _feeds([6, 3, 1], block=8, n_ctx=2 * TARGET["hidden_size"]):
        with torch.no_grad():
            h, past = model(
                torch.from_numpy(feed["inputs_embeds"]), torch.from_numpy(feed["hidden_states"]),
                torch.from_numpy(feed["position_ids"]), past,
            )
        got = req.infer(feed)["last_hidden_state"]
        assert got.shape == (1, 7, TARGET["hidden_size"])  # seed row dropped
        assert np.abs(got - h[:, 1:].numpy()).max() < 1e-4
        total += t
        # The state holds context rows only: past + new rows, never the block.
        states = {s.name: s.state.data for s in req.query_state()}
        assert sorted(states) == sorted(state_name(i, k) for i in range(2) for k in ("key", "value"))
        for i in range(2):
            k = states[state_name(i, "key")]
            assert k.shape == (1, 2, total, 16)
            assert np.abs(k - past[i][0].numpy()).max() < 1e-4


def test_ir_contract(tmp_path: Path) -> None:
    ckpt = _make_ckpt(tmp_path / "ckpt", block=4, layer_ids=(0, 1, 2))
    (ckpt / "generation_config.json").write_text("{}")
    out = export_draft(ckpt, tmp_path / "ir")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "openvino_model.bin", DRAFT_XML]
    assert json.loads((out / "config.json").read_text())["block_size"] == 4
    m = ov.Core().read_model(str(out / DRAFT_XML))
    ins = {p.get_any_name(): (p.get_element_type(), str(p.get_partial_shape())) for p in m.inputs}
    assert ins == {
        "inputs_embeds": (ov.Type.f32, "[?,?,64]"),
        "hidden_states": (ov.Type.f32, "[?,?,192]"),
        "position_ids": (ov.Type.i64, "[?,?]"),
        "attention_mask": (ov.Type.i64, "[?,?]"),
        "beam_idx": (ov.Type.i32, "[?]"),
    }
    assert [o.get_any_name() for o in m.outputs] == ["last_hidden_state"]
    rt = m.get_rt_info()
    assert rt["dflash_mode"].value == "True"
    assert rt["dflash"]["mask_token_id"].value == "299"
    assert rt["dflash"]["target_layer_ids"].value == "0,1,2"
    assert rt["dflash"]["variant"].value == "dflash_v1"
    assert rt["dflash"]["block_size"].value == "4"
    assert rt["dflash"]["candidate_position_offset"].value == "1"


def test_ir_matches_optimum_intel_export(tmp_path: Path) -> None:
    """optimum-intel 2.2.0 exports the same checkpoint offline; both IRs must agree.

    optimum's CLI loads DFlash drafts as remote code pointing into its own model_patcher.py, whose
    static import scan asks for einops/diffusers (not in our venv) and writes into the HF modules
    cache. We use the same patched class and export_from_model directly instead; a local subclass
    keeps optimum's library detection on the transformers path as the remote-code load would.
    """
    pytest.importorskip("optimum.exporters.openvino")
    from optimum.exporters.openvino.convert import export_from_model
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from transformers import Qwen3Config

    class LocalDFlashDraft(Qwen3DFlashForCausalLM):
        pass

    ckpt = _make_ckpt(tmp_path / "ckpt", sliding=True, seed=3)
    ours = export_draft(ckpt, tmp_path / "ours")
    hf = LocalDFlashDraft.from_pretrained(str(ckpt), config=Qwen3Config.from_pretrained(str(ckpt))).eval()
    export_from_model(hf, str(tmp_path / "optimum"), task="text-generation-with-past")

    theirs_model = ov.Core().read_model(str(tmp_path / "optimum" / DRAFT_XML))
    ours_model = ov.Core().read_model(str(ours / DRAFT_XML))
    assert {p.get_any_name() for p in theirs_model.inputs} == {p.get_any_name() for p in ours_model.inputs}
    for key in ("mask_token_id", "target_layer_ids"):
        assert theirs_model.get_rt_info()["dflash"][key].value == ours_model.get_rt_info()["dflash"][key].value

    a, b = _request(tmp_path / "optimum" / DRAFT_XML), _request(ours / DRAFT_XML)
    assert sorted(s.name for s in a.query_state()) == sorted(s.name for s in b.query_state())
    for _, feed in _feeds([6, 3, 1], block=8, n_ctx=2 * TARGET["hidden_size"], seed=5):
        x, y = a.infer(feed)["last_hidden_state"].copy(), b.infer(feed)["last_hidden_state"].copy()
        assert x.shape == y.shape
        assert np.abs(x - y).max() < 1e-4


@pytest.mark.parametrize("fmt,tol", [("fp16", 5e-2), ("int8", 2e-1)])
def test_compressed_weight_formats(tmp_path: Path, fmt: str, tol: float) -> None:
    ckpt = _make_ckpt(tmp_path / "ckpt")
    ref = _request(export_draft(ckpt, tmp_path / "fp32") / DRAFT_XML)
    out = export_draft(ckpt, tmp_path / fmt, weight_format=fmt)
    assert (out / "openvino_model.bin").stat().st_size < (tmp_path / "fp32" / "openvino_model.bin").stat().st_size
    got = _request(out / DRAFT_XML)
    for _, feed in _feeds([5, 2], block=8, n_ctx=2 * TARGET["hidden_size"]):
        assert np.abs(got.infer(feed)["last_hidden_state"] - ref.infer(feed)["last_hidden_state"]).max() < tol


def test_int4_stores_every_matrix_in_int4_and_says_so_for_the_head(tmp_path: Path) -> None:
    """int4: the backbone's matrices as grouped int4 (smaller than int8), its output near fp32's, and config.json
    asking the loader to store the grafted lm_head rows as int4 too (engine/models/int4_head.py)."""
    ckpt = _make_ckpt(tmp_path / "ckpt")
    ref = _request(export_draft(ckpt, tmp_path / "fp32") / DRAFT_XML)
    int8 = export_draft(ckpt, tmp_path / "int8", weight_format="int8")
    out = export_draft(ckpt, tmp_path / "int4", weight_format="int4")
    assert (out / "openvino_model.bin").stat().st_size < (int8 / "openvino_model.bin").stat().st_size
    model = ov.Core().read_model(str(out / DRAFT_XML))
    kinds = {op.get_output_element_type(0) for op in model.get_ops() if op.get_type_name() == "Constant"}
    assert ov.Type.i4 in kinds and ov.Type.i8 not in kinds and ov.Type.u8 not in kinds
    assert json.loads((out / "config.json").read_text())["lm_head_bits"] == 4
    assert "lm_head_bits" not in json.loads((int8 / "config.json").read_text())
    got = _request(out / DRAFT_XML)
    for _, feed in _feeds([5, 2], block=8, n_ctx=2 * TARGET["hidden_size"]):
        want = ref.infer(feed)["last_hidden_state"].copy()
        err = np.abs(got.infer(feed)["last_hidden_state"] - want).max()
        assert err < 0.1 * np.abs(want).max(), err  # ~3 % here: int4's grid, not a broken graph


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    ckpt = _make_ckpt(tmp_path / "a")
    model, cfg = load_checkpoint(ckpt)
    again, cfg2 = load_checkpoint(save_checkpoint(model, cfg, tmp_path / "b"))
    assert cfg2["dflash_config"] == cfg["dflash_config"]
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


@pytest.mark.parametrize("arch", [None, "Qwen3ForCausalLM"])
def test_non_dflash_checkpoints_are_refused(tmp_path: Path, arch) -> None:
    """DSpark / DFlash v2 dispatch to their own exporters (tests/engine/export/test_export_dspark_dflash2.py)."""
    ckpt = _make_ckpt(tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = [arch] if arch else []
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match="not a DFlash draft checkpoint"):
        export_draft(ckpt, tmp_path / "ir")
    assert not (tmp_path / "ir").exists()


def test_bad_input_leaves_no_folder(tmp_path: Path) -> None:
    ckpt = _make_ckpt(tmp_path / "ckpt")
    (ckpt / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(Exception):
        export_draft(ckpt, tmp_path / "ir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    with pytest.raises(ValueError, match="weight_format"):
        export_draft(ckpt, tmp_path / "ir", weight_format="int3")


def test_failure_during_conversion_keeps_old_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = _make_ckpt(tmp_path / "ckpt")
    out = export_draft(ckpt, tmp_path / "ir")
    before = (out / "openvino_model.bin").read_bytes()

    def boom(*_a, **_k):
        raise RuntimeError("disk full")

    monkeypatch.setattr("engine.export.ir.save_ir", boom)  # every draft folder is written there
    with pytest.raises(RuntimeError, match="disk full"):
        export_draft(ckpt, tmp_path / "ir")
    assert (out / "openvino_model.bin").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ir"]
