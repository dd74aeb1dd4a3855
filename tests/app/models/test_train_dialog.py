"""File → Train a draft…: with a GPU it runs train-draft as a child process (a fake one here: a script that
talks like it) with progress, log and cancel, and hands the folder to the draft picker; without one it
shows the command to run elsewhere."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from app.models.train_dialog import TrainDialog


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for `python -m engine.cli train-draft ...` (args in $@)."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.fixture
def dialogs(qtbot):
    made: list[TrainDialog] = []

    def make(**kw) -> TrainDialog:
        d = TrainDialog(probe=False, **kw)
        qtbot.addWidget(d)
        made.append(d)
        return d

    yield make
    for d in made:
        d.cancel()


def test_without_a_gpu_it_shows_the_command_to_run_elsewhere(dialogs, tmp_path: Path) -> None:
    dlg = dialogs(target="smollm2", out_root=tmp_path)
    dlg.set_gpu(False)
    assert dlg.state == "no-gpu" and "No GPU" in dlg.status.text()
    assert not dlg.start_button.isEnabled()
    cmd = dlg.command_view.text()
    assert "-m engine.cli train-draft --target smollm2 --variant dspark --out" in cmd
    dlg.steps_spin.setValue(200)
    assert "--steps 200" in dlg.command_view.text()
    dlg.cpu_check.setChecked(True)  # a small try on the CPU stays possible
    assert dlg.start_button.isEnabled() and "--device cpu" in dlg.command_view.text()


def test_with_a_gpu_it_trains_and_hands_the_draft_over(dialogs, qtbot, tmp_path: Path) -> None:
    folder = tmp_path / "run" / "openvino"
    folder.mkdir(parents=True)
    (folder / "openvino_model.xml").write_text("<net/>")
    python = _fake_python(tmp_path, f"""echo "$@" > {tmp_path}/args
echo "train-draft: dspark draft for x" >&2
for i in 1 2 3 4; do echo "[ 1.0s] step $i/4: loss 2.0" >&2; done
echo {folder}
""")
    dlg = dialogs(target="/models/qwen", out_root=tmp_path, python=python)
    dlg.set_gpu(True)
    assert dlg.start_button.isEnabled()
    with qtbot.waitSignal(dlg.trained, timeout=10000) as got:
        dlg.start_button.click()
    assert got.args == [str(folder)] and dlg.state == "done"
    assert dlg.progress.maximum() == 4 and dlg.progress.value() == 4
    assert "step 4/4" in dlg.log.toPlainText()
    args = (tmp_path / "args").read_text()
    assert args.startswith("-m engine.cli train-draft --target /models/qwen --variant dspark --out")


def test_a_failed_run_says_so_and_hands_nothing_over(dialogs, qtbot, tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "dflash-studio: /models/x has no chat template" >&2\nexit 2\n')
    dlg = dialogs(target="/models/x", out_root=tmp_path, python=python)
    dlg.set_gpu(True)
    seen: list[str] = []
    dlg.trained.connect(seen.append)
    with qtbot.waitSignal(dlg.state_changed, timeout=10000, check_params_cb=lambda s: s == "failed"):
        dlg.start()
    assert not seen and "failed" in dlg.status.text() and "no chat template" in dlg.log.toPlainText()


def test_cancel_stops_the_run(dialogs, qtbot, tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "step 1/100" >&2\nsleep 30\n')
    dlg = dialogs(out_root=tmp_path, python=python)
    dlg.set_gpu(True)
    dlg.start()
    qtbot.waitUntil(lambda: "step 1/100" in dlg.log.toPlainText(), timeout=10000)
    assert dlg.close_button.text() == "Cancel"
    dlg.close_button.click()
    assert dlg.state == "cancelled" and dlg.proc.state().name == "NotRunning"
    assert "--resume" in dlg.status.text()


def test_the_action_sits_beside_import_and_a_trained_draft_becomes_the_draft(make_window, qtbot, tmp_path) -> None:
    from app.models.train_dialog import open_train_dialog

    w = make_window(load=False)
    file_menu = next(a.menu() for a in w.menuBar().actions() if a.text().replace("&", "") == "File")
    names = [a.objectName() for a in file_menu.actions()]
    assert names.index("actTrainDraft") == names.index("actImportHF") + 1
    dlg = open_train_dialog(w)
    dlg.probe.kill()
    folder = tmp_path / "ov"
    folder.mkdir()
    dlg.trained.emit(str(folder))
    assert w.model_panel.draft_dir() == str(folder)
    dlg.reject()
