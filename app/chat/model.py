"""Messages and conversations as plain data (Qt-free), with their JSON form for the history files."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.chat import schema

# Assistant message states. "streaming" is never written to disk as final: a file saved while a
# reply streams keeps it, and loading turns it into "interrupted".
STREAMING, DONE, CANCELLED, ERROR, INTERRUPTED = "streaming", "done", "cancelled", "error", "interrupted"
ROLES = schema.ROLES


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Message:
    role: str
    content: str = ""
    # Assistant replies: runs of text and whether the target accepted them from the draft.
    pieces: list[tuple[str, bool]] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    status: str = DONE
    finish_reason: str | None = None
    error: str | None = None
    id: str = field(default_factory=new_id)
    created: float = field(default_factory=time.time)

    def append_piece(self, text: str, from_draft: bool) -> None:
        if not text:
            return
        self.content += text
        if self.pieces and self.pieces[-1][1] == from_draft:
            self.pieces[-1] = (self.pieces[-1][0] + text, from_draft)
        else:
            self.pieces.append((text, from_draft))

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": "message", "id": self.id, "role": self.role,
                             "content": self.content, "created": self.created, "status": self.status}
        if self.pieces:
            d["pieces"] = [[t, bool(f)] for t, f in self.pieces]
        if self.stats:
            d["stats"] = self.stats
        if self.finish_reason:
            d["finish_reason"] = self.finish_reason
        if self.error:
            d["error"] = self.error
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Message":
        """A message from its history line; every field checked (app/chat/schema.py), HistoryFormatError if bad."""
        role = schema.one_of(d.get("role"), "role", ROLES)
        content = schema.text(d.get("content", ""), "content")
        pieces = schema.pieces(d.get("pieces"), content)
        stats = schema.stats(d.get("stats"))
        status = schema.one_of(d.get("status", DONE), "status", schema.STATUSES)
        if status == STREAMING:
            status = INTERRUPTED  # the app was killed while this reply streamed: its text so far is kept
        created = schema.timestamp(d["created"], "created") if "created" in d else time.time()
        mid = schema.identifier(d["id"], "id") if d.get("id") is not None else new_id()
        return cls(role=role, content=content, pieces=pieces, stats=stats, status=status,
                   finish_reason=schema.optional_text(d.get("finish_reason"), "finish_reason"),
                   error=schema.optional_text(d.get("error"), "error"), id=mid, created=created)


@dataclass
class Conversation:
    title: str = "New conversation"
    system_prompt: str = ""
    messages: list[Message] = field(default_factory=list)
    id: str = field(default_factory=new_id)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def header_json(self) -> dict[str, Any]:
        return {"kind": "conversation", "version": 1, "id": self.id, "title": self.title,
                "system_prompt": self.system_prompt, "created": self.created, "updated": self.updated}

    def auto_title(self) -> None:
        """Name a new conversation after its first question."""
        if self.title != "New conversation":
            return
        first = next((m.content for m in self.messages if m.role == "user" and m.content.strip()), "")
        if first:
            line = " ".join(first.split())
            self.title = line if len(line) <= 48 else line[:47] + "…"

    def chat_messages(self) -> list[dict[str, str]]:
        """The conversation as chat-template messages: system prompt, then the turns so far.

        Failed replies are left out; a stopped reply keeps the text it had.
        """
        out: list[dict[str, str]] = []
        if self.system_prompt.strip():
            out.append({"role": "system", "content": self.system_prompt})
        for m in self.messages:
            if m.role == "assistant" and (m.status in (ERROR, STREAMING) or not m.content):
                continue
            out.append({"role": m.role, "content": m.content})
        return out
