"""The message box: Enter sends, Shift+Enter adds a line (Esc is the window's stop shortcut)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


class ChatInput(QPlainTextEdit):
    submitted = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("chatInput")
        self.setPlaceholderText("Type a message. Enter sends, Shift+Enter adds a line, Esc stops.")
        self.setTabChangesFocus(True)
        fm = self.fontMetrics()
        self.setMinimumHeight(fm.lineSpacing() * 3 + 12)
        self.setMaximumHeight(fm.lineSpacing() * 8 + 12)

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802 (Qt name)
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if e.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.textCursor().insertText("\n")
                return
            if not (e.modifiers() & (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier)):
                self.submit()
                return
        super().keyPressEvent(e)

    def submit(self) -> None:
        text = self.toPlainText()
        if text.strip():
            self.submitted.emit(text)
