"""What the dialogs that run the engine's CLI in a child process share (prepare, import, train-draft).

The GUI process never imports torch or optimum: conversions and training run as
`python -m engine.cli ...` in a QProcess started here (repository root as working folder, unbuffered
output so the log follows the work), their output shown in a `LogView` that behaves like a terminal.
Their File-menu actions go in through `add_file_action`, `show_one` keeps one dialog of a kind open,
and `CancelOnClose` stops a dialog's run when the main window closes (a child must not outlive it).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import shiboken6
from PySide6.QtCore import QEvent, QObject, QProcess, QProcessEnvironment
from PySide6.QtGui import QAction, QFontDatabase, QTextCursor
from PySide6.QtWidgets import QDialog, QMainWindow, QMenu, QPlainTextEdit, QWidget

REPO_ROOT = Path(__file__).resolve().parents[2]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def child_process(parent: QObject, merged: bool = True) -> QProcess:
    """A QProcess for `python -m engine.cli ...`: run from the repository root, Python unbuffered;
    `merged`: stderr into stdout (one log), else read apart (train-draft's progress is on stderr)."""
    proc = QProcess(parent)
    if merged:
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
    proc.setWorkingDirectory(str(REPO_ROOT))
    env = QProcessEnvironment.systemEnvironment()
    env.insert("PYTHONUNBUFFERED", "1")
    proc.setProcessEnvironment(env)
    return proc


class LogView(QPlainTextEdit):
    """A read-only log that behaves like a terminal: \\n starts a line, a bare \\r redraws the current
    one (so a progress bar stays one line), colour codes are dropped; it follows the end unless the
    person scrolled up."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setMaximumBlockCount(5000)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self._carriage = False

    def write(self, data: str) -> None:
        data = _ANSI.sub("", data)
        sb = self.verticalScrollBar()
        at_bottom = sb.value() >= sb.maximum() - 4
        cur = self.textCursor()
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
                cur.insertText(part.rstrip() if "\r" in data else part)
        cur.endEditBlock()
        if at_bottom:
            sb.setValue(sb.maximum())


def show_one(window: QMainWindow, attr: str, make: Callable[[], QDialog]) -> tuple[QDialog, bool]:
    """The window's one dialog of a kind, kept in `window.<attr>`: the open one is raised, else `make()`
    builds one, which is opened and forgotten when it closes. (the dialog, whether it is new)."""
    dlg = getattr(window, attr, None)
    if dlg is not None and shiboken6.isValid(dlg):
        dlg.raise_()
        dlg.activateWindow()
        return dlg, False
    dlg = make()
    dlg.finished.connect(lambda _r: setattr(window, attr, None))
    setattr(window, attr, dlg)
    dlg.open()
    return dlg, True


def file_menu(window: QMainWindow) -> QMenu:
    """The window's File menu (made when it has none)."""
    for a in window.menuBar().actions():
        if a.menu() is not None and a.text().replace("&", "") == "File":
            return a.menu()
    return window.menuBar().addMenu("&File")


def add_file_action(window: QMainWindow, text: str, name: str, tip: str, on_trigger: Callable[[], object],
                    before: QAction | None = None, after: QAction | None = None,
                    dialog: tuple[str, str] | None = None) -> QAction:
    """A File-menu action placed before `before` or right after `after` (else last). `dialog`:
    (window attribute of the dialog it opens, that dialog's cancel method): the attribute starts as
    None and the dialog's run is cancelled when the window closes."""
    act = QAction(text, window)
    act.setObjectName(name)
    act.setStatusTip(tip)
    menu = file_menu(window)
    actions = menu.actions()
    if before is not None and before in actions:
        menu.insertAction(before, act)
    elif after is not None and after in actions and actions.index(after) + 1 < len(actions):
        menu.insertAction(actions[actions.index(after) + 1], act)
    else:
        menu.addAction(act)
    act.triggered.connect(lambda: on_trigger())
    if dialog is not None:
        setattr(window, dialog[0], None)
        window.installEventFilter(CancelOnClose(window, *dialog))
    return act


class CancelOnClose(QObject):
    """Calls `cancel` on the window's open dialog (`window.<attr>`) when the window closes."""

    def __init__(self, window: QMainWindow, attr: str, cancel: str) -> None:
        super().__init__(window)
        self.window, self.attr, self.cancel = window, attr, cancel

    def eventFilter(self, obj, event) -> bool:  # noqa: N802
        if obj is self.window and event.type() == QEvent.Type.Close:
            dlg = getattr(self.window, self.attr, None)
            if dlg is not None and shiboken6.isValid(dlg):
                getattr(dlg, self.cancel)()
        return False
