"""Stop mid-stream (button and Esc), and closing the window while a reply streams."""
from __future__ import annotations

import json
import threading

from PySide6.QtCore import Qt

from app.chat.model import CANCELLED, DONE


def _wait_for_text(qtbot, w, n_chars: int = 20) -> None:
    qtbot.waitUntil(lambda: len(w.current.messages) == 2 and len(w.current.messages[1].content) >= n_chars,
                    timeout=5000)


def test_stop_button_cancels_at_once(make_window, qtbot):
    w = make_window({"tokens_per_second": 200.0})
    w.gen_panel.max_new_tokens.setValue(5000)
    assert w.send("tell me everything")
    _wait_for_text(qtbot, w)
    reply = w.current.messages[1]
    with qtbot.waitSignal(w.controller.finished, timeout=5000) as blocker:
        w.stop_button.click()
        # At once: the reply is marked stopped and no more text is shown, before the engine answers.
        assert reply.status == CANCELLED
        frozen = reply.content
        assert "Stopped." in w.chat.toPlainText()
        assert not w.stop_button.isEnabled() and w.send_button.isEnabled()
    tag, fin = blocker.args
    assert fin.reason == "cancelled"
    assert reply.content == frozen and reply.status == CANCELLED
    assert reply.stats and reply.stats["tokens"] >= len(frozen.split())
    pipe = w.controller._worker._pipe
    assert not pipe.has_unfinished()
    calls = pipe.step_calls
    qtbot.wait(100)
    assert pipe.step_calls == calls, "the engine keeps stepping after the cancel"
    assert len(reply.content.split()) < 5000


def test_esc_stops_and_the_next_message_works(make_window, qtbot, app_home):
    w = make_window({"tokens_per_second": 200.0})
    w.gen_panel.max_new_tokens.setValue(5000)
    assert w.send("first")
    _wait_for_text(qtbot, w)
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        qtbot.keyClick(w.input, Qt.Key.Key_Escape)
    assert w.current.messages[1].status == CANCELLED
    w.gen_panel.max_new_tokens.setValue(10)
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        assert w.send("second")
    assert [m.status for m in w.current.messages[1::2]] == [CANCELLED, DONE]
    # The stopped reply is saved as stopped, with its text.
    (f,) = (app_home / "history").glob("*.jsonl")
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    assert rows[2]["status"] == "cancelled" and rows[2]["content"]


def test_send_right_after_stop_is_queued_behind_the_cancel(make_window, qtbot):
    w = make_window({"tokens_per_second": 100.0})
    w.gen_panel.max_new_tokens.setValue(3000)
    assert w.send("one")
    _wait_for_text(qtbot, w, 5)
    w.stop()
    w.gen_panel.max_new_tokens.setValue(6)
    assert w.send("two")  # accepted at once; the worker starts it after the cancel is through
    qtbot.waitUntil(lambda: not w.session.streams, timeout=5000)
    statuses = [(m.role, m.status) for m in w.current.messages]
    assert statuses == [("user", DONE), ("assistant", CANCELLED), ("user", DONE), ("assistant", DONE)]
    assert w.current.messages[3].stats["tokens"] == 6


def test_closing_while_generating_shuts_down_cleanly(make_window, qtbot, app_home):
    w = make_window({"tokens_per_second": 200.0})
    w.gen_panel.max_new_tokens.setValue(100000)
    assert w.send("a very long answer please")
    _wait_for_text(qtbot, w)
    thread = w.controller.thread
    assert thread.isRunning()
    before = threading.active_count()
    w.close()
    assert not thread.isRunning()
    assert threading.active_count() <= before
    (f,) = (app_home / "history").glob("*.jsonl")
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    assert rows[2]["status"] == "cancelled" and len(rows[2]["content"]) >= 20
    assert w.controller._worker._pipe is None, "the engine is released after the thread stopped"
