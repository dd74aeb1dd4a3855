"""Small widgets the main window is built from: the dismissable banner strip and a one-line label that
elides instead of widening the layout."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMessageBox, QPushButton, QSizePolicy


class Banner(QFrame):
    """A dismissable strip above the chat for errors and notices (never a blocking dialog)."""

    def __init__(self, kind: str, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("errorBanner" if kind == "error" else "noticeBanner")
        self.setProperty("kind", kind)
        self.details = ""
        self.title = ""
        h = QHBoxLayout(self)
        h.setContentsMargins(10, 6, 6, 6)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        h.addWidget(self.label, 1)
        self.action_button = QPushButton()
        self.action_button.setVisible(False)
        h.addWidget(self.action_button)
        self.details_button = QPushButton("Details…")
        self.details_button.clicked.connect(self._show_details)
        h.addWidget(self.details_button)
        self.close_button = QPushButton("Dismiss")
        self.close_button.clicked.connect(self.hide)
        h.addWidget(self.close_button)
        self._action: Callable[[], None] | None = None
        self.action_button.clicked.connect(lambda: self._action and self._action())
        self.hide()

    def show_message(self, title: str, text: str, details: str = "",
                     action: tuple[str, Callable[[], None]] | None = None) -> None:
        self.title = title
        self.details = details
        self.label.setText(f"<b>{title}</b><br>{_html(text)}" if title else _html(text))
        self.details_button.setVisible(bool(details))
        if action:
            self.action_button.setText(action[0])
            self._action = action[1]
            self.action_button.setVisible(True)
        else:
            self._action = None
            self.action_button.setVisible(False)
        self.show()

    def _show_details(self) -> None:
        box = QMessageBox(self.window())
        box.setIcon(QMessageBox.Icon.Warning if self.property("kind") == "error" else QMessageBox.Icon.Information)
        box.setWindowTitle(self.title or "Details")
        box.setText(self.label.text())
        box.setDetailedText(self.details)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()  # window-modal, does not block the event loop


class ElidedLabel(QLabel):
    """A one-line label that shortens its text with … instead of widening the layout."""

    def __init__(self, text: str = "", parent=None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802
        self._full = text
        self.setToolTip(text)
        self._elide()

    def resizeEvent(self, e) -> None:  # noqa: N802
        super().resizeEvent(e)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, max(self.width(), 40))
        super().setText(shown)


def _html(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", "<br>"))
