"""The chat view: messages with accepted draft tokens marked, streamed in batches, stats per message.

Text arrives in batches from the worker (one signal per ~33 ms at most) and is inserted with one
QTextCursor edit block per batch, at the end of the document. A message whose state changes when
it is no longer the last one (a stopped reply that gets its stats later) is redrawn with the rest.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextBrowser

from app.chat.model import CANCELLED, DONE, ERROR, INTERRUPTED, STREAMING, Conversation, Message

DRAFT_BG = QColor("#b9ecc0")  # accepted draft tokens (LM Studio marks them green as well)
DRAFT_FG = QColor("#0b3d17")
USER_BG = QColor("#eef2f8")
MUTED = QColor("#6b7280")
ERROR_FG = QColor("#b42318")
STOP_FG = QColor("#b54708")


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def format_stats(stats: dict[str, Any] | None) -> str:
    """One line of per-message stats: TTFT, decode tok/s, tokens per step, acceptance, draft (variant, K),
    sampling, device. A value that is not a finite number is left out (history is checked on load,
    app/chat/schema.py; this keeps the view from ever failing on a stat)."""
    if not stats:
        return ""
    parts: list[str] = []
    for key, fmt in (("ttft_ms", "TTFT {:.0f} ms"), ("decode_tok_s", "{:.1f} tok/s"),
                     ("tokens_per_step", "{:.2f} tokens/step")):
        v = _finite(stats.get(key))
        if v is not None:
            parts.append(fmt.format(v))
    has_draft = bool(stats.get("draft")) and stats.get("draft") != "none"
    rate = _finite(stats.get("acceptance_rate"))
    if rate is not None and has_draft:
        pct = rate * 100.0 if rate <= 1.0 else rate
        parts.append(f"{pct:.0f}% accepted")
    if "tokens" in stats:
        parts.append(f"{stats['tokens']} tokens")
    cached = _finite(stats.get("cached_tokens"))
    if cached:
        parts.append(f"{cached:.0f} prompt tokens cached")
    if has_draft:
        extra = [str(stats["variant"])] if stats.get("variant") else []
        if stats.get("markov_head_top_k") is not None:
            extra.append(f"K={stats['markov_head_top_k']}")
        parts.append(f"draft: {stats['draft']}" + (f" ({', '.join(extra)})" if extra else ""))
    else:
        parts.append("no draft")
    if stats.get("decoding") and stats["decoding"] != "greedy":
        parts.append(str(stats["decoding"]))
    if stats.get("device"):
        parts.append(str(stats["device"]))
    return " · ".join(parts)


class ChatView(QTextBrowser):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setOpenExternalLinks(False)
        self.setUndoRedoEnabled(False)
        self.document().setDocumentMargin(14)
        self._conv: Conversation | None = None
        self._mark_draft = True
        self._tail_id: str | None = None  # last message drawn
        self._tail_closed = True  # its footer is drawn (nothing more can be appended to it)
        base = self.font()
        self._f_body = QTextCharFormat()
        self._f_body.setFont(base)
        self._f_draft = QTextCharFormat(self._f_body)
        self._f_draft.setBackground(DRAFT_BG)
        self._f_draft.setForeground(DRAFT_FG)
        self._f_head = QTextCharFormat(self._f_body)
        self._f_head.setFontWeight(QFont.Weight.Bold)
        self._f_meta = QTextCharFormat(self._f_body)
        self._f_meta.setForeground(MUTED)
        small = QFont(base)
        small.setPointSizeF(max(base.pointSizeF() * 0.88, 7.0))
        self._f_meta.setFont(small)
        self._f_err = QTextCharFormat(self._f_meta)
        self._f_err.setForeground(ERROR_FG)
        self._f_stop = QTextCharFormat(self._f_meta)
        self._f_stop.setForeground(STOP_FG)

    # -- public ----------------------------------------------------------------------------------
    @property
    def conversation(self) -> Conversation | None:
        return self._conv

    def set_mark_draft(self, on: bool) -> None:
        if on != self._mark_draft:
            self._mark_draft = on
            self.render()

    def set_conversation(self, conv: Conversation | None) -> None:
        self._conv = conv
        self.render()

    def render(self) -> None:
        at_bottom = self._at_bottom()
        self.clear()
        self._tail_id, self._tail_closed = None, True
        if self._conv is not None:
            cur = self._end_cursor()
            cur.beginEditBlock()
            for i, m in enumerate(self._conv.messages):
                self._draw_message(cur, m, first=(i == 0))
            cur.endEditBlock()
        if at_bottom:
            self._scroll_to_end()

    def message_added(self, msg: Message) -> None:
        """A message was appended to the shown conversation."""
        if not self._shows(msg):
            return
        if self._conv.messages[-1] is not msg or (self._tail_id is not None and not self._tail_closed):
            self.render()
            return
        at_bottom = self._at_bottom()
        cur = self._end_cursor()
        cur.beginEditBlock()
        self._draw_message(cur, msg, first=len(self._conv.messages) == 1)
        cur.endEditBlock()
        if at_bottom or msg.role == "user":
            self._scroll_to_end()

    def pieces_added(self, msg: Message, pieces: Iterable[tuple[str, bool]]) -> None:
        """New text for a streaming message (already appended to `msg` by the caller)."""
        if not self._shows(msg):
            return
        if msg.id != self._tail_id or self._tail_closed:
            self.render()
            return
        at_bottom = self._at_bottom()
        cur = self._end_cursor()
        cur.beginEditBlock()
        for text, from_draft in pieces:
            cur.insertText(text, self._piece_format(from_draft))
        cur.endEditBlock()
        if at_bottom:
            self._scroll_to_end()

    def message_changed(self, msg: Message) -> None:
        """A message got its final state or stats."""
        if not self._shows(msg):
            return
        if msg.id == self._tail_id and not self._tail_closed and msg.status != STREAMING:
            at_bottom = self._at_bottom()
            cur = self._end_cursor()
            cur.beginEditBlock()
            self._draw_footer(cur, msg)
            cur.endEditBlock()
            if at_bottom:
                self._scroll_to_end()
        else:
            self.render()

    # -- drawing ---------------------------------------------------------------------------------
    def _shows(self, msg: Message) -> bool:
        return self._conv is not None and any(m is msg for m in self._conv.messages)

    def _piece_format(self, from_draft: bool) -> QTextCharFormat:
        return self._f_draft if (from_draft and self._mark_draft) else self._f_body

    def _end_cursor(self) -> QTextCursor:
        cur = QTextCursor(self.document())
        cur.movePosition(QTextCursor.MoveOperation.End)
        return cur

    def _block(self, user: bool, top: float = 0.0, bottom: float = 0.0) -> QTextBlockFormat:
        bf = QTextBlockFormat()
        bf.setLeftMargin(8)
        bf.setRightMargin(8)
        bf.setTopMargin(top)
        bf.setBottomMargin(bottom)
        if user:
            bf.setBackground(USER_BG)
        return bf

    def _draw_message(self, cur: QTextCursor, m: Message, first: bool) -> None:
        user = m.role == "user"
        if first:
            cur.setBlockFormat(self._block(user, top=4))
        else:
            cur.insertBlock(self._block(user, top=14))
        name = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        cur.insertText(name, self._f_head)
        cur.insertBlock(self._block(user))
        if m.role == "assistant" and m.pieces:
            for text, from_draft in m.pieces:
                cur.insertText(text, self._piece_format(from_draft))
        else:
            cur.insertText(m.content, self._f_body)
        self._tail_id = m.id
        self._tail_closed = False
        if m.role != "assistant" or m.status != STREAMING:
            self._draw_footer(cur, m)

    def _draw_footer(self, cur: QTextCursor, m: Message) -> None:
        self._tail_closed = True
        if m.role != "assistant":
            return
        lines: list[tuple[str, QTextCharFormat]] = []
        if m.status == CANCELLED:
            lines.append(("Stopped.", self._f_stop))
        elif m.status == INTERRUPTED:
            lines.append(("Interrupted (the app closed while this reply was streaming).", self._f_stop))
        elif m.status == ERROR:
            lines.append((f"Error: {m.error or 'generation failed'}", self._f_err))
        elif m.status == DONE and m.finish_reason == "length":
            lines.append(("Reached the max new tokens limit.", self._f_meta))
        dropped = (m.stats or {}).get("context_dropped_turns")
        if isinstance(dropped, int) and dropped > 0:
            lines.append((f"The conversation outgrew the model's context: its oldest {dropped} "
                          f"turn{'s were' if dropped > 1 else ' was'} left out of this reply's prompt.", self._f_stop))
        stats = format_stats(m.stats)
        if stats:
            lines.append((stats, self._f_meta))
        for text, fmt in lines:
            cur.insertBlock(self._block(False, top=2))
            cur.insertText(text, fmt)

    def _at_bottom(self) -> bool:
        sb = self.verticalScrollBar()
        return sb.value() >= sb.maximum() - 8

    def _scroll_to_end(self) -> None:
        sb = self.verticalScrollBar()
        sb.setValue(sb.maximum())
