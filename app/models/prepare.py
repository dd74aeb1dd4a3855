"""Prepare the embedded default target (or a catalogue model) in a child process, with its output
streamed into a log."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from PySide6.QtCore import QProcess, QProcessEnvironment, Signal
from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QProgressBar,
                               QVBoxLayout)

REPO_ROOT = Path(__file__).resolve().parents[2]


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
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setMaximumBlockCount(5000)
        self.log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        lay.addWidget(self.log, 1)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.exit_code: int | None = None
        self._carriage = False  # a bare \r arrived: the next text redraws the current line

        self.proc = QProcess(self)
        self.proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        self.proc.setWorkingDirectory(str(REPO_ROOT))
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        self.proc.setProcessEnvironment(env)
        self.proc.readyReadStandardOutput.connect(self._read)
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)

    def start(self) -> None:
        self.write(f"$ {self.program} {' '.join(self.args)}\n")
        self.proc.start(self.program, self.args)

    def write(self, data: str) -> None:
        """Append output like a terminal: \\n starts a line, a bare \\r redraws the current one
        (progress bars), so a progress bar stays one line in the log."""
        sb = self.log.verticalScrollBar()
        at_bottom = sb.value() >= sb.maximum() - 4
        cur = self.log.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.beginEditBlock()
        for part in re.split(r"(\r\n|\n|\r)", data):
            if part in ("\n", "\r\n"):
                cur.insertBlock()
                self._carriage = False
            elif part == "\r":
                self._carriage = True
            elif part:
                if self._carriage:
                    cur.movePosition(QTextCursor.MoveOperation.StartOfBlock, QTextCursor.MoveMode.KeepAnchor)
                    cur.removeSelectedText()
                    self._carriage = False
                cur.insertText(part)
        cur.endEditBlock()
        if at_bottom:
            sb.setValue(sb.maximum())

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
