"""`prepare` never deletes what a person made in the folders it builds (issue 20).

The shipped drafts are stood in for by a tiny real checkpoint (exported for real, checked against
the tiny target for real): a draft_vocabulary.json written with `draft-vocab` stays through
repeated prepares and a re-export of a changed checkpoint; any other change moves the folder
aside, and prepare says so.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine import prepare
from engine.cli import main
from engine.models.draft_vocab import VOCAB_FILE
from engine.markers import MARKER, folder_changes, is_prepared, set_aside_user_work, write_marker


@pytest.fixture(scope="module")
def checkpoint(tiny_qwen3_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DFlash v1 draft checkpoint (config.json + model.safetensors), as resources/drafts holds them."""
    from fixtures import tiny_drafts

    root = tmp_path_factory.mktemp("user-files-draft")
    specs = tuple(s for s in tiny_drafts.DRAFT_SPECS if s.name == "b4_random")
    tiny_drafts.build_drafts(tiny_qwen3_hf, root, specs)
    return root / "b4_random-ckpt"


@pytest.fixture
def shipped(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """resources/drafts with the one tiny draft, and a fresh data folder."""
    res = tmp_path / "resources-drafts"
    shutil.copytree(checkpoint, res / "smollm2-tiny-b4")  # the embedded target's drafts go by this prefix
    monkeypatch.setattr(prepare, "SHIPPED_DRAFTS", res)
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path / "data"))
    return res / "smollm2-tiny-b4"


def _answers(path: Path, rows: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"answer": r}) + "\n" for r in rows))
    return path


def test_draft_vocab_survives_prepare_and_a_reexport(shipped, tiny_qwen3_target, tmp_path, capfd) -> None:
    notices: list[str] = []
    [dest] = prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append)
    assert is_prepared(dest) and not notices
    bin_time = (dest / "openvino_model.bin").stat().st_mtime_ns

    # The person makes a sub-vocabulary in the prepared folder, as the README says.
    capfd.readouterr()  # (the export's own output)
    rows = [[5, 6, 7, 8, 9, 10, 11, 12]] * 3 + [[20, 21]]
    assert main(["draft-vocab", "--draft", str(dest), "--answers", str(_answers(tmp_path / "a.jsonl", rows)),
                 "--size", "8"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("8 ids, coverage") and "prepare` keeps it" in err
    theirs = (dest / VOCAB_FILE).read_bytes()
    assert is_prepared(dest), "the folder stays prepared with the person's file in it"

    # prepare again: nothing re-exported, their file as they left it.
    assert prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append) == [dest]
    assert (dest / VOCAB_FILE).read_bytes() == theirs and not notices
    assert (dest / "openvino_model.bin").stat().st_mtime_ns == bin_time

    # A changed shipped checkpoint is exported again; their vocabulary goes into the new export.
    cfg = json.loads((shipped / "config.json").read_text())
    (shipped / "config.json").write_text(json.dumps({**cfg, "note": "retrained"}))
    assert prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append) == [dest]
    assert (dest / "openvino_model.bin").stat().st_mtime_ns != bin_time, "re-exported"
    assert (dest / VOCAB_FILE).read_bytes() == theirs and is_prepared(dest)
    assert any("Kept your draft_vocabulary.json" in n for n in notices), notices


def test_a_vocabulary_edited_by_hand_is_kept_and_recorded(shipped, tiny_qwen3_target) -> None:
    import numpy as np

    from engine.models.draft_vocab import write_draft_vocabulary

    [dest] = prepare.prepare_drafts(tiny_qwen3_target)
    counts = np.zeros(json.loads((dest / "config.json").read_text())["vocab_size"], np.int64)
    counts[[3, 4, 5]] = [9, 8, 7]
    write_draft_vocabulary(dest, counts, size=3)  # not through the CLI: the marker does not know it
    theirs = (dest / VOCAB_FILE).read_bytes()
    notices: list[str] = []
    assert prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append) == [dest]
    assert (dest / VOCAB_FILE).read_bytes() == theirs
    assert len(notices) == 1 and "Kept your draft_vocabulary.json" in notices[0]
    assert json.loads((dest / MARKER).read_text())["user_files"] == [VOCAB_FILE]
    notices.clear()
    prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append)
    assert not notices, "said once, then recorded"


def test_other_changes_move_the_folder_aside(shipped, tiny_qwen3_target) -> None:
    [dest] = prepare.prepare_drafts(tiny_qwen3_target)
    xml = (dest / "openvino_model.xml").read_text()
    (dest / "openvino_model.xml").write_text(xml.replace("<net ", "<net edited='1' ", 1))
    (dest / "notes.txt").write_text("my notes")
    notices: list[str] = []
    assert prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append) == [dest]
    assert is_prepared(dest) and not (dest / "notes.txt").exists()
    [aside] = [p for p in dest.parent.iterdir() if p.name.startswith(f"{dest.name}.yours-")]
    assert (aside / "notes.txt").read_text() == "my notes" and "edited='1'" in (aside / "openvino_model.xml").read_text()
    assert len(notices) == 1 and str(aside) in notices[0] and "openvino_model.xml" in notices[0]


def test_an_added_file_alone_does_not_rebuild(shipped, tiny_qwen3_target) -> None:
    [dest] = prepare.prepare_drafts(tiny_qwen3_target)
    bin_time = (dest / "openvino_model.bin").stat().st_mtime_ns
    (dest / "notes.txt").write_text("my notes")
    notices: list[str] = []
    assert prepare.prepare_drafts(tiny_qwen3_target, notice=notices.append) == [dest]
    assert (dest / "notes.txt").read_text() == "my notes" and not notices
    assert (dest / "openvino_model.bin").stat().st_mtime_ns == bin_time


def test_a_vocabulary_that_does_not_fit_the_new_export_is_saved_aside(shipped, tiny_qwen3_target) -> None:
    [dest] = prepare.prepare_drafts(tiny_qwen3_target)
    bad = json.dumps({"ids": [1, 2, 10 ** 7]})  # an id the target's vocabulary does not have
    (dest / VOCAB_FILE).write_text(bad)
    notices: list[str] = []
    prepare.prepare_drafts(tiny_qwen3_target, force=True, notice=notices.append)
    assert is_prepared(dest) and not (dest / VOCAB_FILE).exists()  # the tiny checkpoint ships none
    [aside] = [p for p in dest.parent.iterdir() if p.name.startswith(f"{dest.name}.yours-")]
    assert (aside / VOCAB_FILE).read_text() == bad
    assert any("does not fit" in n and str(aside / VOCAB_FILE) in n for n in notices), notices


def test_set_aside_keeps_changed_and_added_files(tmp_path: Path) -> None:
    folder = tmp_path / "SmolLM2-135M-Instruct-ov"
    folder.mkdir()
    (folder / "openvino_model.xml").write_text("<net/>")
    (folder / "config.json").write_text("{}")
    write_marker(folder)
    notices: list[str] = []
    assert set_aside_user_work(folder, notices.append) == {} and folder.is_dir() and not notices, "nothing of theirs"
    (folder / "config.json").write_text('{"edited": true}')
    assert folder_changes(folder).changed == ["config.json"]
    set_aside_user_work(folder, notices.append)
    [aside] = list(tmp_path.glob("SmolLM2-135M-Instruct-ov.yours-*"))
    assert not folder.exists() and json.loads((aside / "config.json").read_text()) == {"edited": True}
    assert str(aside) in notices[0]
    prepare._clean_stale_staging(tmp_path, older_than_s=-1)
    assert aside.is_dir(), "not taken for a stale staging folder"


def test_a_partial_build_has_nothing_of_theirs(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "openvino_model.xml").write_text("<net/>")  # no marker: a build of ours that did not finish
    assert folder_changes(folder) is None
    assert set_aside_user_work(folder, lambda m: pytest.fail(m)) == {} and folder.is_dir()


def test_a_catalogue_models_weight_format_reexports_and_keeps_the_persons_vocabulary(shipped, tiny_qwen3_target,
                                                                                     tmp_path, capfd) -> None:
    """A draft prepared as int8 and asked for as int4 (engine.catalog's draft_weight_format) is exported again,
    says so in its marker and config.json, and a draft_vocabulary.json the person made comes through."""
    [dest] = prepare.prepare_drafts(tiny_qwen3_target)
    capfd.readouterr()
    assert main(["draft-vocab", "--draft", str(dest), "--answers",
                 str(_answers(tmp_path / "a.jsonl", [[5, 6, 7, 8, 9, 10, 11, 12]] * 3)), "--size", "8"]) == 0
    mine = (dest / VOCAB_FILE).read_bytes()
    assert prepare.prepare_drafts(tiny_qwen3_target, weight_format="int4") == [dest]
    assert json.loads((dest / MARKER).read_text())["weight_format"] == "int4"
    assert json.loads((dest / "config.json").read_text())["lm_head_bits"] == 4
    assert (dest / VOCAB_FILE).read_bytes() == mine
    bin_time = (dest / "openvino_model.bin").stat().st_mtime_ns
    assert prepare.prepare_drafts(tiny_qwen3_target, weight_format="int4") == [dest]  # reused, not exported again
    assert (dest / "openvino_model.bin").stat().st_mtime_ns == bin_time
