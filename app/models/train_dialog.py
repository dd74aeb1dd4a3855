"""File → "Train a draft…": run `dflash-studio train-draft` for a target, or say how to run it elsewhere.

The GUI process never imports torch: a child Python is asked whether torch sees a GPU (CUDA or XPU).
Where it does, the dialog runs `python -m engine.cli train-draft ...` as a QProcess with its progress
("step N/M" lines) on a bar, its log streamed, and Cancel (the run keeps its checkpoints, so the
same command with --resume continues it); the OpenVINO folder it prints last goes to the draft
picker. Where no GPU is found it says so and shows the exact command to run on a GPU machine (the
run folder it makes there is copied back and opened like any draft folder).
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from PySide6.QtCore import QProcess, Signal
from PySide6.QtGui import QAction, QFontDatabase
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QFileDialog, QFormLayout, QHBoxLayout, QLabel,
                               QLineEdit, QMainWindow, QProgressBar, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from app.models.child_process import LogView, add_file_action, child_process, show_one
from engine import paths

ACTION_TEXT = "&Train a draft…"
VARIANTS = (("dspark", "DSpark (Markov head; the best acceptance)"), ("dflash_v1", "DFlash v1"),
            ("dflash_v2", "DFlash v2"))
GPU_PROBE = ("import torch; print('gpu' if torch.cuda.is_available() or "
             "(hasattr(torch, 'xpu') and torch.xpu.is_available()) else 'none')")
_STEP = re.compile(r"step (\d+)/(\d+)")


def train_command(target: str, variant: str, out: Path, prompts: int = 0, steps: int = 0,
                  device: str = "auto", python: str = sys.executable) -> list[str]:
    """The child process's argv (also what the dialog shows to run on another machine)."""
    cmd = [python, "-m", "engine.cli", "train-draft", "--target", target, "--variant", variant, "--out", str(out)]
    if prompts:
        cmd += ["--prompts", str(prompts)]
    if steps:
        cmd += ["--steps", str(steps)]
    if device != "auto":
        cmd += ["--device", device]
    return cmd


class TrainDialog(QDialog):
    """Pick a target and a variant, train (here on a GPU, or the command for one), hand over the draft."""

    trained = Signal(str)  # the OpenVINO draft folder
    state_changed = Signal(str)  # probing | ready | no-gpu | running | done | failed | cancelled

    def __init__(self, parent: QWidget | None = None, *, target: str = "smollm2", out_root: Path | None = None,
                 python: str = sys.executable, probe: bool = True) -> None:
        super().__init__(parent)
        self.setObjectName("trainDialog")
        self.setWindowTitle("Train a draft")
        self.resize(760, 600)
        self.python = python
        self.out_root = Path(out_root) if out_root else paths.models_dir() / "trained-drafts"
        self.state = ""
        self.gpu: bool | None = None
        self.result_path: str | None = None
        self._last_line = ""
        self._buffer = ""

        lay = QVBoxLayout(self)
        intro = QLabel("Train a DFlash-family draft for a chat model from the model's own answers "
                       "(docs/training.md). It needs torch with a GPU; a run takes tens of minutes.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        form = QFormLayout()
        row = QHBoxLayout()
        self.target_edit = QLineEdit(target)
        self.target_edit.setObjectName("trainTarget")
        self.target_edit.setToolTip("A Hugging Face folder or a GGUF of a Llama / Qwen2 / Qwen3 chat model, "
                                    "or smollm2 (the embedded default)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(self.target_edit)
        row.addWidget(browse)
        form.addRow("Target:", row)
        self.variant_box = QComboBox()
        self.variant_box.setObjectName("trainVariant")
        for key, label in VARIANTS:
            self.variant_box.addItem(label, key)
        form.addRow("Draft:", self.variant_box)
        self.out_edit = QLineEdit()
        self.out_edit.setObjectName("trainOut")
        form.addRow("Run folder:", self.out_edit)
        self.prompts_spin = QSpinBox(maximum=10_000_000, specialValueText="the recipe's")
        self.steps_spin = QSpinBox(maximum=10_000_000, specialValueText="the recipe's")
        form.addRow("Prompts at most:", self.prompts_spin)
        form.addRow("Steps at most:", self.steps_spin)
        self.cpu_check = QCheckBox("Train on the CPU anyway (only a small try: set prompts and steps)")
        self.cpu_check.setObjectName("trainOnCpu")
        form.addRow("", self.cpu_check)
        lay.addLayout(form)

        self.status = QLabel("")
        self.status.setObjectName("trainStatus")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.command_view = QLineEdit()
        self.command_view.setObjectName("trainCommand")
        self.command_view.setReadOnly(True)
        self.command_view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        lay.addWidget(self.command_view)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        lay.addWidget(self.progress)
        self.log = LogView()
        self.log.setObjectName("trainLog")
        lay.addWidget(self.log, 1)
        brow = QHBoxLayout()
        brow.addStretch(1)
        self.start_button = QPushButton("Train")
        self.start_button.setObjectName("trainStart")
        self.start_button.clicked.connect(self.start)
        self.close_button = QPushButton("Close")
        self.close_button.setObjectName("trainClose")
        self.close_button.clicked.connect(self._close_clicked)
        brow.addWidget(self.start_button)
        brow.addWidget(self.close_button)
        lay.addLayout(brow)

        for w in (self.target_edit, self.out_edit):
            w.textChanged.connect(self._update)
        self.variant_box.currentIndexChanged.connect(self._suggest_out)
        for s in (self.prompts_spin, self.steps_spin):
            s.valueChanged.connect(self._update)
        self.cpu_check.toggled.connect(self._update)
        self.target_edit.textChanged.connect(self._suggest_out)

        self.proc = child_process(self, merged=False)  # progress ("step N/M") comes on stderr
        self.proc.readyReadStandardOutput.connect(self._read_out)
        self.proc.readyReadStandardError.connect(self._read_err)
        self.proc.finished.connect(self._finished)
        self.probe = QProcess(self)
        self.probe.finished.connect(self._probed)
        self._suggest_out()
        if probe:
            self._set_state("probing")
            self.status.setText("Looking for a GPU that torch can use…")
            self.probe.start(self.python, ["-c", GPU_PROBE])
        self._update()

    # -- inputs ------------------------------------------------------------------------------------
    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Target model folder (Hugging Face, or one with a GGUF)")
        if path:
            self.target_edit.setText(path)

    def _suggest_out(self, *_: object) -> None:
        name = Path(self.target_edit.text().strip() or "target").name.removesuffix(".gguf")
        self.out_edit.setText(str(self.out_root / f"{name}-{self.variant_box.currentData()}"))

    def command(self, device: str = "auto") -> list[str]:
        return train_command(self.target_edit.text().strip(), self.variant_box.currentData(),
                             Path(self.out_edit.text().strip()), self.prompts_spin.value(), self.steps_spin.value(),
                             device, self.python)

    def set_gpu(self, found: bool) -> None:
        """What the probe found (tests set it directly)."""
        self.gpu = found
        self._set_state("ready" if found else "no-gpu")
        self._update()

    def _probed(self, code: int, _status: QProcess.ExitStatus) -> None:
        said = bytes(self.probe.readAllStandardOutput()).decode(errors="replace").strip()
        self.set_gpu(code == 0 and said.endswith("gpu"))

    def _update(self, *_: object) -> None:
        running = self.state == "running"
        cpu = self.cpu_check.isChecked()
        ready = bool(self.target_edit.text().strip() and self.out_edit.text().strip())
        cmd = self.command("cpu" if cpu and not self.gpu else "auto")
        self.command_view.setText(" ".join(shlex.quote(a) for a in cmd))
        self.start_button.setEnabled(ready and not running and (bool(self.gpu) or cpu))
        self.close_button.setText("Cancel" if running else "Close")
        if self.state == "no-gpu":
            self.status.setText("No GPU that torch can use was found here (torch is missing, or a CPU-only build). "
                                "Run this command on a machine with a GPU and a CUDA build of torch, copy the run "
                                "folder back and choose its openvino folder as the draft:")
        elif self.state == "ready":
            self.status.setText("torch sees a GPU here: Train runs this command.")

    def _set_state(self, state: str) -> None:
        self.state = state
        self.state_changed.emit(state)

    # -- the run -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.state == "running":
            return
        cmd = self.command("cpu" if self.cpu_check.isChecked() and not self.gpu else "auto")
        self.log.clear()
        self.log.write("$ " + " ".join(shlex.quote(a) for a in cmd) + "\n")
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self._last_line, self._buffer, self.result_path = "", "", None
        self._set_state("running")
        self._update()
        self.proc.start(cmd[0], cmd[1:])

    def _read_err(self) -> None:
        text = bytes(self.proc.readAllStandardError()).decode(errors="replace")
        self.log.write(text)
        for m in _STEP.finditer(text):
            done, total = int(m.group(1)), int(m.group(2))
            self.progress.setRange(0, total)
            self.progress.setValue(min(done, total))
            self.progress.setFormat(f"step {done} of {total}")

    def _read_out(self) -> None:
        text = bytes(self.proc.readAllStandardOutput()).decode(errors="replace")
        self.log.write(text)
        self._buffer += text
        lines = [x for x in self._buffer.splitlines() if x.strip()]
        if lines:
            self._last_line = lines[-1].strip()

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self.state == "cancelled":
            self.status.setText("Cancelled. The run folder keeps its checkpoints: the same command with --resume "
                                "continues it.")
            self._update()
            return
        folder = Path(self._last_line) if self._last_line else None
        if status == QProcess.ExitStatus.NormalExit and code == 0 and folder and (folder / "openvino_model.xml").is_file():
            self.result_path = str(folder)
            self._set_state("done")
            if self.progress.maximum() == 0:  # no step line was seen
                self.progress.setRange(0, 1)
            self.progress.setValue(self.progress.maximum())
            self.status.setText(f"Trained: {folder} is now the draft.")
            self.trained.emit(str(folder))
        else:
            self._set_state("failed")
            self.progress.setVisible(False)
            self.status.setText("Training failed (the log says why); fix it and train again with the same run "
                                "folder to resume.")
        self._update()

    def cancel(self) -> None:
        if self.proc.state() != QProcess.ProcessState.NotRunning:
            self._set_state("cancelled")
            self.proc.kill()
            self.proc.waitForFinished(5000)

    def _close_clicked(self) -> None:
        if self.state == "running":
            self.cancel()
        else:
            self.reject()

    def reject(self) -> None:
        self.cancel()
        if self.probe.state() != QProcess.ProcessState.NotRunning:
            self.probe.kill()
            self.probe.waitForFinished(2000)
        super().reject()


def open_train_dialog(window: QMainWindow) -> TrainDialog:
    """Show the dialog (one at a time); a trained draft becomes the current draft and a recent one."""
    from app.models.import_action import add_imported_model

    def make() -> TrainDialog:
        dlg = TrainDialog(window)
        dlg.trained.connect(lambda path: add_imported_model(window.model_panel, window.settings, path, "draft"))
        return dlg

    return show_one(window, "_train_dialog", make)[0]


def install_train_action(window: QMainWindow) -> QAction:
    """Add File → Train a draft… right after the import action and return it."""
    act = add_file_action(window, ACTION_TEXT, "actTrainDraft",
                          "Train a draft for a chat model from its own answers (needs torch and a GPU)",
                          lambda: open_train_dialog(window), after=getattr(window, "act_import_hf", None),
                          dialog=("_train_dialog", "cancel"))
    window.act_train_draft = act
    return act
