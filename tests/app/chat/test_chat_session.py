"""app/chat/session.py without a window (the module imports no Qt): a turn, its streamed text, stops, ends,
refusals, deletes, conflicts on disk and the kept step events, all against real history files."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from app.chat.model import CANCELLED, DONE, ERROR, INTERRUPTED, STREAMING
from app.chat.session import IGNORED, LATE, MAX_KEPT_REPLIES, NO_TEXT, TEXT, ChatSession
from app.chat.store import HistoryStore
from engine.events import StepEvent, TextPiece

ROOT = Path(__file__).resolve().parents[3]


def _ev(text: str = "", draft: bool = False, step: int = 1) -> StepEvent:
    return StepEvent(0, step, tokens=[1] if text else [], pieces=[TextPiece(text, draft)] if text else [])


def _session(root: Path, **kw) -> ChatSession:
    s = ChatSession(HistoryStore(root, **kw), **kw)
    s.current = s.load(None)
    return s


def test_the_session_imports_no_qt() -> None:
    code = "import sys, app.chat.session; print(any(m.startswith(('PySide6', 'shiboken6')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_turn_streams_finishes_and_is_there_after_a_restart(tmp_path: Path) -> None:
    s = _session(tmp_path)
    conv = s.current
    added = []
    turn = s.start_turn(conv, "What is 2+2?", chat_template=True, on_added=added.append)
    assert added == [turn.user, turn.reply] and turn.reply.status == STREAMING and turn.chat
    assert turn.prompt == [{"role": "user", "content": "What is 2+2?"}], "the chat so far, without the empty reply"
    assert conv.title == "What is 2+2?" and s.live_tag(conv) == turn.tag and s.live_tags() == [turn.tag]
    assert s.add_events(turn.tag, [_ev("Four", draft=True), _ev(".")]) == TEXT
    assert turn.reply.content == "Four." and turn.reply.pieces == [("Four", True), (".", False)]
    assert s.take_pending() == [(turn.reply, [("Four", True), (".", False)])] and s.take_pending() == []
    assert s.add_events(turn.tag, [_ev()]) == NO_TEXT, "a step without text leaves nothing to draw"
    ended = s.finish(turn.tag, "eos", {"tokens": 2, "source": "engine"})
    assert ended == (conv, turn.reply, False) and turn.reply.status == DONE and not s.streams
    assert s.finish(turn.tag, "eos", {}) is None, "an end for a reply no longer streaming changes nothing"

    again = _session(tmp_path)  # the app started again on the same data folder
    (back,) = again.conversations
    assert back.id == conv.id and back.title == conv.title
    assert [(m.role, m.content, m.status) for m in back.messages] == [("user", "What is 2+2?", DONE),
                                                                      ("assistant", "Four.", DONE)]
    assert back.messages[1].pieces == [("Four", True), (".", False)] and back.messages[1].stats["tokens"] == 2


def test_a_base_model_continues_the_text_itself(tmp_path: Path) -> None:
    s = _session(tmp_path)
    turn = s.start_turn(s.current, "def add(a, b):", chat_template=False)
    assert turn.prompt == "def add(a, b):" and not turn.chat


def test_a_stopped_reply_keeps_its_text_and_counts_the_late_steps(tmp_path: Path) -> None:
    s = _session(tmp_path)
    turn = s.start_turn(s.current, "Tell a story", chat_template=True)
    s.add_events(turn.tag, [_ev("Once")])
    s.take_pending()
    assert s.stop([turn.tag]) == [(s.current, turn.reply)] and s.stop([turn.tag]) == []
    assert turn.reply.status == CANCELLED and s.live_tag(s.current) is None and turn.tag in s.streams
    assert s.add_events(turn.tag, [_ev(" upon")]) == LATE
    assert turn.reply.content == "Once" and s.take_pending() == []
    assert len(s.events[turn.tag][1]) == 2, "the plots count the steps the engine ran before it saw the cancel"
    assert s.finish(turn.tag, "cancelled", {}) == (s.current, turn.reply, True)
    assert HistoryStore(tmp_path).parse(s.store.path_for(s.current)).messages[1].status == CANCELLED


def test_a_refused_turn_is_taken_back(tmp_path: Path) -> None:
    s = _session(tmp_path)
    conv = s.current
    first = s.start_turn(conv, "hello", chat_template=True)
    s.finish(first.tag, "eos", {})
    turn = s.start_turn(conv, "now with a bad setting", chat_template=True)
    assert s.end(turn.tag) == (conv, turn.reply)
    assert s.take_back(conv, turn.reply) == "now with a bad setting"
    assert conv.messages == [first.user, first.reply]
    assert [m.content for m in HistoryStore(tmp_path).parse(s.store.path_for(conv)).messages] == ["hello", ""]
    # A conversation the refusal leaves empty loses its file and its title.
    fresh = s.new_conversation()
    only = s.start_turn(fresh, "first words", chat_template=True)
    assert s.store.path_for(fresh).is_file()
    s.end(only.tag)
    assert s.take_back(fresh, only.reply) == "first words"
    assert not fresh.messages and fresh.title == "New conversation" and not s.store.path_for(fresh).exists()


def test_a_failed_reply_keeps_its_text_and_says_why(tmp_path: Path) -> None:
    s = _session(tmp_path)
    turn = s.start_turn(s.current, "hi", chat_template=True)
    s.add_events(turn.tag, [_ev("Hel")])
    assert s.fail(turn.tag, "the device went away") == (s.current, turn.reply)
    assert turn.reply.status == ERROR and turn.reply.error == "the device went away" and turn.reply.content == "Hel"
    assert s.add_events(turn.tag, [_ev("lo")]) == IGNORED


def test_deleting_a_streaming_conversation_cancels_it_and_its_late_end_writes_nothing(tmp_path: Path) -> None:
    s = _session(tmp_path)
    conv = s.current
    turn = s.start_turn(conv, "a long answer please", chat_template=True)
    path = s.store.path_for(conv)
    assert path.is_file()
    assert s.delete(conv) == [turn.tag] and s.current is None and conv not in s.conversations
    assert not path.exists()
    s.add_events(turn.tag, [_ev("late")])
    assert s.finish(turn.tag, "cancelled", {}) == (conv, turn.reply, True)
    assert not path.exists(), "the late end must not bring the file back"


def test_a_file_changed_on_disk_is_never_overwritten(tmp_path: Path) -> None:
    s = _session(tmp_path)
    conv = s.current
    s.finish(s.start_turn(conv, "mine", chat_template=True).tag, "eos", {})
    path = s.store.path_for(conv)
    other = HistoryStore(tmp_path)  # another program edits the same file
    (theirs,), _ = other.load_all()
    theirs.title = "edited elsewhere"
    other.save(theirs)
    notices, changed = [], []
    s.on_notice = lambda title, text: notices.append(title)
    s.on_list_changed = lambda: changed.append(True)
    conv.title = "renamed here"
    s.save(conv)
    assert notices == ["A conversation changed on disk: both versions kept"] and changed
    assert conv.id != theirs.id and conv.title == "renamed here (this window's copy)"
    assert [c.title for c in s.conversations] == ["renamed here (this window's copy)", "edited elsewhere"]
    assert HistoryStore(tmp_path).parse(path).title == "edited elsewhere"


def test_autosave_writes_only_conversations_that_got_text(tmp_path: Path) -> None:
    s = _session(tmp_path)
    a = s.current
    b = s.new_conversation()
    ta = s.start_turn(a, "one", chat_template=True)
    s.start_turn(b, "two", chat_template=True)
    saved = []
    real = s.store.save
    s.store.save = lambda conv: (saved.append(conv.id), real(conv))[1]
    s.add_events(ta.tag, [_ev("streamed text")])
    s.autosave()
    assert saved == [a.id]
    s.autosave()
    assert saved == [a.id], "nothing new since"
    assert HistoryStore(tmp_path).parse(s.store.path_for(a)).messages[1].content == "streamed text"


def test_a_reply_streaming_at_close_is_saved_as_cancelled_and_one_killed_loads_as_interrupted(tmp_path: Path) -> None:
    s = _session(tmp_path)
    turn = s.start_turn(s.current, "q", chat_template=True)
    s.add_events(turn.tag, [_ev("partial")])
    s.autosave()  # what a kill leaves behind: the reply saved while streaming
    killed = _session(tmp_path).conversations[0].messages[1]
    assert killed.status == INTERRUPTED and killed.content == "partial"
    s.close()
    closed = _session(tmp_path).conversations[0].messages[1]
    assert closed.status == CANCELLED and closed.finish_reason == "cancelled" and not s.streams


def test_a_read_only_session_writes_nothing(tmp_path: Path) -> None:
    s = _session(tmp_path, read_only=True)
    turn = s.start_turn(s.current, "hi", chat_template=True)
    s.finish(turn.tag, "eos", {})
    assert not list(tmp_path.glob("*.jsonl"))


def test_the_events_of_the_last_finished_replies_are_kept_for_the_plots(tmp_path: Path) -> None:
    s = _session(tmp_path)
    conv = s.current
    tags = []
    for i in range(MAX_KEPT_REPLIES + 3):
        turn = s.start_turn(conv, f"q{i}", chat_template=True)
        s.add_events(turn.tag, [_ev("a")])
        tags.append(turn.tag)
        s.finish(turn.tag, "eos", {})
    live = s.start_turn(conv, "streaming now", chat_template=True)
    elsewhere = s.start_turn(s.new_conversation(), "elsewhere", chat_template=True).tag
    s.finish(elsewhere, "eos", {})
    # 20 finished, the last MAX_KEPT_REPLIES kept; the streaming one always.
    assert set(s.events) == set(tags[4:]) | {elsewhere, live.tag}
    assert s.plotted_reply(conv) == live.tag, "the streaming reply first"
    s.finish(live.tag, "eos", {})
    assert s.plotted_reply(conv) == live.tag, "then the latest one whose steps are kept"
