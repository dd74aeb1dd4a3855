"""Conversation history: one JSONL file per conversation, written atomically, corrupt files set aside.

File layout (`<history_dir>/<id>.jsonl`): the first line is the conversation header
(`{"kind": "conversation", ...}`), then one line per message (`{"kind": "message", ...}`).
A file that cannot be read (bad JSON, or any field of the wrong type or range: app/chat/schema.py)
is moved to `<history_dir>/corrupt/` and reported; it is never deleted and never silently skipped.

No save overwrites newer data: the store remembers each file as it last read or wrote it (inode,
mtime, size: every save renames a new file over, so each save changes the inode), and a save finds
the file changed since raises HistoryConflict instead of writing. The window then keeps both (its
copy under a new id). Temp files of saves killed mid-write are removed at start (clean_stale_temp).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.chat import schema
from app.chat.model import Conversation, Message

log = logging.getLogger("dflash.history")
TEMP_GLOB = ".*.tmp"


@dataclass
class CorruptFile:
    path: Path  # where it was
    moved_to: Path | None  # where it is now (None if it could not be moved)
    reason: str


class HistoryConflict(Exception):
    """The file changed on disk since this store read or wrote it (another window saved it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} changed on disk since this window loaded it")
        self.path = path


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class HistoryStore:
    def __init__(self, root: Path, read_only: bool = False) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.read_only = read_only
        self._seen: dict[str, tuple[int, int, int] | None] = {}  # id -> the file as last read / written

    @property
    def corrupt_dir(self) -> Path:
        return self.root / "corrupt"

    def path_for(self, conv: Conversation) -> Path:
        return self.root / f"{conv.id}.jsonl"

    # -- writing ---------------------------------------------------------------------------------
    def save(self, conv: Conversation) -> Path:
        """Write the whole conversation to a temp file in the same folder, then rename it over.

        HistoryConflict (nothing written) when the file changed since this store last read or wrote it.
        """
        if self.read_only:
            raise PermissionError(f"{self.root} is open read-only (another DFlash Studio window owns it)")
        target = self.path_for(conv)
        now = _signature(target)
        if now is not None and self._seen.get(conv.id) != now:
            raise HistoryConflict(target)
        lines = [json.dumps(conv.header_json(), ensure_ascii=False)]
        lines += [json.dumps(m.to_json(), ensure_ascii=False) for m in conv.messages]
        data = ("\n".join(lines) + "\n").encode("utf-8")
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
        self._seen[conv.id] = _signature(target)
        return target

    def delete(self, conv: Conversation) -> None:
        if self.read_only:
            return
        self._seen.pop(conv.id, None)
        try:
            self.path_for(conv).unlink()
        except FileNotFoundError:
            pass

    def clean_stale_temp(self) -> tuple[int, int]:
        """Remove temp files left by saves that were killed mid-write: (files, bytes) removed.

        Only the instance that owns the folder calls this (a read-only second window must not: the
        owner may be writing one right now)."""
        n = size = 0
        for p in self.root.glob(TEMP_GLOB):
            try:
                b = p.stat().st_size
                p.unlink()
            except OSError as e:
                log.warning("could not remove the stale temp file %s: %s", p, e)
                continue
            n, size = n + 1, size + b
        if n:
            log.info("removed %d stale temp file(s) of killed saves (%d bytes) from %s", n, size, self.root)
        return n, size

    # -- reading ---------------------------------------------------------------------------------
    @staticmethod
    def parse(path: Path) -> Conversation:
        """Read one file; raise ValueError naming the line and field for anything wrong."""
        text = path.read_text(encoding="utf-8")
        rows = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
        if not rows:
            raise ValueError("the file is empty")
        objs = []
        for lineno, ln in rows:
            try:
                obj = schema.loads_line(ln)
            except schema.HistoryFormatError as e:
                raise ValueError(f"line {lineno}: {e}") from None
            except ValueError as e:  # json.JSONDecodeError, or an integer too long to read
                raise ValueError(f"line {lineno} is not valid JSON ({getattr(e, 'msg', e)})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"line {lineno} is not a JSON object")
            objs.append((lineno, obj))
        lineno, head = objs[0]
        if head.get("kind") != "conversation":
            raise ValueError("line 1 is not a conversation header")
        try:
            conv = Conversation(
                title=schema.text(head.get("title") or "Untitled", "title", schema.MAX_TITLE),
                system_prompt=schema.text(head.get("system_prompt") or "", "system_prompt"),
                id=path.stem,
            )
            if head.get("version") is not None:
                schema.number(head["version"], "version", 1, 1000, integer=True)
            if head.get("id") is not None:
                schema.identifier(head["id"], "id")
            for key in ("created", "updated"):
                if key in head:
                    setattr(conv, key, schema.timestamp(head[key], key))
        except schema.HistoryFormatError as e:
            raise ValueError(f"line 1: {e}") from None
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
            sig = _signature(path)
            try:
                conv = self.parse(path)
            except (OSError, UnicodeDecodeError, ValueError) as e:
                bad.append(self._set_aside(path, str(e)))
                continue
            except Exception as e:  # noqa: BLE001 - no file may stop the window from opening
                log.exception("unexpected error reading %s", path)
                bad.append(self._set_aside(path, f"it could not be read ({type(e).__name__}: {e})"))
                continue
            self._seen[conv.id] = sig  # conv.id is the file's stem: saves go to the same file
            convs.append(conv)
        convs.sort(key=lambda c: c.updated, reverse=True)
        return convs, bad

    def reload(self, path: Path) -> Conversation:
        """Read one file again (after a conflict) and remember it as read."""
        sig = _signature(path)
        conv = self.parse(path)
        self._seen[conv.id] = sig
        return conv

    def _set_aside(self, path: Path, reason: str) -> CorruptFile:
        log.warning("history file %s set aside: %s", path, reason)
        if self.read_only:
            return CorruptFile(path, None, f"{reason} (left where it is: this window is read-only)")
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
