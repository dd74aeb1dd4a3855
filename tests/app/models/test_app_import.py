"""The import dialog: a Hugging Face folder in, a usable OpenVINO model in the lists out, or a reason.

Exports run for real (`python -m engine.cli export` in a QProcess) on the tiny fixtures.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QProcess

from app.models.import_dialog import (STATE_CANCELLED, STATE_DONE, STATE_FAILED, STATE_RUNNING,
                                      ImportDialog)
from engine import inspect_folder as F
from engine import paths

EXPORT_TIMEOUT_MS = 240_000
PROMPT = "def parse(text):\n    "  # a prompt the trained draft was distilled on


@pytest.fixture
def dialogs(qtbot):
    """Make import dialogs; after the test none may still have its export process running."""
    made: list[ImportDialog] = []

    def make(**kw) -> ImportDialog:
        dlg = ImportDialog(**kw)
        qtbot.addWidget(dlg)
        dlg.show()
        made.append(dlg)
        return dlg

    yield make
    for dlg in made:
        assert dlg.proc.state() == QProcess.ProcessState.NotRunning, "an export process outlived its test"
        assert not dlg.ticker.isActive()
        dlg.close()


def model_files() -> list[Path]:
    """Every file and non-empty folder under the user data folder's models/ (drafts/ is always made)."""
    root = paths.models_dir()
    return sorted(p for p in root.rglob("*") if p.is_file() or (p.is_dir() and p != paths.default_drafts_dir()))


def ckpt(drafts: dict, name: str) -> Path:
    return Path(f"{drafts[name]}-ckpt")


def test_importing_a_draft_checkpoint_gives_a_usable_draft(dialogs, qtbot, tiny_qwen3_drafts, tiny_qwen3_target):
    from engine.config import GenerationConfig
    from engine.models.draft import check_draft_fits, read_draft_info
    from engine.pipeline import SpeculativePipeline

    dlg = dialogs(target_dir=str(tiny_qwen3_target), folder=str(ckpt(tiny_qwen3_drafts, "b8_trained")))
    assert dlg.info.kind == F.KIND_DRAFT
    assert "draft checkpoint" in dlg.title_label.text()
    assert "✓ It fits" in dlg.fit_label.text()
    assert dlg.weight_format() == "int8"  # the default for drafts
    assert dlg.destination().parent == paths.default_drafts_dir()
    dlg.set_weight_format("fp32")
    assert dlg.destination().name.endswith("-fp32")
    assert dlg.export_button.isEnabled()
    with qtbot.waitSignal(dlg.imported, timeout=EXPORT_TIMEOUT_MS) as sig:
        dlg.export_button.click()
        assert dlg.state == STATE_RUNNING and not dlg.export_button.isEnabled()
        assert dlg.cancel_button.text() == "Cancel export"
    path, kind = sig.args
    assert kind == "draft" and Path(path) == dlg.destination() and dlg.state == STATE_DONE
    assert "is ready (exported in" in dlg.status_label.text() and "now in the draft list" in dlg.status_label.text()
    assert "engine.cli export --kind draft" in dlg.log.toPlainText()
    assert not F.leftovers(path)

    info = read_draft_info(Path(path))
    assert (info.variant, info.block_size, info.target_layer_ids) == ("dflash_v1", 8, [1, 2])
    assert check_draft_fits(tiny_qwen3_target, path) == []
    pipe = SpeculativePipeline.load(tiny_qwen3_target, path, precision="f32")
    result = pipe.generate(PROMPT, GenerationConfig(max_new_tokens=24), chat=False)
    assert len(result.token_ids) == 24
    assert result.metrics.tokens_per_step > 1.5  # the trained draft's candidates are accepted


def test_importing_a_target_folder_gives_a_loadable_target(dialogs, qtbot, tiny_qwen3_hf, tiny_qwen3_drafts):
    from engine.config import GenerationConfig
    from engine.models.draft import check_draft_fits
    from engine.models.target import check_target_dir
    from engine.pipeline import SpeculativePipeline

    dlg = dialogs(folder=str(tiny_qwen3_hf))
    assert dlg.info.kind == F.KIND_TARGET and not dlg.fit_box.isVisible()
    assert dlg.weight_format() == "int8"
    assert dlg.destination().parent == paths.models_dir()
    with qtbot.waitSignal(dlg.imported, timeout=EXPORT_TIMEOUT_MS) as sig:
        dlg.start_export()
    path, kind = sig.args
    assert kind == "target" and dlg.state == STATE_DONE
    check_target_dir(Path(path))
    assert json.loads((Path(path) / "dflash_export.json").read_text())["weight_format"] == "int8"
    assert check_draft_fits(path, tiny_qwen3_drafts["b8_trained"]) == []  # drafts can tap its layers
    pipe = SpeculativePipeline.load(path, tiny_qwen3_drafts["b8_trained"])
    assert len(pipe.generate(PROMPT, GenerationConfig(max_new_tokens=8), chat=False).token_ids) == 8


def test_a_wrong_folder_shows_its_reason_and_writes_nothing(dialogs, qtbot, tmp_path, tiny_tokenizer_dir,
                                                            tiny_qwen3_hf):
    dlg = dialogs(folder=str(tiny_tokenizer_dir))  # tokenizer files only
    assert dlg.info.kind == F.KIND_NONE
    assert "Nothing this app can import" in dlg.title_label.text()
    assert "No config.json" in dlg.reason_label.text() and dlg.reason_label.isVisible()
    assert not dlg.export_button.isEnabled() and not dlg.export_box.isVisible()
    assert "No config.json" in dlg.export_button.toolTip()

    no_weights = tmp_path / "no-weights"
    shutil.copytree(tiny_qwen3_hf, no_weights)
    (no_weights / "model.safetensors").unlink()
    dlg.set_folder(str(no_weights))
    assert "weights are missing" in dlg.reason_label.text()
    with qtbot.assertNotEmitted(dlg.imported, wait=200):
        dlg.start_export()  # refused: nothing starts
    assert dlg.proc.state() == QProcess.ProcessState.NotRunning
    assert model_files() == []


def test_an_already_exported_folder_is_added_directly(dialogs, qtbot, tiny_qwen3_target, tiny_qwen3_drafts):
    dlg = dialogs(target_dir=str(tiny_qwen3_target), folder=str(tiny_qwen3_drafts["b8_trained"]))
    assert dlg.info.kind == F.KIND_OPENVINO_DRAFT
    assert "already exported" in dlg.reason_label.text() and "Add it directly" in dlg.reason_label.text()
    assert dlg.export_button.text() == "Add to the list" and dlg.export_button.isEnabled()
    assert "✓ It fits" in dlg.fit_label.text()
    with qtbot.waitSignal(dlg.imported, timeout=5000) as sig:
        dlg.export_button.click()
    assert sig.args == [str(tiny_qwen3_drafts["b8_trained"]), "draft"]
    assert dlg.proc.state() == QProcess.ProcessState.NotRunning and model_files() == []


def test_a_mismatched_draft_shows_its_reason(dialogs, qtbot, tmp_path, tiny_qwen3_hf, tiny_qwen3_target):
    import torch

    from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint

    tcfg = json.loads((tiny_qwen3_hf / "config.json").read_text())
    cfg = random_draft_config({**tcfg, "hidden_size": 32, "num_attention_heads": 2}, 1, 8, [1, 2], 3)
    torch.manual_seed(0)
    folder = save_checkpoint(DFlashV1Draft(cfg), cfg, tmp_path / "narrow-draft")

    dlg = dialogs(target_dir=str(tiny_qwen3_target), folder=str(folder))
    assert dlg.info.kind == F.KIND_DRAFT  # a valid draft checkpoint ...
    text = dlg.fit_label.text()  # ... for another model size
    assert "does not fit the target" in text
    assert "Hidden size: the draft takes embeddings of width 32, the target's are 64 wide" in text
    assert dlg.fit_label.property("state") == "error"
    assert not dlg.export_button.isEnabled()
    assert "does not fit the target" in dlg.export_button.toolTip()
    assert dlg.anyway_check.isVisible()
    dlg.anyway_check.setChecked(True)  # the person may still import it (listed as not fitting)
    assert dlg.export_button.isEnabled()
    dlg.set_target(None)  # no target: nothing to check against, nothing refused
    assert dlg.export_button.isEnabled() and not dlg.anyway_check.isVisible()
    assert model_files() == []


@pytest.mark.parametrize("when", ["at once", "with a temp folder on disk"])
def test_a_cancelled_export_leaves_nothing_behind(dialogs, qtbot, when, tiny_qwen3_drafts, tiny_qwen3_target):
    dlg = dialogs(target_dir=str(tiny_qwen3_target), folder=str(ckpt(tiny_qwen3_drafts, "b8_trained")))
    dest = dlg.destination()
    with qtbot.assertNotEmitted(dlg.imported):
        dlg.start_export()
        assert dlg.is_running() or dlg.state == STATE_RUNNING
        if when != "at once":
            # the exporter's `.<name>.partial-*` sibling exists: kill it mid-write
            qtbot.waitUntil(lambda: bool(F.leftovers(dest)), timeout=EXPORT_TIMEOUT_MS)
        dlg.cancel_button.click()
        assert dlg.state == STATE_CANCELLED
    assert not dlg.is_running() and not dlg.ticker.isActive()
    assert not dest.exists() and F.leftovers(dest) == []
    assert model_files() == []
    assert "Export cancelled. Nothing was written" in dlg.status_label.text()
    assert dlg.cancel_button.text() == "Close" and dlg.export_button.isEnabled()  # may start again


def test_closing_the_dialog_cancels_the_export(qtbot, tiny_qwen3_hf):
    dlg = ImportDialog(folder=str(tiny_qwen3_hf))
    qtbot.addWidget(dlg)
    dlg.show()
    dest = dlg.destination()
    dlg.start_export()
    qtbot.waitUntil(lambda: "converting" in dlg.progress.format() or bool(F.leftovers(dest)), timeout=EXPORT_TIMEOUT_MS)
    dlg.reject()  # Esc / the window's close button
    assert dlg.proc.state() == QProcess.ProcessState.NotRunning
    assert not dest.exists() and F.leftovers(dest) == [] and model_files() == []


def test_a_failed_export_says_why_and_leaves_nothing(dialogs, qtbot, tmp_path, tiny_qwen3_drafts):
    broken = tmp_path / "broken-ckpt"
    shutil.copytree(ckpt(tiny_qwen3_drafts, "b8_trained"), broken)
    dlg = dialogs(folder=str(broken))
    assert dlg.info.kind == F.KIND_DRAFT
    # the weights lose a tensor after the folder was inspected: the exporter refuses them
    from safetensors.numpy import load_file, save_file

    state = load_file(str(broken / "model.safetensors"))
    del state["norm.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with qtbot.assertNotEmitted(dlg.imported):
        dlg.start_export()
        qtbot.waitUntil(lambda: dlg.state == STATE_FAILED, timeout=EXPORT_TIMEOUT_MS)
    assert "The export failed: " in dlg.status_label.text()
    assert "weights missing from the checkpoint: norm.weight" in dlg.status_label.text()
    assert "Nothing was written" in dlg.status_label.text()
    assert not dlg.destination().exists() and F.leftovers(dlg.destination()) == [] and model_files() == []


# ---- wiring into the main window -----------------------------------------------------------------
def test_file_menu_import_adds_to_the_lists(make_window, qtbot, tiny_qwen3_target, tiny_qwen3_drafts):
    from app import settings as S
    from app.models.import_action import ACTION_TEXT, add_imported_model, open_import_dialog

    w = make_window(load=False)
    act = w.act_import_hf  # MainWindow installs it (app.models.import_action.install_import_action)
    file_menu = w.menuBar().actions()[0].menu()
    assert act in file_menu.actions() and act.text() == ACTION_TEXT
    assert file_menu.actions().index(act) < file_menu.actions().index(w.act_prepare)

    w.model_panel.set_target(str(tiny_qwen3_target))
    act.trigger()
    dlg = w._import_dialog
    assert isinstance(dlg, ImportDialog) and dlg.isVisible()
    assert dlg.target_dir == str(tiny_qwen3_target)
    assert open_import_dialog(w) is dlg  # one at a time

    dlg.set_folder(str(tiny_qwen3_drafts["b16_random"]))  # already exported: added without a process
    with qtbot.waitSignal(dlg.imported, timeout=5000):
        dlg.export_button.click()
    assert w.model_panel.draft_dir() == str(tiny_qwen3_drafts["b16_random"])
    assert str(tiny_qwen3_drafts["b16_random"]) in S.get_list(w.settings, S.K_RECENT_DRAFTS)
    dlg.close()
    qtbot.waitUntil(lambda: w._import_dialog is None, timeout=2000)

    other = tiny_qwen3_target  # a target handed over the same way becomes the current target
    add_imported_model(w.model_panel, w.settings, str(other), "target")
    assert w.model_panel.target_dir() == str(other)
    assert S.get_list(w.settings, S.K_RECENT_TARGETS)[0] == str(other)
