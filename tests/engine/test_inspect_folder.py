"""engine.inspect_folder: what a Hugging Face folder holds, and the pre-export draft check."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import inspect_folder as F

REPO = Path(__file__).resolve().parents[2]


# ---- checkpoints built without training or exporting (seconds) -------------------------------------
def _target_config(hf_dir: Path) -> dict:
    return json.loads((hf_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def variant_ckpts(tiny_qwen3_hf: Path, tmp_path_factory) -> dict[str, Path]:
    """HF checkpoint folders of every variant kind for the tiny Qwen3 target (random weights)."""
    import torch

    from engine.drafts.dflash2 import DFlash2Draft, save_dflash2_checkpoint
    from engine.drafts.dspark import DSparkDraft, save_dspark_checkpoint
    from fixtures.tiny_models import MASK_ID
    from fixtures.tiny_variant_drafts import DSPARK, VARIANT_SPECS, make_config

    root = tmp_path_factory.mktemp("variant-ckpts")
    tcfg = _target_config(tiny_qwen3_hf)
    out = {}
    for spec in VARIANT_SPECS:
        if spec.trained:
            continue
        cfg = make_config(spec, tcfg, MASK_ID)
        torch.manual_seed(spec.seed)
        if spec.kind == DSPARK:
            out[spec.name] = save_dspark_checkpoint(DSparkDraft(cfg), cfg, root / spec.name)
        else:
            out[spec.name] = save_dflash2_checkpoint(DFlash2Draft(cfg), cfg, root / spec.name)
    return out


def build_v1_ckpt(target_cfg: dict, out: Path, layer_ids=(1, 2), block=8, **over) -> Path:
    """A random DFlash v1 checkpoint for a target config (edited by `over`, e.g. another hidden size)."""
    import torch

    from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint
    from fixtures.tiny_models import MASK_ID

    cfg = random_draft_config({**target_cfg, **over}, 1, block, list(layer_ids), MASK_ID)
    torch.manual_seed(0)
    return save_checkpoint(DFlashV1Draft(cfg), cfg, out)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


# ---- targets ------------------------------------------------------------------------------------
def test_target_folder_is_described(tiny_qwen3_hf: Path) -> None:
    info = F.inspect_hf_folder(tiny_qwen3_hf)
    assert info.kind == F.KIND_TARGET and info.usable and info.model_kind == "target", info.reason
    assert (info.architecture, info.model_type) == ("Qwen3ForCausalLM", "qwen3")
    assert (info.num_layers, info.hidden_size, info.vocab_size) == (4, 64, 768)
    assert info.optimum_exportable and info.has_chat_template
    rows = dict(info.rows())
    assert "4 layers, hidden size 64, vocabulary 768" in rows["Shape"]
    assert info.weights_bytes > 0


def test_llama_target_too(tiny_llama_hf: Path) -> None:
    info = F.inspect_hf_folder(tiny_llama_hf)
    assert info.kind == F.KIND_TARGET and info.model_type == "llama", info.reason


def test_target_without_weights_or_tokenizer(tiny_qwen3_hf: Path, tmp_path: Path) -> None:
    no_weights = _copy(tiny_qwen3_hf, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    info = F.inspect_hf_folder(no_weights)
    assert info.kind == F.KIND_NONE and "weights are missing" in info.reason and "safetensors" in info.reason

    no_tok = _copy(tiny_qwen3_hf, tmp_path / "no-tok")
    (no_tok / "tokenizer.json").unlink()
    info = F.inspect_hf_folder(no_tok)
    assert info.kind == F.KIND_NONE and "tokenizer is missing" in info.reason

    sharded = _copy(tiny_qwen3_hf, tmp_path / "sharded")
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    info = F.inspect_hf_folder(sharded)
    assert info.kind == F.KIND_NONE and "model-00002-of-00002.safetensors" in info.reason
    assert "incomplete" in info.reason


def test_unknown_architectures(tiny_qwen3_hf: Path, tmp_path: Path) -> None:
    weird = _copy(tiny_qwen3_hf, tmp_path / "weird")
    _edit_config(weird, architectures=["WeirdForCausalLM"], model_type="weird")
    info = F.inspect_hf_folder(weird)
    assert info.kind == F.KIND_NONE and "optimum-intel does not export model_type 'weird'" in info.reason

    bert = _copy(tiny_qwen3_hf, tmp_path / "bert")
    _edit_config(bert, architectures=["BertForMaskedLM"], model_type="bert")
    info = F.inspect_hf_folder(bert)
    assert info.kind == F.KIND_NONE and "BertForMaskedLM" in info.reason and "causal LM" in info.reason

    eagle = _copy(tiny_qwen3_hf, tmp_path / "eagle")
    _edit_config(eagle, architectures=["LlamaForCausalLMEagle3"])
    info = F.inspect_hf_folder(eagle)
    assert info.kind == F.KIND_NONE and "draft architecture LlamaForCausalLMEagle3" in info.reason


def test_folders_that_are_not_hf_checkpoints(tmp_path: Path, tiny_qwen3_hf: Path) -> None:
    assert "does not exist" in F.inspect_hf_folder(tmp_path / "nope").reason
    empty = tmp_path / "empty"
    empty.mkdir()
    info = F.inspect_hf_folder(empty)
    assert info.kind == F.KIND_NONE and "No config.json" in info.reason
    assert "not a Hugging Face model folder" in info.reason

    f = tmp_path / "file.txt"
    f.write_text("x")
    assert "is a file" in F.inspect_hf_folder(f).reason

    cache = tmp_path / "models--Org--Tiny"
    _copy(tiny_qwen3_hf, cache / "snapshots" / ("a" * 40))
    info = F.inspect_hf_folder(cache)
    assert info.kind == F.KIND_NONE and "Hugging Face cache" in info.reason and "snapshots" in info.reason
    snap = F.inspect_hf_folder(cache / "snapshots" / ("a" * 40))
    assert snap.kind == F.KIND_TARGET and F.source_name(snap.path) == "Tiny"

    parent = tmp_path / "parent"
    _copy(tiny_qwen3_hf, parent / "Tiny-Qwen3")
    assert "Tiny-Qwen3" in F.inspect_hf_folder(parent).reason

    gguf = tmp_path / "gguf"
    gguf.mkdir()
    (gguf / "model-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert "GGUF" in F.inspect_hf_folder(gguf).reason

    no_cfg = _copy(tiny_qwen3_hf, tmp_path / "no-cfg")
    (no_cfg / "config.json").unlink()
    assert "config.json is missing" in F.inspect_hf_folder(no_cfg).reason

    bad = _copy(tiny_qwen3_hf, tmp_path / "bad-json")
    (bad / "config.json").write_text("{ not json")
    assert "cannot be read" in F.inspect_hf_folder(bad).reason


def test_openvino_folders_are_already_exported(tiny_qwen3_target: Path, tiny_qwen3_drafts: dict) -> None:
    t = F.inspect_hf_folder(tiny_qwen3_target)
    assert t.kind == F.KIND_OPENVINO_TARGET and t.model_kind == "target" and not t.usable
    assert "already exported" in t.reason and "Add it directly" in t.reason
    d = F.inspect_hf_folder(tiny_qwen3_drafts["b8_trained"])
    assert d.kind == F.KIND_OPENVINO_DRAFT and d.model_kind == "draft" and d.variant == "dflash_v1"
    assert "already exported" in d.reason


# ---- drafts -------------------------------------------------------------------------------------
def test_dflash_v1_checkpoint(tiny_qwen3_drafts: dict) -> None:
    info = F.inspect_hf_folder(Path(f"{tiny_qwen3_drafts['b8_trained']}-ckpt"))
    assert info.kind == F.KIND_DRAFT and info.model_kind == "draft", info.reason
    assert (info.variant, info.head_type, info.block_size, info.draft_tokens) == ("dflash_v1", "none", 8, 7)
    assert (info.target_layer_ids, info.mask_token_id, info.vocab_size, info.hidden_size) == ([1, 2], 3, 768, 64)
    assert info.title == "DFlash v1 draft"


@pytest.mark.parametrize("name, variant, head, title, tokens", [
    ("dspark_vanilla", "dspark", "vanilla", "DSpark draft with a vanilla Markov head", 7),
    ("dspark_gated", "dspark", "gated", "DSpark draft with a gated Markov head", 6),
    ("dspark_nohead", "dspark", "none", "DSpark draft without a Markov head", 5),
    ("dflash2", "dflash_v2", "selector", "DFlash v2 draft", 7),
])
def test_variant_checkpoints(variant_ckpts: dict, name, variant, head, title, tokens) -> None:
    info = F.inspect_hf_folder(variant_ckpts[name])
    assert info.kind == F.KIND_DRAFT, info.reason
    assert (info.variant, info.head_type, info.draft_tokens) == (variant, head, tokens)
    assert info.title.startswith(title)
    assert info.mask_token_id == 3 and info.hidden_size == 64


def test_variant_head_problems(variant_ckpts: dict, tmp_path: Path) -> None:
    # a head configured but not in the weights
    lying = _copy(variant_ckpts["dspark_nohead"], tmp_path / "lying")
    _edit_config(lying, markov_rank=16, markov_head_type="vanilla")
    info = F.inspect_hf_folder(lying)
    assert info.kind == F.KIND_NONE and "vanilla Markov head" in info.reason
    assert "markov_head.markov_w1.weight" in info.reason

    rnn = _copy(variant_ckpts["dspark_vanilla"], tmp_path / "rnn")
    _edit_config(rnn, markov_head_type="rnn")
    assert "rnn Markov head" in F.inspect_hf_folder(rnn).reason

    no_selector = _copy(variant_ckpts["dspark_nohead"], tmp_path / "v2-without-selector")
    cfg = json.loads((variant_ckpts["dflash2"] / "config.json").read_text())
    (no_selector / "config.json").write_text(json.dumps(cfg))
    info = F.inspect_hf_folder(no_selector)
    assert info.kind == F.KIND_NONE and "candidate_selector" in info.reason

    no_weights = _copy(variant_ckpts["dflash2"], tmp_path / "v2-no-weights")
    (no_weights / "model.safetensors").unlink()
    assert "no *.safetensors weights" in F.inspect_hf_folder(no_weights).reason

    short = _copy(variant_ckpts["dflash2"], tmp_path / "v2-short-config")
    cfg = json.loads((short / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    (short / "config.json").write_text(json.dumps(cfg))
    assert "lacks dflash_config.mask_token_id" in F.inspect_hf_folder(short).reason


def test_weights_that_do_not_match_the_config(tiny_qwen3_drafts: dict, tmp_path: Path) -> None:
    other = _copy(Path(f"{tiny_qwen3_drafts['b8_random']}-ckpt"), tmp_path / "other")  # taps [0, 1, 2]
    _edit_config(other, dflash_config={"mask_token_id": 3, "target_layer_ids": [1, 2]})
    info = F.inspect_hf_folder(other)
    assert info.kind == F.KIND_NONE and "fc.weight is [64, 192]" in info.reason


# ---- the pre-export check against a target ------------------------------------------------------
def test_matching_draft_fits(tiny_qwen3_drafts: dict, tiny_qwen3_target: Path) -> None:
    info = F.inspect_hf_folder(Path(f"{tiny_qwen3_drafts['b8_trained']}-ckpt"))
    check = F.check_hf_draft(info, tiny_qwen3_target)
    assert check.fits and check.checked and check.reasons == []
    assert any("no tokenizer of its own" in n for n in check.notes)


def test_mismatched_drafts_say_why(tiny_qwen3_hf: Path, tiny_qwen3_target: Path, tmp_path: Path) -> None:
    tcfg = _target_config(tiny_qwen3_hf)
    narrow = F.inspect_hf_folder(build_v1_ckpt(tcfg, tmp_path / "narrow", hidden_size=32, num_attention_heads=2))
    check = F.check_hf_draft(narrow, tiny_qwen3_target)
    assert len(check.reasons) == 1 and check.reasons[0].startswith("Hidden size: the draft takes embeddings of width 32")

    deep = build_v1_ckpt({**tcfg, "num_hidden_layers": 12}, tmp_path / "deep", layer_ids=(2, 9))
    check = F.check_hf_draft(F.inspect_hf_folder(deep), tiny_qwen3_target)
    assert len(check.reasons) == 1 and "Layer ids: the draft taps target layers [9]" in check.reasons[0]
    assert "0..2" in check.reasons[0]

    other_vocab = build_v1_ckpt(tcfg, tmp_path / "vocab", vocab_size=1024)
    check = F.check_hf_draft(F.inspect_hf_folder(other_vocab), tiny_qwen3_target)
    assert len(check.reasons) == 1 and check.reasons[0].startswith("Vocabulary: the draft was built for 1024 tokens")

    bad_mask = _copy(other_vocab, tmp_path / "mask")
    _edit_config(bad_mask, vocab_size=768, dflash_config={"mask_token_id": 900, "target_layer_ids": [1, 2]})
    check = F.check_hf_draft(F.inspect_hf_folder(bad_mask), tiny_qwen3_target)
    assert len(check.reasons) == 1 and "mask_token_id 900 is outside the target's 768 tokens" in check.reasons[0]

    shallower = build_v1_ckpt({**tcfg, "num_hidden_layers": 6}, tmp_path / "shallower")
    check = F.check_hf_draft(F.inspect_hf_folder(shallower), tiny_qwen3_target)
    assert check.fits and any("trained for a 6-layer target" in n for n in check.notes)


def test_tokenizers_are_compared_when_the_draft_has_one(tiny_qwen3_drafts: dict, tiny_qwen3_target: Path,
                                                          tiny_qwen3_hf: Path, tmp_path: Path) -> None:
    same = _copy(Path(f"{tiny_qwen3_drafts['b8_trained']}-ckpt"), tmp_path / "same")
    shutil.copy(tiny_qwen3_hf / "tokenizer.json", same / "tokenizer.json")
    check = F.check_hf_draft(F.inspect_hf_folder(same), tiny_qwen3_target)
    assert check.fits and any("same vocabulary" in n or "is the target's" in n for n in check.notes)

    other = _copy(same, tmp_path / "other")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    check = F.check_hf_draft(F.inspect_hf_folder(other), tiny_qwen3_target)
    assert len(check.reasons) == 1 and check.reasons[0].startswith("Tokenizer: the draft's tokenizer.json differs")
    assert "2 token ids" in check.reasons[0]


def test_unreadable_target_is_a_note_not_a_refusal(tiny_qwen3_drafts: dict, tmp_path: Path) -> None:
    info = F.inspect_hf_folder(Path(f"{tiny_qwen3_drafts['b8_trained']}-ckpt"))
    check = F.check_hf_draft(info, tmp_path / "missing-target")
    assert check.fits and not check.checked and "No usable target" in check.notes[0]


def test_the_engine_refuses_what_the_pre_check_refuses(tiny_qwen3_hf: Path, tiny_qwen3_target: Path,
                                                       tmp_path: Path) -> None:
    """The pre-export reason and check_draft_fits' reason on the exported folder name the same check."""
    from engine.export.draft import export_draft
    from engine.models.draft import check_draft_fits

    tcfg = _target_config(tiny_qwen3_hf)
    ckpt = build_v1_ckpt(tcfg, tmp_path / "narrow", hidden_size=32, num_attention_heads=2)
    pre = F.check_hf_draft(F.inspect_hf_folder(ckpt), tiny_qwen3_target).reasons
    post = check_draft_fits(tiny_qwen3_target, export_draft(ckpt, tmp_path / "narrow-ov"))
    assert pre and post
    assert {r.split(":")[0] for r in pre} <= {r.split(":")[0] for r in post}
    assert pre[0].split(".")[0] == post[0].split(".")[0]  # "Hidden size: the draft takes embeddings of width 32, ..."


# ---- names shared with the exporters (which import torch) ----------------------------------------
def test_constants_match_the_exporters() -> None:
    from engine.drafts import dflash2, dflash_v1, dspark
    from engine.export import draft, target

    assert F.DRAFT_ARCHS == {dflash_v1.DFLASH_V1_ARCH: draft.VARIANT_DFLASH_V1, dspark.DSPARK_ARCH: draft.VARIANT_DSPARK,
                             dflash2.DFLASH2_ARCH: draft.VARIANT_DFLASH_V2}
    assert set(F.DRAFT_WEIGHT_FORMATS) == set(draft.WEIGHT_FORMATS)
    assert set(F.TARGET_WEIGHT_FORMATS) == set(target.WEIGHT_FORMATS)
    for n_target in (4, 28, 36):
        for n_draft in (1, 2, 5):
            assert F.default_target_layer_ids(n_target, n_draft) == dflash_v1.default_target_layer_ids(n_target, n_draft)


def test_optimum_list_matches_the_installed_optimum() -> None:
    pytest.importorskip("optimum.intel")
    from optimum.exporters.tasks import TasksManager
    import optimum.exporters.openvino.model_configs  # noqa: F401  (registers the OpenVINO configs)

    live = set()
    for mt in TasksManager._SUPPORTED_MODEL_TYPE:
        try:
            tasks = TasksManager.get_supported_tasks_for_model_type(mt, exporter="openvino", library_name="transformers")
        except Exception:  # noqa: BLE001 - types without an OpenVINO config
            continue
        if "text-generation-with-past" in tasks:
            live.add(mt)
    assert live == set(F.OPTIMUM_TEXT_GENERATION_TYPES)


def test_inspecting_imports_neither_torch_nor_optimum(tiny_qwen3_hf: Path, tiny_qwen3_drafts: dict,
                                                      tiny_qwen3_target: Path) -> None:
    code = (
        "import sys; from engine import inspect_folder as F\n"
        f"t = F.inspect_hf_folder({str(tiny_qwen3_hf)!r}); assert t.kind == 'target', t.reason\n"
        f"d = F.inspect_hf_folder({str(tiny_qwen3_drafts['b8_trained']) + '-ckpt'!r}); assert d.kind == 'draft'\n"
        f"assert F.check_hf_draft(d, {str(tiny_qwen3_target)!r}).fits\n"
        "heavy = [m for m in ('torch', 'transformers', 'optimum', 'nncf') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# ---- destinations and leftovers -----------------------------------------------------------------
def test_destinations_never_overwrite(tiny_qwen3_hf: Path, tmp_path: Path) -> None:
    info = F.inspect_hf_folder(tiny_qwen3_hf)
    models, drafts = tmp_path / "models", tmp_path / "models" / "drafts"
    first = F.suggest_destination(info, "int8", models, drafts)
    name = tiny_qwen3_hf.parent.name  # ".../tiny-qwen3<n>/hf" is named after its parent
    assert first == models / f"{name}-ov-int8"
    first.mkdir(parents=True)
    second = F.suggest_destination(info, "int8", models, drafts)
    assert second == models / f"{name}-ov-int8-2"
    (models / f".{name}-ov-int8-2.partial-1234").mkdir()
    assert F.suggest_destination(info, "int8", models, drafts) == models / f"{name}-ov-int8-3"
    draft = F.FolderInfo(path=tmp_path / "Qwen3-8B-DFlash-b16", kind=F.KIND_DRAFT)
    assert F.suggest_destination(draft, "fp16", models, drafts) == drafts / "Qwen3-8B-DFlash-b16-fp16"

    assert "already exists" in F.destination_problem(first, tiny_qwen3_hf)
    assert "inside the folder being imported" in F.destination_problem(tiny_qwen3_hf / "ov", tiny_qwen3_hf)
    assert F.destination_problem(models / "new" / "deeper", tiny_qwen3_hf) is None


def test_leftovers_are_found_and_removed(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    partial = tmp_path / ".m.partial-abcd1234"
    partial.mkdir()
    (partial / "openvino_model.bin").write_bytes(b"x")
    other = tmp_path / ".mm.partial-1"
    other.mkdir()
    assert F.leftovers(dest) == [partial]
    assert F.remove_export_leftovers(dest, remove_dest=False) == [partial]
    assert not partial.exists() and other.exists()
    dest.mkdir()
    F.remove_export_leftovers(dest, remove_dest=True)
    assert not dest.exists()
