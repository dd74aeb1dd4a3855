"""The target picker's catalogue models (fake engine): listed with "Prepare — N MB download" until
prepared, prepared through the prepare dialog (progress, cancel), then loaded; removed again."""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtWidgets import QMessageBox

from app.models import catalog_actions
from app.models.pickers import ModelPanel
from engine.catalog import QWEN_CODER
from engine.markers import write_marker

# What `prepare --model NAME` leaves, written by a stand-in command (argv ends with --model NAME).
FAKE_PREPARE = """\
import sys
from engine import catalog
from engine.markers import write_marker
entry = catalog.get(sys.argv[sys.argv.index('--model') + 1])
target = entry.target_dir()
target.mkdir(parents=True)
(target / 'openvino_model.xml').write_text('<net/>')
print('Joining part 1/6', flush=True)
write_marker(target, extra={'weight_format': 'int8'})
print(target)
"""


def _index(panel: ModelPanel, path: Path) -> int:
    return next(i for i in range(panel.target_combo.count()) if panel.target_combo.itemData(i) == str(path))


def _prepared_qwen() -> Path:
    target = QWEN_CODER.target_dir()
    target.mkdir(parents=True)
    (target / "openvino_model.xml").write_text("<net/>")
    write_marker(target, extra={"weight_format": "int8"})
    return target


def test_an_unprepared_catalogue_model_is_listed_with_its_download(qtbot, settings, fake_devices) -> None:
    panel = ModelPanel(settings, devices=fake_devices, validator=lambda t, d: [])
    qtbot.addWidget(panel)
    panel.show()
    i = _index(panel, QWEN_CODER.target_dir())
    assert panel.target_combo.itemText(i) == "Qwen2.5-Coder-0.5B-Instruct — Prepare — 478 MB download"
    panel.target_combo.setCurrentIndex(i)
    assert "not prepared yet" in panel.target_note.text() and "478 MB" in panel.target_note.text()
    assert panel.prepare_button.isVisibleTo(panel) and panel.prepare_button.text() == "Prepare Qwen2.5-Coder-0.5B-Instruct…"
    assert not panel.remove_button.isVisibleTo(panel) and not panel.load_button.isEnabled()
    with qtbot.waitSignal(panel.prepare_model_requested) as got:
        panel.prepare_button.click()
    assert got.args == ["qwen2.5-coder-0.5b"]
    panel.target_combo.setCurrentIndex(0)  # the embedded default: its own prepare button again
    assert panel.prepare_button.text() == "Prepare the default model…"
    with qtbot.waitSignal(panel.prepare_requested):
        panel.prepare_button.click()


def test_prepare_from_the_picker_then_loads_it(make_window, qtbot) -> None:
    w = make_window(load=False, prepare_command=(sys.executable, ["-c", FAKE_PREPARE]))
    panel = w.model_panel
    panel.target_combo.setCurrentIndex(_index(panel, QWEN_CODER.target_dir()))
    with qtbot.waitSignal(w.controller.loaded, timeout=15000):
        panel.prepare_button.click()
        dlg = w._prepare_dialog
        assert dlg is not None and "--model qwen2.5-coder-0.5b" in dlg.cmd_label.text()
        qtbot.waitUntil(lambda: dlg.exit_code is not None, timeout=15000)
    assert dlg.exit_code == 0 and "Qwen2.5-Coder-0.5B-Instruct is ready" in dlg.info.text()
    assert "Joining part 1/6" in dlg.log.toPlainText()
    assert w.engine_info is not None and w.engine_info.target_dir == str(QWEN_CODER.target_dir())
    assert panel.target_combo.currentText() == "Qwen2.5-Coder-0.5B-Instruct"
    assert panel.remove_button.isVisibleTo(panel)


def test_cancel_stops_the_preparation(make_window, qtbot) -> None:
    slow = "import time\nprint('fetching', flush=True)\ntime.sleep(60)\n"
    w = make_window(load=False, prepare_command=(sys.executable, ["-c", slow]))
    dlg = catalog_actions.prepare_catalog_model(w, "qwen2.5-coder-0.5b")
    qtbot.waitUntil(lambda: "fetching" in dlg.log.toPlainText(), timeout=10000)
    dlg.reject()
    assert dlg.proc.state() == dlg.proc.ProcessState.NotRunning
    qtbot.waitUntil(lambda: w._prepare_dialog is None, timeout=5000)
    assert w.engine_info is None and not QWEN_CODER.is_prepared()


def test_remove_a_prepared_model(make_window, qtbot, monkeypatch) -> None:
    target = _prepared_qwen()
    w = make_window(load=False)
    panel = w.model_panel
    panel.refresh_targets()
    panel.set_target(str(target))
    assert panel.target_combo.currentText() == "Qwen2.5-Coder-0.5B-Instruct" and panel.remove_button.isVisibleTo(panel)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.No)
    panel.remove_button.click()
    assert target.is_dir(), "kept when the person says no"
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    panel.remove_button.click()
    assert not target.exists() and "Removed Qwen2.5-Coder-0.5B-Instruct" in w.state_label.text()
    assert panel.target_combo.currentText().endswith("Prepare — 478 MB download")
    assert panel.prepare_button.isVisibleTo(panel) and not panel.remove_button.isVisibleTo(panel)


def test_a_loaded_model_is_not_removed(make_window, qtbot, monkeypatch) -> None:
    target = _prepared_qwen()
    w = make_window(load=False)
    w.model_panel.refresh_targets()
    w.model_panel.set_target(str(target))
    w.model_panel.set_draft(None)
    with qtbot.waitSignal(w.controller.loaded, timeout=5000):
        w.model_panel.load_button.click()
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    assert not catalog_actions.remove_catalog_model(w, "qwen2.5-coder-0.5b")
    assert target.is_dir() and w.error_banner.isVisible() and "is loaded" in w.error_banner.label.text()
