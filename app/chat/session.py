"""The chat's state without Qt: the conversations, the replies streaming into them, and their saving.

MainWindow binds widgets to a `ChatSession` (the split napari makes between its ViewerModel and its Qt
window): the session decides what a send, an engine event, a stop, an end, a refusal or a delete does
to the conversations and their files; the window draws the result, runs the timers and talks to the
engine worker. Everything here runs on the GUI thread and is tested without a window.

A streaming reply is known by its tag, the id of its assistant message. Several conversations can
stream at once (the engine serves them in shared steps), each at most one reply. A reply the person
stopped keeps its tag until the engine's end arrives, so its late text is dropped while the steps the
engine still ran are counted. The step events of the streaming replies and of the last
MAX_KEPT_REPLIES finished ones are kept, so the live plots can replay any of them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from app.chat.model import CANCELLED, DONE, ERROR, STREAMING, Conversation, Message, new_id
from app.chat.store import CorruptFile, HistoryConflict, HistoryStore

MAX_KEPT_REPLIES = 16
log = logging.getLogger("dflash.chat")

# What add_events did with a batch (the window's cue for the plots and the text timer).
IGNORED, LATE, TEXT, NO_TEXT = "ignored", "late", "text", "no-text"


@dataclass
class Turn:
    """A sent message and the reply that streams into it: what the engine is asked for."""

    conversation: Conversation
    user: Message
    reply: Message
    prompt: Any  # chat messages (a model with a chat template) or the text itself (a base model continues it)
    chat: bool

    @property
    def tag(self) -> str:
        return self.reply.id


def _ignore(_title: str, _text: str) -> None:
    pass


class ChatSession:
    """Conversations, streaming replies and history files, for one window."""

    def __init__(self, store: HistoryStore, read_only: bool = False) -> None:
        self.store = store
        self.read_only = read_only  # another window owns this data folder: nothing is saved
        self.conversations: list[Conversation] = []
        self.current: Conversation | None = None  # the conversation on screen
        self.corrupt: list[CorruptFile] = []  # history files set aside at load
        self.streams: dict[str, tuple[Conversation, Message]] = {}  # tag -> where its text goes
        self.stopped: set[str] = set()  # tags the person stopped (their late text is dropped)
        self.events: dict[str, tuple[Conversation, list]] = {}  # tag -> its conversation and step events
        self.plot_tag: str | None = None  # the reply the live plots follow
        self._pending: dict[str, list[tuple[str, bool]]] = {}  # text not drawn yet, per tag
        self._unsaved: dict[str, Conversation] = {}  # conversations with streamed text since their save
        # What the window shows: a save that failed, and a notice (both versions of a file kept); each
        # (title, text). `on_list_changed`: the conversation list changed beyond a title.
        self.on_error: Callable[[str, str], None] = _ignore
        self.on_notice: Callable[[str, str], None] = _ignore
        self.on_list_changed: Callable[[], None] = lambda: None

    # -- conversations -----------------------------------------------------------------------------
    def load(self, last_id: str | None, system_prompt: str = "") -> Conversation:
        """Read the history (files that cannot be read are set aside, in `corrupt`) and return the
        conversation to show: the last one shown, else the newest, else a new one."""
        if not self.read_only:
            self.store.clean_stale_temp()
        self.conversations, self.corrupt = self.store.load_all()
        shown = self.find(last_id) or (self.conversations[0] if self.conversations else None)
        return shown or self.new_conversation(system_prompt)

    def find(self, conversation_id: str | None) -> Conversation | None:
        return next((c for c in self.conversations if c.id == conversation_id), None)

    def new_conversation(self, system_prompt: str = "") -> Conversation:
        """A new, empty conversation at the top of the list (no file until it has a message)."""
        conv = Conversation(system_prompt=system_prompt)
        self.conversations.insert(0, conv)
        return conv

    def rename(self, conv: Conversation, title: str) -> bool:
        title = title.strip()
        if not title or title == conv.title:
            return False
        conv.title = title
        self.save(conv)
        return True

    def delete(self, conv: Conversation) -> list[str]:
        """Remove a conversation and its file; returns the tags of its replies that the engine must cancel
        (they count as stopped, and their late end writes no file back)."""
        tags = [t for t, (c, _m) in self.streams.items() if c is conv]
        self.stopped.update(tags)
        self.store.delete(conv)
        self.conversations = [c for c in self.conversations if c is not conv]
        if self.current is conv:
            self.current = None
        return tags

    # -- saving ------------------------------------------------------------------------------------
    def save(self, conv: Conversation) -> None:
        """Write a conversation's file (atomically, app/chat/store.py). Never over a file another program
        changed since it was read: then this session's version is kept as a new conversation beside it."""
        if not conv.messages and not conv.system_prompt:
            return  # nothing worth a file yet
        if not any(c is conv for c in self.conversations):
            return  # deleted while its reply was streaming: its late end must not bring the file back
        self._unsaved.pop(conv.id, None)
        if self.read_only:
            return
        conv.updated = time.time()
        try:
            self.store.save(conv)
        except HistoryConflict as c:
            self._keep_both(conv, c.path)
        except OSError as e:
            log.error("saving %s failed: %s", self.store.path_for(conv), e)
            self.on_error("Could not save the conversation", f"Writing {self.store.path_for(conv)} failed: {e}. "
                          "The conversation stays open; try again after freeing space.")

    def _keep_both(self, conv: Conversation, path: Path) -> None:
        """The file changed on disk since it was read: this session's version becomes a new conversation
        (new file) and the one on disk is listed beside it."""
        old_title = conv.title
        conv.id = new_id()
        conv.title = f"{old_title} (this window's copy)"
        try:
            self.store.save(conv)
        except (OSError, HistoryConflict) as e:
            log.error("saving the copy of %s failed: %s", path, e)
            self.on_error("Could not save the conversation", f"Writing a copy of {path} failed: {e}.")
            return
        try:
            disk = self.store.reload(path)
        except (OSError, ValueError) as e:
            disk = None
            log.warning("the changed file %s could not be read back: %s", path, e)
        if disk is not None and self.find(disk.id) is None:
            at = next(i for i, c in enumerate(self.conversations) if c is conv)
            self.conversations.insert(at + 1, disk)
        elif disk is not None:
            self.conversations = [disk if c.id == disk.id and c is not conv else c for c in self.conversations]
        self.on_list_changed()
        log.warning("%s changed on disk since it was loaded; this window's version saved as %s", path,
                    self.store.path_for(conv))
        self.on_notice("A conversation changed on disk: both versions kept",
                       f"“{old_title}” was saved by another program since this window loaded it ({path.name}). "
                       f"Nothing was overwritten: this window's version is now “{conv.title}”.")

    def autosave(self) -> None:
        """Save the conversations whose streaming replies got text since their last save."""
        pending, self._unsaved = self._unsaved, {}
        for conv in pending.values():
            self.save(conv)

    def close(self) -> None:
        """The window closes: streaming replies end as cancelled, and every touched conversation is saved."""
        for _conv, msg in self.streams.values():
            if msg.status == STREAMING:
                msg.status = CANCELLED
                msg.finish_reason = "cancelled"
        self._pending.clear()
        for conv in {id(c): c for c, _m in self.streams.values()}.values():
            self.save(conv)
        if self.current is not None:
            self.save(self.current)
        self.streams.clear()

    # -- streaming replies -------------------------------------------------------------------------
    def live_tag(self, conv: Conversation) -> str | None:
        """The tag of `conv`'s streaming reply (not stopped), if it has one."""
        return next((t for t, (c, _m) in self.streams.items() if c is conv and t not in self.stopped), None)

    def live_tags(self) -> list[str]:
        return [t for t in self.streams if t not in self.stopped]

    def streaming_ids(self) -> set[str]:
        """Ids of the conversations with a live reply (the list's dots)."""
        return {c.id for t, (c, _m) in self.streams.items() if t not in self.stopped}

    def is_live(self, tag: str | None) -> bool:
        return tag in self.streams and tag not in self.stopped

    def start_turn(self, conv: Conversation, text: str, chat_template: bool,
                   on_added: Callable[[Message], None] = lambda _m: None) -> Turn:
        """Append the person's message and an empty streaming reply (each handed to `on_added` as it is
        appended, for the view), title a new conversation after it, save, and say what to generate:
        the chat so far for a model with a chat template, else the text alone (a base model continues it)."""
        user = Message("user", text)
        conv.messages.append(user)
        on_added(user)
        prompt: Any = conv.chat_messages() if chat_template else text
        reply = Message("assistant", status=STREAMING)
        conv.messages.append(reply)
        on_added(reply)
        conv.auto_title()
        self.streams[reply.id] = (conv, reply)
        self.events[reply.id] = (conv, [])
        self.save(conv)
        return Turn(conv, user, reply, prompt, chat_template)

    def stop(self, tags: list[str]) -> list[tuple[Conversation, Message]]:
        """The person stopped these replies: their text ends here (marked cancelled, saved); the engine's
        late text for them is dropped. Returns the stopped replies (the view redraws them)."""
        out = []
        for tag in tags:
            if tag not in self.streams or tag in self.stopped:
                continue
            self.stopped.add(tag)
            conv, msg = self.streams[tag]
            msg.status = CANCELLED
            msg.finish_reason = "cancelled"
            self._pending.pop(tag, None)
            self.save(conv)
            out.append((conv, msg))
        return out

    def add_events(self, tag: str, events: list) -> str:
        """A batch of the engine's step events for `tag`. Its text goes into the reply at once (the model is
        always up to date) and waits for the view in `take_pending`; the events are kept for the plots.
        Returns IGNORED (no such reply), LATE (a stopped reply: counted, not shown), TEXT (text waits for
        the view) or NO_TEXT (nothing to draw yet)."""
        entry = self.streams.get(tag)
        if entry is None:
            return IGNORED
        kept = self.events.get(tag)
        if kept is not None:
            kept[1].extend(events)
        if tag in self.stopped:
            # The text stopped at the click, but the engine ran these steps before it saw the cancel: the
            # plots count them, as the engine's metrics under the reply do (one tokens-per-step).
            return LATE
        conv, msg = entry
        self._unsaved[conv.id] = conv
        new = self._pending.setdefault(tag, [])
        for ev in events:
            for p in ev.pieces:
                if p.text:
                    msg.append_piece(p.text, p.from_draft)
                    new.append((p.text, p.from_draft))
        return TEXT if new else NO_TEXT

    def take_pending(self) -> list[tuple[Message, list[tuple[str, bool]]]]:
        """The text that arrived since the last call, per streaming reply (for one view update each)."""
        pending, self._pending = self._pending, {}
        return [(self.streams[t][1], pieces) for t, pieces in pending.items() if t in self.streams and pieces]

    def finish(self, tag: str, reason: str, stats: dict[str, Any] | None) -> tuple[Conversation, Message, bool] | None:
        """The engine ended a reply: its stats and end are recorded and saved. Returns (conversation, reply,
        whether the person had stopped it), or None for a reply this session no longer streams."""
        entry = self.streams.pop(tag, None)
        self._forget_old_events()
        was_stopped = tag in self.stopped
        self.stopped.discard(tag)
        if entry is None:
            return None
        conv, msg = entry
        msg.stats = stats or None
        msg.finish_reason = reason
        msg.status = CANCELLED if (was_stopped or reason == "cancelled") else DONE
        self.save(conv)
        return conv, msg, was_stopped

    def fail(self, tag: str, message: str) -> tuple[Conversation, Message] | None:
        """The engine failed a reply after it started: the reply keeps its text and says why."""
        entry = self.end(tag)
        if entry is None:
            return None
        conv, msg = entry
        msg.status = ERROR
        msg.error = message
        self.save(conv)
        return entry

    def end(self, tag: str) -> tuple[Conversation, Message] | None:
        """Stop tracking a reply (the engine is done with it), nothing recorded; its entry, if any."""
        entry = self.streams.pop(tag, None)
        self._forget_old_events()
        self.stopped.discard(tag)
        return entry

    def take_back(self, conv: Conversation, reply: Message) -> str:
        """The engine refused a turn before any step: the reply and its message go, the conversation is as
        before (a conversation left empty loses its file and title). Returns the message's text, to be
        put back where the person types."""
        i = next((j for j, m in enumerate(conv.messages) if m is reply), None)
        text = ""
        if i is not None:
            del conv.messages[i]
            if i > 0 and conv.messages[i - 1].role == "user":
                text = conv.messages.pop(i - 1).content
        if not conv.messages:
            conv.title = "New conversation"
            self.store.delete(conv)
        else:
            self.save(conv)
        return text

    def _forget_old_events(self) -> None:
        """Keep the events of the streaming replies and of the last MAX_KEPT_REPLIES finished ones."""
        done = [t for t in self.events if t not in self.streams]
        for t in done[: max(0, len(done) - MAX_KEPT_REPLIES)]:
            del self.events[t]

    def plotted_reply(self, conv: Conversation) -> str | None:
        """The reply the live plots should follow while `conv` is shown: its streaming one, else its latest
        one whose events are kept (None: the plots keep what they show)."""
        return self.live_tag(conv) or next((m.id for m in reversed(conv.messages) if m.id in self.events), None)
