"""The Conversations dock's list: one row a conversation (title, tooltip, a dot while a reply streams).

Rows carry the conversation id; every change made from code blocks the list's signals, so only the
person's own clicks and renames reach the window (`currentItemChanged`, `itemChanged`).
"""
from __future__ import annotations

import time
from typing import Iterable

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap
from PySide6.QtWidgets import QListWidget, QListWidgetItem

from app.chat.model import Conversation

STREAMING_DOT = "#12b76a"


def conversation_tooltip(conv: Conversation) -> str:
    """The list's tooltip: title, message count, last change (a time history load checked)."""
    return (f"{conv.title}\n{len(conv.messages)} messages · "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(conv.updated))}")


def dot_icon(color: str) -> QIcon:
    """A small filled circle with a white ring (visible on a selected row too)."""
    pm = QPixmap(12, 12)
    pm.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pm)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(QPen(QColor("#ffffff"), 1.5))
    painter.setBrush(QColor(color))
    painter.drawEllipse(QRectF(1.5, 1.5, 9.0, 9.0))
    painter.end()
    icon = QIcon()
    for mode in (QIcon.Mode.Normal, QIcon.Mode.Selected, QIcon.Mode.Active):
        icon.addPixmap(pm, mode)  # the same dot when selected (no tint)
    return icon


class ConversationList(QListWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationList")
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setEditTriggers(QListWidget.EditTrigger.DoubleClicked | QListWidget.EditTrigger.EditKeyPressed)
        self._dot = dot_icon(STREAMING_DOT)

    def _items(self) -> Iterable[QListWidgetItem]:
        return (self.item(i) for i in range(self.count()))

    def fill(self, conversations: list[Conversation], current: Conversation | None, streaming: set[str]) -> None:
        """Rows for `conversations` in order, `current` selected; `streaming`: ids of those with a live reply."""
        self.blockSignals(True)
        self.clear()
        for conv in conversations:
            it = QListWidgetItem(conv.title)
            it.setData(Qt.ItemDataRole.UserRole, conv.id)
            it.setToolTip(conversation_tooltip(conv))
            it.setFlags(it.flags() | Qt.ItemFlag.ItemIsEditable)
            if conv.id in streaming:
                it.setIcon(self._dot)
            self.addItem(it)
            if current is not None and conv.id == current.id:
                self.setCurrentItem(it)
        self.blockSignals(False)

    def select(self, conv: Conversation) -> None:
        it = next((i for i in self._items() if i.data(Qt.ItemDataRole.UserRole) == conv.id), None)
        if it is not None and self.currentItem() is not it:
            self.blockSignals(True)
            self.setCurrentItem(it)
            self.blockSignals(False)

    def set_title(self, conv: Conversation) -> None:
        for it in self._items():
            if it.data(Qt.ItemDataRole.UserRole) == conv.id and it.text() != conv.title:
                self.blockSignals(True)
                it.setText(conv.title)
                self.blockSignals(False)

    def mark_streaming(self, streaming: set[str]) -> None:
        """The dot beside exactly the conversations whose ids are in `streaming`."""
        for it in self._items():
            on = it.data(Qt.ItemDataRole.UserRole) in streaming
            if on != (not it.icon().isNull()):
                self.blockSignals(True)
                it.setIcon(self._dot if on else QIcon())
                self.blockSignals(False)
