"""Prepare the embedded default target (or a catalogue model) in a child process, with its output
streamed into a log."""
from __future__ import annotations

import sys

from PySide6.QtCore import QProcess, Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QProgressBar, QVBoxLayout

from app.models.child_process import LogView, child_process


def default_prepare_command(model: str | None = None) -> tuple[str, list[str]]:
    return sys.executable, ["-m", "engine.cli", "prepare", *(["--model", model] if model else [])]


class PrepareDialog(QDialog):
    """Runs `python -m engine.cli prepare` (or another command) and shows what it prints."""

    succeeded = Signal()

    def __init__(self, command: tuple[str, list[str]] | None = None, parent=None,
                 model_title: str | None = None, about: str | None = None) -> None:
        super().__init__(parent)
        self.model_title = model_title
        self.setWindowTitle(f"Prepare {model_title}" if model_title else "Prepare the default model")
        self.resize(720, 420)
        self.program, self.args = command or default_prepare_command()
        lay = QVBoxLayout(self)
        self.info = QLabel(about or (
            "Preparing the embedded default target (SmolLM2-135M-Instruct): converting it to "
            "OpenVINO IR in your user data folder. This runs once and takes a minute or two."
        ))
        self.info.setWordWrap(True)
        lay.addWidget(self.info)
        self.cmd_label = QLabel(f"<code>{self.program} {' '.join(self.args)}</code>")
        self.cmd_label.setTextInteractionFlags(self.cmd_label.textInteractionFlags())
        lay.addWidget(self.cmd_label)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        lay.addWidget(self.progress)
        self.log = LogView()
        lay.addWidget(self.log, 1)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.exit_code: int | None = None

        self.proc = child_process(self)
        self.proc.readyReadStandardOutput.connect(self._read)
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)

    def start(self) -> None:
        self.write(f"$ {self.program} {' '.join(self.args)}\n")
        self.proc.start(self.program, self.args)

    def write(self, data: str) -> None:
        """Append output like a terminal (a progress bar stays one line in the log)."""
        self.log.write(data)

    def _read(self) -> None:
        data = bytes(self.proc.readAllStandardOutput()).decode("utf-8", errors="replace")
        if data:
            self.write(data)

    def _error(self, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart:
            self.write(f"\nCould not start {self.program}: {self.proc.errorString()}\n")
            self._done(False, "The preparation could not start.")

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._read()
        self.exit_code = code
        ok = status == QProcess.ExitStatus.NormalExit and code == 0
        ready = f"Done: {self.model_title} is ready." if self.model_title else "Done: the default model is ready."
        self._done(ok, ready if ok else
                   f"The preparation failed (exit code {code}). The log above says why.")

    def _done(self, ok: bool, message: str) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if ok else 0)
        self.info.setText(message)
        self.buttons.clear()
        self.buttons.addButton(QDialogButtonBox.StandardButton.Close)  # RejectRole: closes
        if ok:
            self.succeeded.emit()

    def reject(self) -> None:
        self.stop()
        super().reject()

    def stop(self) -> None:
        if self.proc.state() != QProcess.ProcessState.NotRunning:
            self.write("\nStopping…\n")
            self.proc.kill()
            self.proc.waitForFinished(5000)

    def closeEvent(self, e) -> None:  # noqa: N802
        self.stop()
        super().closeEvent(e)
