"""DSpark and DFlash v2 export: IRs equal the torch modules, the folders follow docs/draft-contract.md,
and checkpoints with the public tensor names load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

torch = pytest.importorskip("torch")

from engine.errors import ModelFolderError  # noqa: E402
from engine.drafts import dflash2, dspark  # noqa: E402
from engine.drafts.heads import dense_bias_np, edge_bias_np  # noqa: E402
from engine.export import dflash2 as dflash2_export, dspark as dspark_export  # noqa: E402
from engine.export.draft import DRAFT_XML, state_name  # noqa: E402
from engine.export.markov_head import DENSE_XML, SCORER_XML  # noqa: E402

F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
TARGET = {
    "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 96, "vocab_size": 300, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}
H, V, MASK, RANK = TARGET["hidden_size"], TARGET["vocab_size"], 299, 16
TOL = 1e-4

# name -> (markov_rank, head type, confidence head, confidence reads W1)
DSPARK_KINDS = {
    "vanilla": (RANK, "vanilla", True, True),  # like the public dspark_qwen3_*_block7
    "gated": (RANK, "gated", True, False),  # confidence as a backbone output
    "nohead": (0, "vanilla", False, False),  # like deepseek-ai/dflash_qwen3_*_block7
}


def _perturb(model, seed: int, scale: float = 0.3) -> None:
    """Move every weight off its init (norms off 1, identity convs off identity, zero codebooks off zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _dspark_ckpt(folder: Path, kind: str, block: int = 7, seed: int = 0) -> Path:
    rank, head, conf, with_markov = DSPARK_KINDS[kind]
    cfg = dspark.random_dspark_config(TARGET, 2, block, [1, 2], MASK, markov_rank=rank, markov_head_type=head,
                                      enable_confidence_head=conf, confidence_head_with_markov=with_markov)
    torch.manual_seed(seed)
    model = dspark.DSparkDraft(cfg)
    _perturb(model, seed)
    return dspark.save_dspark_checkpoint(model, cfg, folder)


def _dflash2_ckpt(folder: Path, block: int = 8, seed: int = 0, sliding: bool = True) -> Path:
    cfg = dflash2.random_dflash2_config(
        TARGET, 2, block, [1, 2], MASK, conv_group_size=16, selector_rank=RANK, selector_top_k=8,
        input_embedding_scale=1.5, output_multiplier=0.5, final_logit_softcapping=10.0,
        sliding_window=5 if sliding else None,  # shorter than context + block, so it really masks
    )
    torch.manual_seed(seed)
    model = dflash2.DFlash2Draft(cfg)
    _perturb(model, seed)
    return dflash2.save_dflash2_checkpoint(model, cfg, folder)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """kind -> (checkpoint folder, exported folder), each exported once per module (exports take seconds)."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind)
            if kind.startswith("dflash2"):
                ckpt = _dflash2_ckpt(root / "ckpt", sliding=kind != "dflash2_full")
                cache[kind] = (ckpt, dflash2_export.export_dflash2_draft(ckpt, root / "ir"))
            else:
                ckpt = _dspark_ckpt(root / "ckpt", kind)
                (ckpt / "generation_config.json").write_text("{}")  # copied along (folder contract)
                cache[kind] = (ckpt, dspark_export.export_dspark_draft(ckpt, root / "ir"))
        return cache[kind]

    return get


def _load(ckpt: Path):
    cfg = json.loads((ckpt / "config.json").read_text())
    loader = dflash2.load_dflash2_checkpoint if cfg["architectures"] == ["DFlash2DraftModel"] else dspark.load_dspark_checkpoint
    return loader(ckpt)[0]


def _request(xml: Path) -> ov.InferRequest:
    return ov.Core().compile_model(str(xml), "CPU", F32).create_infer_request()


def _feeds(steps, rows: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    past = 0
    for t in steps:
        yield t, {
            "inputs_embeds": torch.randn(1, rows, H, generator=g).numpy(),
            "hidden_states": torch.randn(1, t, 2 * H, generator=g).numpy(),
            "position_ids": np.arange(past, past + t + rows, dtype=np.int64)[None],
            "attention_mask": np.ones((1, past + t + rows), np.int64),
            "beam_idx": np.zeros(1, np.int32),
        }
        past += t


def _check_backbone(model, xml: Path, rows: int, offset: int, confidence: bool) -> float:
    """Two consecutive calls (6 then 3 new context rows); returns the worst difference seen."""
    req = _request(xml)
    past, total, worst = None, 0, 0.0
    for t, feed in _feeds([6, 3], rows):
        with torch.no_grad():
            h, past = model(torch.from_numpy(feed["inputs_embeds"]), torch.from_numpy(feed["hidden_states"]),
                            torch.from_numpy(feed["position_ids"]), past)
        ref = h[:, offset:]
        out = req.infer(feed)
        got = out["last_hidden_state"]
        assert got.shape == (1, rows - offset, H)
        worst = max(worst, float(np.abs(got - ref.numpy()).max()))
        if confidence:
            c = out["confidence"]
            assert c.shape == (1, rows - offset)
            worst = max(worst, float(np.abs(c - model.backbone_confidence(ref).detach().numpy()).max()))
        total += t
        states = {s.name: s.state.data for s in req.query_state()}
        assert sorted(states) == sorted(state_name(i, k) for i in range(2) for k in ("key", "value"))
        for i in range(2):  # context rows only, never the block
            k, v = states[state_name(i, "key")], states[state_name(i, "value")]
            assert k.shape == v.shape == (1, 2, total, 16)
            worst = max(worst, float(np.abs(k - past[i][0].numpy()).max()), float(np.abs(v - past[i][1].numpy()).max()))
    assert worst < TOL, worst
    return worst


# --------------------------------------------------------------------------------------------
# Backbone IR vs torch
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(DSPARK_KINDS))
def test_dspark_backbone_matches_torch(built, kind: str) -> None:
    ckpt, out = built(kind)
    model = _load(ckpt)
    # Offset 0: as many candidate rows as input rows (7 = the trained block, 4 = fewer candidates).
    for rows in (7, 4):
        _check_backbone(model, out / DRAFT_XML, rows, offset=0, confidence=model.backbone_has_confidence)


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "swa"])
def test_dflash2_backbone_matches_torch(built, sliding: bool) -> None:
    ckpt, out = built("dflash2" if sliding else "dflash2_full")
    model = _load(ckpt)
    for rows in (8, 5):  # N + 1 rows: the anchor row is dropped
        _check_backbone(model, out / DRAFT_XML, rows, offset=1, confidence=False)


# --------------------------------------------------------------------------------------------
# Head IRs vs torch
# --------------------------------------------------------------------------------------------
def _head_inputs(r: int, k: int, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    pred = torch.randint(0, V, (r, k), generator=g)
    cand = torch.randint(0, V, (r, k), generator=g)
    hidden = torch.randn(r, H, generator=g) * 2
    return pred, cand, hidden


@pytest.mark.parametrize("kind", ["vanilla", "gated", "selector"])
def test_scorer_ir_matches_torch(built, kind: str) -> None:
    ckpt, out = built("dflash2" if kind == "selector" else kind)
    model = _load(ckpt)
    req = _request(out / SCORER_XML)
    w = model.head_weights()
    for r, k in ((7, 8), (13, 3)):  # several requests' rows in one call; K other than the default
        pred, cand, hidden = _head_inputs(r, k)
        res = req.infer({"predecessor_ids": pred.numpy(), "candidate_ids": cand.numpy(),
                         "draft_hidden_states": hidden.numpy()})
        with torch.no_grad():
            ref = model.edge_bias(pred, cand, hidden).numpy()
        got = res["edge_bias"]
        assert got.shape == (r, k, k)
        assert np.abs(got - ref).max() < TOL
        assert np.abs(edge_bias_np(w, pred.numpy(), cand.numpy(), hidden.numpy()) - ref).max() < TOL
        if kind == "vanilla":  # its confidence reads W1[pred]: one value per (row, predecessor)
            with torch.no_grad():
                conf = model.confidence(hidden[:, None, :].expand(-1, k, -1), pred).numpy()
            assert np.abs(res["confidence"] - conf).max() < TOL
        # edge_bias[r, i, j] is the bias of candidate j after predecessor i
        i, j = 1, 2
        with torch.no_grad():
            dense = model.dense_bias(pred[:, i], hidden) if kind != "selector" else None
        if dense is not None:
            assert np.abs(got[:, i, j] - dense.numpy()[np.arange(r), cand[:, j].numpy()]).max() < TOL


@pytest.mark.parametrize("kind", ["vanilla", "gated"])
def test_dense_head_ir_matches_torch(built, kind: str) -> None:
    ckpt, out = built(kind)
    model = _load(ckpt)
    req = _request(out / DENSE_XML)
    for r in (1, 5):
        pred, _, hidden = _head_inputs(r, 1, seed=r)
        prev = pred[:, 0]
        res = req.infer({"predecessor_ids": prev.numpy(), "draft_hidden_states": hidden.numpy()})
        with torch.no_grad():
            ref = model.dense_bias(prev, hidden).numpy()
        assert res["bias"].shape == (r, V)
        assert np.abs(res["bias"] - ref).max() < TOL
        assert np.abs(dense_bias_np(model.head_weights(), prev.numpy(), hidden.numpy()) - ref).max() < TOL
        if kind == "vanilla":
            with torch.no_grad():
                conf = model.confidence(hidden, prev).numpy()
            assert res["confidence"].shape == (r,)
            assert np.abs(res["confidence"] - conf).max() < TOL


# --------------------------------------------------------------------------------------------
# The contract: files, ports, rt_info
# --------------------------------------------------------------------------------------------
def _rt(model: ov.Model) -> dict[str, str]:
    def walk(m, prefix=""):
        out = {}
        for k, v in m.items():
            if hasattr(v, "items") and not isinstance(v, str):
                try:
                    out.update(walk(v, f"{prefix}{k}/"))
                    continue
                except Exception:  # noqa: BLE001
                    pass
            out[f"{prefix}{k}"] = v.astype(str) if hasattr(v, "astype") else str(v)
        return out

    return walk(model.get_rt_info())


def _ports(ports) -> dict[str, tuple[ov.Type, str]]:
    return {p.get_any_name(): (p.get_element_type(), str(p.get_partial_shape())) for p in ports}


BACKBONE_INPUTS = {
    "inputs_embeds": (ov.Type.f32, f"[?,?,{H}]"),
    "hidden_states": (ov.Type.f32, f"[?,?,{2 * H}]"),
    "position_ids": (ov.Type.i64, "[?,?]"),
    "attention_mask": (ov.Type.i64, "[?,?]"),
    "beam_idx": (ov.Type.i32, "[?]"),
}


@pytest.mark.parametrize("kind", sorted(DSPARK_KINDS))
def test_dspark_folder_contract(built, kind: str) -> None:
    out = built(kind)[1]
    files = sorted(p.name for p in out.iterdir())
    base = ["config.json", "generation_config.json", "openvino_model.bin", DRAFT_XML]
    heads = [] if kind == "nohead" else [
        "openvino_markov_head_dense_model.bin", DENSE_XML, "openvino_markov_head_model.bin", SCORER_XML]
    assert files == sorted(base + heads)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    core = ov.Core()
    m = core.read_model(str(out / DRAFT_XML))
    assert _ports(m.inputs) == BACKBONE_INPUTS
    outputs = ["last_hidden_state"] + (["confidence"] if kind == "gated" else [])
    assert [o.get_any_name() for o in m.outputs] == outputs
    rt = _rt(m)
    rank = DSPARK_KINDS[kind][0]
    expected = {
        "dflash_mode": "True", "dflash/mask_token_id": str(MASK), "dflash/target_layer_ids": "1,2",
        "dflash/variant": "dspark", "dflash/block_size": "7", "dflash/candidate_position_offset": "0",
        "dflash/markov_head_type": {"vanilla": "vanilla", "gated": "gated", "nohead": "none"}[kind],
        "dflash/markov_rank": str(rank), "dflash/markov_head_top_k": "8" if rank else "0",
        "runtime_options/ACTIVATIONS_SCALE_FACTOR": "8.0",
    }
    if kind != "nohead":
        expected["dflash/confidence_head"] = "True" if kind == "gated" else "markov_head"
    for key, value in expected.items():
        assert rt.get(key) == value, key
    if kind == "nohead":
        assert "dflash/confidence_head" not in rt
        return
    scorer, dense = core.read_model(str(out / SCORER_XML)), core.read_model(str(out / DENSE_XML))
    assert _ports(scorer.inputs) == {"predecessor_ids": (ov.Type.i64, "[?,?]"), "candidate_ids": (ov.Type.i64, "[?,?]"),
                                     "draft_hidden_states": (ov.Type.f32, f"[?,{H}]")}
    assert _ports(dense.inputs) == {"predecessor_ids": (ov.Type.i64, "[?]"),
                                    "draft_hidden_states": (ov.Type.f32, f"[?,{H}]")}
    with_conf = kind == "vanilla"
    assert _ports(scorer.outputs) == {"edge_bias": (ov.Type.f32, "[?,?,?]"),
                                      **({"confidence": (ov.Type.f32, "[?,?]")} if with_conf else {})}
    assert _ports(dense.outputs) == {"bias": (ov.Type.f32, f"[?,{V}]"),
                                     **({"confidence": (ov.Type.f32, "[?]")} if with_conf else {})}
    for head in (scorer, dense):
        assert {k: v for k, v in _rt(head).items() if k.startswith("dflash_markov/")} == {
            "dflash_markov/head_type": kind, "dflash_markov/rank": str(RANK), "dflash_markov/vocab_size": str(V),
            "dflash_markov/hidden_size": str(H), "dflash_markov/score_semantics": "bias_only",
            "dflash_markov/confidence": "True" if with_conf else "False",
        }


def test_dflash2_folder_contract(built) -> None:
    out = built("dflash2")[1]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "openvino_model.bin", DRAFT_XML, "openvino_markov_head_model.bin", SCORER_XML])
    core = ov.Core()
    m = core.read_model(str(out / DRAFT_XML))
    assert _ports(m.inputs) == BACKBONE_INPUTS
    assert [o.get_any_name() for o in m.outputs] == ["last_hidden_state"]
    rt = _rt(m)
    expected = {
        "dflash_mode": "True", "dflash/mask_token_id": str(MASK), "dflash/target_layer_ids": "1,2",
        "dflash/variant": "dflash_v2", "dflash/block_size": "8", "dflash/candidate_position_offset": "1",
        "dflash/markov_head_type": "selector", "dflash/markov_rank": str(RANK), "dflash/markov_head_top_k": "8",
        "dflash/input_embedding_scale": "1.5", "dflash/output_multiplier": "0.5",
        "dflash/final_logit_softcapping": "10.0", "runtime_options/ACTIVATIONS_SCALE_FACTOR": "32.0",
    }
    for key, value in expected.items():
        assert rt.get(key) == value, key
    assert "dflash/confidence_head" not in rt
    scorer = core.read_model(str(out / SCORER_XML))
    assert [o.get_any_name() for o in scorer.outputs] == ["edge_bias"]
    assert _rt(scorer)["dflash_markov/head_type"] == "selector"


def test_dflash2_config_options(tmp_path: Path) -> None:
    """No soft-capping means no key; a config's own activations scale factor wins over 32."""
    cfg = dflash2.random_dflash2_config(TARGET, 1, 4, [1, 2], MASK, selector_rank=4, selector_top_k=3)
    cfg["dflash_config"]["activations_scale_factor"] = 64
    torch.manual_seed(0)
    ckpt = dflash2.save_dflash2_checkpoint(dflash2.DFlash2Draft(cfg), cfg, tmp_path / "ckpt")
    rt = _rt(ov.Core().read_model(str(dflash2_export.export_dflash2_draft(ckpt, tmp_path / "ir") / DRAFT_XML)))
    assert "dflash/final_logit_softcapping" not in rt
    assert rt["dflash/input_embedding_scale"] == rt["dflash/output_multiplier"] == "1.0"
    assert rt["runtime_options/ACTIVATIONS_SCALE_FACTOR"] == "64.0"
    assert rt["dflash/markov_head_top_k"] == "3"


# --------------------------------------------------------------------------------------------
# Checkpoints with the public tensor names
# --------------------------------------------------------------------------------------------
def _backbone_names(layers: int, hidden: int, heads: int, kv: int, d: int, inter: int, n_ctx: int) -> dict:
    names = {"fc.weight": (hidden, n_ctx), "hidden_norm.weight": (hidden,), "norm.weight": (hidden,)}
    for i in range(layers):
        p = f"layers.{i}."
        names.update({
            p + "self_attn.q_proj.weight": (heads * d, hidden), p + "self_attn.k_proj.weight": (kv * d, hidden),
            p + "self_attn.v_proj.weight": (kv * d, hidden), p + "self_attn.o_proj.weight": (hidden, heads * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })
    return names


def _write_public(folder: Path, config: dict, names: dict, prefix: str = "") -> dict:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(7)
    state = {prefix + k: torch.randn(shape, generator=g).to(torch.bfloat16) for k, shape in names.items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return {k.removeprefix(prefix): v.float() for k, v in state.items()}


def test_load_public_dspark_checkpoint(tmp_path: Path) -> None:
    """A DeepSpec-shaped folder: top-level fields, bf16, embed/lm_head copies, gated head + Markov confidence."""
    r = 8
    config = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "block_size": 7, "num_hidden_layers": 2,
        "hidden_size": H, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": V, "mask_token_id": MASK, "target_layer_ids": [1, 2],
        "num_target_layers": 4, "num_anchors": 512, "markov_rank": r, "markov_head_type": "gated",
        "enable_confidence_head": True, "confidence_head_with_markov": True, "tie_word_embeddings": False,
    }
    names = _backbone_names(2, H, 4, 2, 16, 96, 2 * H)
    names.update({
        "embed_tokens.weight": (V, H), "lm_head.weight": (V, H),
        "markov_head.markov_w1.weight": (V, r), "markov_head.markov_w2.weight": (V, r),
        "markov_head.gate_proj.weight": (r, H + r), "markov_head.gate_proj.bias": (r,),
        "confidence_head.proj.weight": (1, H + r), "confidence_head.proj.bias": (1,),
    })
    state = _write_public(tmp_path / "ckpt", config, names)
    model, _ = dspark.load_dspark_checkpoint(tmp_path / "ckpt")
    assert torch.equal(model.markov_head.markov_w1.weight, state["markov_head.markov_w1.weight"])
    assert torch.equal(model.markov_head.gate_proj.weight, state["markov_head.gate_proj.weight"])
    assert torch.equal(model.confidence_head.proj.weight, state["confidence_head.proj.weight"])
    assert torch.equal(model.layers[1].mlp.down_proj.weight, state["layers.1.mlp.down_proj.weight"])
    assert torch.equal(model.lm_head_weight, state["lm_head.weight"])
    # The copies make a reference walk possible without the target's tables.
    toks = dspark.reference_walk(model, None, None, 5, torch.randn(4, 2 * H), 7, "topk")
    assert toks.shape == (7,)
    out = dspark_export.export_dspark_draft(tmp_path / "ckpt", tmp_path / "ir")
    assert (out / SCORER_XML).is_file() and (out / DENSE_XML).is_file()

    # A missing head tensor is named.
    from safetensors.torch import save_file
    del state["markov_head.gate_proj.bias"]
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "ckpt" / "model.safetensors"))
    with pytest.raises(ModelFolderError, match="markov_head.gate_proj.bias"):
        dspark.load_dspark_checkpoint(tmp_path / "ckpt")


def test_load_public_dflash2_checkpoint(tmp_path: Path) -> None:
    """A z-lab-shaped folder: switches inside dflash_config, 'model.' prefixes, grouped conv shapes."""
    r, k, group = 8, 2, 16
    groups = H // group
    config = {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": H,
        "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": V, "num_target_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 2048,
        "dflash_config": {"block_size": 8, "conv_group_size": group, "conv_kernel_size": k, "selector_rank": r,
                          "selector_top_k": 16, "mask_token_id": MASK, "target_layer_ids": [1, 2]},
    }
    names = _backbone_names(2, H, 4, 2, 16, 96, 2 * H)
    for i in range(2):
        for conv in ("attention_conv", "mlp_conv"):
            names[f"layers.{i}.{conv}.base_kernel"] = (2, k, H)
            names[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * k * groups, H)
    names.update({"candidate_selector.predecessor_codebook": (V, r), "candidate_selector.successor_codebook": (V, r),
                  "candidate_selector.hidden_projection.weight": (r, H), "embed_tokens.weight": (V, H)})
    state = _write_public(tmp_path / "ckpt", config, names, prefix="model.")
    model, _ = dflash2.load_dflash2_checkpoint(tmp_path / "ckpt")
    assert torch.equal(model.layers[0].attention_conv.base_kernel, state["layers.0.attention_conv.base_kernel"])
    assert torch.equal(model.layers[1].mlp_conv.kernel_projection.weight, state["layers.1.mlp_conv.kernel_projection.weight"])
    assert torch.equal(model.candidate_selector.successor_codebook, state["candidate_selector.successor_codebook"])
    assert model.v2.selector_top_k == 16 and model.cfg.sliding_window == 2048
    out = dflash2_export.export_dflash2_draft(tmp_path / "ckpt", tmp_path / "ir")
    assert (out / SCORER_XML).is_file() and not (out / DENSE_XML).exists()


def test_rnn_head_is_refused(tmp_path: Path) -> None:
    cfg = dspark.random_dspark_config(TARGET, 1, 7, [1, 2], MASK, markov_rank=4)
    cfg["markov_head_type"] = "rnn"
    with pytest.raises(ModelFolderError, match="rnn"):
        dspark.DSparkDraft(cfg)


# --------------------------------------------------------------------------------------------
# DFlash v2 convolution semantics
# --------------------------------------------------------------------------------------------
def test_conv_taps_stay_inside_blocks() -> None:
    conv = dflash2.GroupedDynamicConv(2, taps=2, group_size=1)
    with torch.no_grad():
        conv.kernel_projection.weight.zero_()
        conv.base_kernel.zero_()
        conv.base_kernel[:, 1] = 1.0  # pure shift by one row
    x = torch.arange(1.0, 13.0).view(1, 6, 2)
    dyn = conv.kernels(x)
    packed = conv.apply(x, 0, dyn, block_len=3)
    assert torch.equal(packed[0, :, 0], torch.tensor([0.0, 1.0, 3.0, 0.0, 7.0, 9.0]))
    single = conv.apply(x[:, :3], 0, dyn[:, :3], block_len=None)  # one block: row 0 reads zero padding
    assert torch.equal(single, packed[:, :3])


def test_dflash2_packed_training_equals_single_blocks() -> None:
    """Two blocks packed as in training give the same rows as two inference calls."""
    from engine.training.packing import packed_inputs

    cfg = dflash2.random_dflash2_config(TARGET, 2, 4, [1, 2], MASK, conv_group_size=16, selector_rank=4, selector_top_k=3)
    torch.manual_seed(0)
    model = dflash2.DFlash2Draft(cfg)
    _perturb(model, 3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V - 1, (1, 12), generator=g)
    feats = torch.randn(1, 12, 2 * H, generator=g)
    embed = torch.randn(V, H, generator=g)
    anchors = torch.tensor([[3, 7]])
    batch = packed_inputs(tokens, feats, anchors, 4, MASK, embed)
    batch.pop("labels"), batch.pop("label_weights")
    with torch.no_grad():
        packed = model.forward_packed(**batch)
        for b, a in enumerate(anchors[0].tolist()):
            ids = torch.tensor([int(tokens[0, a])] + [MASK] * 3)
            h, _ = model(embed[ids][None], feats[:, :a], torch.arange(a + 4)[None])
            assert torch.allclose(packed[0, 4 * b: 4 * b + 4], h[0], atol=1e-4)


# --------------------------------------------------------------------------------------------
# Reference walks, and the contract's walk over the IRs
# --------------------------------------------------------------------------------------------
def test_topk_walk_with_full_vocabulary_is_the_dense_walk(tmp_path: Path) -> None:
    """With K = V the scorer lattice holds every token, so both greedy walks must agree."""
    for kind in ("vanilla", "gated"):
        model, _ = dspark.load_dspark_checkpoint(_dspark_ckpt(tmp_path / kind, kind, seed=4))
        g = torch.Generator().manual_seed(1)
        # A small lm_head keeps the unary logits comparable to the Markov bias, so the head matters.
        emb, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g) * 0.05
        ctx = torch.randn(5, 2 * H, generator=g)
        dense = dspark.reference_walk(model, emb, head, 3, ctx, 7, "dense")
        full = dspark.reference_walk(model, emb, head, 3, ctx, 7, "topk", top_k=V)
        assert dense.tolist() == full.tolist()
        none = dspark.reference_walk(model, emb, head, 3, ctx, 7, "none")
        assert none.tolist() != dense.tolist()  # the head matters on these weights


def _ir_walk(folder: Path, emb: np.ndarray, head: np.ndarray, anchor: int, ctx: np.ndarray, n: int, mode: str,
             k: int, offset: int, scales=(1.0, 1.0, None)) -> list[int]:
    """The walk docs/draft-contract.md describes, over the exported IRs (what engine/drafting does)."""
    scale, mult, cap = scales
    ids = [anchor] + [MASK] * (n - 1 + offset)
    rows = len(ids)
    out = _request(folder / DRAFT_XML).infer({
        "inputs_embeds": (emb[ids] * scale)[None].astype(np.float32), "hidden_states": ctx[None].astype(np.float32),
        "position_ids": np.arange(ctx.shape[0] + rows, dtype=np.int64)[None],
        "attention_mask": np.ones((1, ctx.shape[0] + rows), np.int64), "beam_idx": np.zeros(1, np.int32),
    })
    h = out["last_hidden_state"][0]
    u = (h @ head.T) * mult
    if cap:
        u = np.tanh(u / cap) * cap
    if mode == "none":
        return [int(t) for t in u.argmax(-1)]
    if mode == "topk":
        cand = np.argsort(-u, axis=-1, kind="stable")[:, :k]
        pred = np.empty_like(cand)
        pred[0], pred[1:] = anchor, cand[:-1]
        e = _request(folder / SCORER_XML).infer({"predecessor_ids": pred, "candidate_ids": cand,
                                                 "draft_hidden_states": h})["edge_bias"]
        e = np.take_along_axis(u, cand, -1)[:, None, :] + e
        toks, prev = [], 0
        for p in range(n):
            prev = int(e[p, prev].argmax())
            toks.append(int(cand[p, prev]))
        return toks
    req, toks, prev = _request(folder / DENSE_XML), [], anchor
    for p in range(n):
        bias = req.infer({"predecessor_ids": np.array([prev]), "draft_hidden_states": h[p: p + 1]})["bias"][0]
        prev = int((u[p] + bias).argmax())
        toks.append(prev)
    return toks


@pytest.mark.parametrize("kind", ["vanilla", "gated", "nohead", "dflash2"])
def test_ir_walks_equal_reference_walks(built, kind: str) -> None:
    g = torch.Generator().manual_seed(11)
    emb, head = (torch.randn(V, H, generator=g) * 0.5).numpy(), (torch.randn(V, H, generator=g) * 0.05).numpy()
    ctx = torch.randn(6, 2 * H, generator=g).numpy()
    if kind == "dflash2":
        ckpt, folder = built("dflash2")
        model = _load(ckpt)
        modes, offset, walk = ("none", "topk"), 1, dflash2.reference_walk
        scales = (1.5, 0.5, 10.0)
        with pytest.raises(ValueError, match="dense"):
            walk(model, emb, head, 7, ctx, 4, "dense")
    else:
        ckpt, folder = built(kind)
        model = _load(ckpt)
        modes, offset, walk = (("none",) if kind == "nohead" else ("none", "topk", "dense")), 0, dspark.reference_walk
        scales = (1.0, 1.0, None)
    for n in (model.cfg.block_size - offset, 3):
        for mode in modes:
            for k in ((model.default_top_k, 4) if mode == "topk" else (0,)):
                ref = walk(model, emb, head, 7, ctx, n, mode, top_k=k or None)
                got = _ir_walk(folder, emb, head, 7, ctx, n, mode, k, offset, scales)
                assert got == ref.tolist(), (mode, n, k)


# --------------------------------------------------------------------------------------------
# export_draft (and so `dflash-studio export --kind draft`) detects the variant
# --------------------------------------------------------------------------------------------
def test_export_draft_dispatches_on_architectures(tmp_path: Path) -> None:
    from engine.export.draft import detect_variant, export_draft

    for name, ckpt in (("dspark", _dspark_ckpt(tmp_path / "a", "nohead", block=4)),
                       ("dflash_v2", _dflash2_ckpt(tmp_path / "b", block=4))):
        assert detect_variant(json.loads((ckpt / "config.json").read_text())) == name
        out = export_draft(ckpt, tmp_path / f"ir-{name}", weight_format="fp16")
        m = ov.Core().read_model(str(out / DRAFT_XML))
        assert m.get_rt_info(["dflash", "variant"]).astype(str) == name


def test_mislabelled_checkpoint_is_refused_without_output(tmp_path: Path) -> None:
    """A v1 folder whose config says DSpark lacks DSpark's fields: a clear error, no folder."""
    from engine.export.draft import export_draft

    ckpt = _dflash2_ckpt(tmp_path / "ckpt", block=4)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["Qwen3DSparkModel"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match="markov_rank"):
        export_draft(ckpt, tmp_path / "ir")
    assert not (tmp_path / "ir").exists()


@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_compressed_heads(built, tmp_path: Path, fmt: str) -> None:
    ckpt, ref_dir = built("gated")
    out = dspark_export.export_dspark_draft(ckpt, tmp_path / fmt, weight_format=fmt)
    assert (out / "openvino_markov_head_model.bin").stat().st_size < (ref_dir / "openvino_markov_head_model.bin").stat().st_size
    pred, cand, hidden = _head_inputs(5, 8)
    feed = {"predecessor_ids": pred.numpy(), "candidate_ids": cand.numpy(), "draft_hidden_states": hidden.numpy()}
    got, ref = _request(out / SCORER_XML).infer(feed)["edge_bias"], _request(ref_dir / SCORER_XML).infer(feed)["edge_bias"]
    assert np.abs(got - ref).max() < (2e-2 if fmt == "fp16" else 0.25) * max(1.0, np.abs(ref).max())
