"""Conversation history: one JSONL file per conversation, written atomically, corrupt files set aside.

File layout (`<history_dir>/<id>.jsonl`): the first line is the conversation header
(`{"kind": "conversation", ...}`), then one line per message (`{"kind": "message", ...}`).
A file that cannot be read is moved to `<history_dir>/corrupt/` and reported; it is never deleted
and never silently skipped.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.chat.model import Conversation, Message


@dataclass
class CorruptFile:
    path: Path  # where it was
    moved_to: Path | None  # where it is now (None if it could not be moved)
    reason: str


class HistoryStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def corrupt_dir(self) -> Path:
        return self.root / "corrupt"

    def path_for(self, conv: Conversation) -> Path:
        return self.root / f"{conv.id}.jsonl"

    # -- writing ---------------------------------------------------------------------------------
    def save(self, conv: Conversation) -> Path:
        """Write the whole conversation to a temp file in the same folder, then rename it over."""
        lines = [json.dumps(conv.header_json(), ensure_ascii=False)]
        lines += [json.dumps(m.to_json(), ensure_ascii=False) for m in conv.messages]
        data = ("\n".join(lines) + "\n").encode("utf-8")
        target = self.path_for(conv)
        fd, tmp = tempfile.mkstemp(prefix=f".{conv.id}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return target

    def delete(self, conv: Conversation) -> None:
        try:
            self.path_for(conv).unlink()
        except FileNotFoundError:
            pass

    # -- reading ---------------------------------------------------------------------------------
    @staticmethod
    def parse(path: Path) -> Conversation:
        """Read one file; raise ValueError with a line number for anything wrong."""
        text = path.read_text(encoding="utf-8")
        rows = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
        if not rows:
            raise ValueError("the file is empty")
        objs = []
        for lineno, ln in rows:
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as e:
                raise ValueError(f"line {lineno} is not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"line {lineno} is not a JSON object")
            objs.append((lineno, obj))
        lineno, head = objs[0]
        if head.get("kind") != "conversation":
            raise ValueError("line 1 is not a conversation header")
        conv = Conversation(
            title=str(head.get("title") or "Untitled"),
            system_prompt=str(head.get("system_prompt") or ""),
            id=str(head.get("id") or path.stem),
        )
        for key in ("created", "updated"):
            if isinstance(head.get(key), (int, float)):
                setattr(conv, key, float(head[key]))
        for lineno, obj in objs[1:]:
            if obj.get("kind") != "message":
                raise ValueError(f"line {lineno} is not a message")
            try:
                conv.messages.append(Message.from_json(obj))
            except (ValueError, TypeError) as e:
                raise ValueError(f"line {lineno}: {e}") from None
        return conv

    def load_all(self) -> tuple[list[Conversation], list[CorruptFile]]:
        """Every readable conversation (newest first) and every file that had to be set aside."""
        convs: list[Conversation] = []
        bad: list[CorruptFile] = []
        for path in sorted(self.root.glob("*.jsonl")):
            try:
                conv = self.parse(path)
            except (OSError, UnicodeDecodeError, ValueError) as e:
                bad.append(self._set_aside(path, str(e)))
                continue
            if conv.id != path.stem:  # keep file name and id in step so saves go to the same file
                conv.id = path.stem
            convs.append(conv)
        convs.sort(key=lambda c: c.updated, reverse=True)
        return convs, bad

    def _set_aside(self, path: Path, reason: str) -> CorruptFile:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            self.corrupt_dir.mkdir(parents=True, exist_ok=True)
            dest = self.corrupt_dir / f"{path.name}.{stamp}"
            n = 1
            while dest.exists():
                dest = self.corrupt_dir / f"{path.name}.{stamp}.{n}"
                n += 1
            os.replace(path, dest)
        except OSError as e:
            return CorruptFile(path, None, f"{reason} (and it could not be moved aside: {e})")
        return CorruptFile(path, dest, reason)
