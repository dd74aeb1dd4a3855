"""Nothing lost: one window per data folder, saves that never overwrite newer data, streaming replies saved
as they stream, stale temp files cleaned, a log file; and the window says what is in use and pending."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from PySide6.QtCore import Qt

from app.chat.model import CANCELLED, DONE, INTERRUPTED, Conversation, Message
from app.chat.store import HistoryConflict, HistoryStore
from app.fake_engine import fake_loader
from app.single_instance import InstanceGuard

REPO = Path(__file__).resolve().parents[2]


def _send(w, qtbot, text: str) -> None:
    w.input.setFocus()
    qtbot.keyClicks(w.input, text)
    qtbot.keyClick(w.input, Qt.Key.Key_Return)


# -- one window per data folder ------------------------------------------------------------------------
def test_the_lock_admits_one_owner_per_data_folder(tmp_path, qapp):
    a, b = InstanceGuard(tmp_path), InstanceGuard(tmp_path)
    other = InstanceGuard(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    try:
        assert a.acquire() and a.owner
        assert not b.acquire() and not b.owner
        assert str(os.getpid()) in b.holder()
        assert other.acquire(), "another data folder has its own lock"
        a.release()
        assert b.acquire(), "released: the next launch owns it"
    finally:
        for g in (a, b, other):
            g.release()


def _launch(home: Path) -> subprocess.Popen:
    env = {**os.environ, "DFLASH_STUDIO_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.Popen([sys.executable, "-m", "app", "--demo-engine"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_log(log: Path, text: str, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text(encoding="utf-8").count(text) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} x{count} never appeared in {log}:\n" + (log.read_text() if log.exists() else ""))


def test_a_second_launch_brings_the_first_forward_and_a_killed_owner_does_not_block(tmp_path):
    home = tmp_path / "launch-home"
    home.mkdir()
    log = home / "logs" / "dflash-studio.log"
    first = _launch(home)
    try:
        _wait_for_log(log, "this window owns the data folder")
        second = _launch(home)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, err
        assert "already open" in err and "brought forward" in err
        _wait_for_log(log, "asked this window to come forward")
        assert first.poll() is None, "the first window is still running"
        first.kill()  # a crash: the lock file stays behind, its process is gone
        first.wait(10)
        assert (home / "gui.lock").exists()
        third = _launch(home)
        try:
            _wait_for_log(log, "this window owns the data folder", count=2)
            assert third.poll() is None
        finally:
            third.kill()
            third.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


def test_a_read_only_window_says_so_and_writes_nothing(make_window, app_home, qtbot):
    hist = app_home / "history"
    hist.mkdir(exist_ok=True)
    (hist / ".abc.123.tmp").write_text("half a save")
    (hist / "broken.jsonl").write_text("{not json\n")
    w = make_window(read_only=True, lock_holder="process 4242 on host")
    assert w.readonly_banner.isVisible()
    assert "Read-only" in w.readonly_banner.label.text() and "process 4242" in w.readonly_banner.label.text()
    w.gen_panel.max_new_tokens.setValue(6)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _send(w, qtbot, "hello")
    assert w.current.messages[-1].status == DONE, "chatting works"
    assert {p.name for p in hist.glob("*.jsonl")} == {"broken.jsonl"}, "no conversation file written"
    assert (hist / ".abc.123.tmp").exists(), "the owner may be writing it: a read-only window leaves it"
    assert not (hist / "corrupt").exists(), "nor does it move the owner's files"


# -- saves never overwrite newer data ---------------------------------------------------------------------
def test_a_save_over_a_file_changed_since_it_was_read_raises_and_writes_nothing(tmp_path):
    a = HistoryStore(tmp_path)
    c = Conversation(title="shared")
    c.messages.append(Message("user", "one"))
    a.save(c)
    b = HistoryStore(tmp_path)
    (cb,), _ = b.load_all()
    cb.messages.append(Message("user", "two (from window B)"))
    b.save(cb)
    newer = a.path_for(c).read_text()
    c.messages.append(Message("user", "stale copy"))
    try:
        a.save(c)
    except HistoryConflict as e:
        assert e.path == a.path_for(c)
    else:
        raise AssertionError("the stale save must be refused")
    assert a.path_for(c).read_text() == newer


def test_the_window_keeps_both_versions_on_a_conflict(make_window, app_home, qtbot):
    w = make_window()
    w.gen_panel.max_new_tokens.setValue(6)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _send(w, qtbot, "first question")
    conv = w.current
    path = w.session.store.path_for(conv)
    other = HistoryStore(path.parent)  # another program (an old second window) saves the same file
    (theirs,), _ = other.load_all()
    theirs.messages.append(Message("user", "their message"))
    other.save(theirs)
    disk = path.read_text()
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _send(w, qtbot, "second question")
    assert path.read_text() == disk, "their newer file is untouched"
    assert conv.id != path.stem and "(this window's copy)" in conv.title
    mine = HistoryStore(path.parent).parse(w.session.store.path_for(conv))
    assert [m.content for m in mine.messages if m.role == "user"] == ["first question", "second question"]
    ids = [c.id for c in w.conversations]
    assert path.stem in ids and conv.id in ids, "both are listed"
    assert w.notice_banner.isVisible() and "both versions kept" in w.notice_banner.label.text()


# -- streaming replies saved as they stream; stale temp files cleaned ---------------------------------
def test_a_streaming_reply_is_on_disk_within_seconds_and_reloads_interrupted(make_window, app_home, qtbot):
    w = make_window({"tokens_per_second": 40.0})
    w.gen_panel.max_new_tokens.setValue(2000)
    _send(w, qtbot, "tell me a long story")
    reply = w.current.messages[-1]
    path = w.session.store.path_for(w.current)
    t0 = time.monotonic()
    # What a kill now would leave on disk: read it as the next start would.
    qtbot.waitUntil(lambda: len(HistoryStore.parse(path).messages[-1].content) > 0, timeout=6000)
    assert time.monotonic() - t0 < 5.0
    time.sleep(2.5)
    qtbot.wait(50)
    on_disk = HistoryStore.parse(path).messages[-1]
    assert on_disk.status == INTERRUPTED
    assert reply.content.startswith(on_disk.content)
    lost_s = (len(reply.content.split()) - len(on_disk.content.split())) / 40.0
    assert lost_s < 3.5, f"a kill now would lose {lost_s:.1f} s of the reply"
    assert on_disk.pieces and "".join(t for t, _ in on_disk.pieces) == on_disk.content
    w.stop()
    qtbot.waitUntil(lambda: not w.controller.generating, timeout=5000)
    assert HistoryStore.parse(path).messages[-1].status == CANCELLED


def test_stale_temp_files_of_killed_saves_are_removed_at_start(make_window, app_home):
    hist = app_home / "history"
    hist.mkdir(exist_ok=True)
    for i in range(3):
        (hist / f".abc{i}.x{i}.tmp").write_bytes(b"x" * 1000)
    keep = hist / "notes.tmp"  # not a temp file of ours (no leading dot)
    keep.write_text("mine")
    make_window(load=False)
    assert not list(hist.glob(".*.tmp")) and keep.exists()
    log = (app_home / "logs" / "dflash-studio.log").read_text()
    assert "removed 3 stale temp file(s) of killed saves (3000 bytes)" in log


# -- the log file ----------------------------------------------------------------------------------------
def test_the_log_file_is_in_the_data_folder_and_named_under_help(make_window, app_home, qtbot, monkeypatch):
    def fails(target, draft=None, device="CPU", **kw):
        if "broken" in str(target):
            raise RuntimeError("the target's IR could not be compiled")
        return fake_loader(tokens_per_second=0.0)(target, draft, device, **kw)

    w = make_window(loader=fails)
    log = app_home / "logs" / "dflash-studio.log"
    assert w.log_path == log and log.exists()
    assert str(log) in w.act_log_file.text()
    opened = []
    monkeypatch.setattr("app.main_window.QDesktopServices.openUrl", lambda url: opened.append(url.toLocalFile()) or True)
    assert w.open_log_folder() and opened == [str(log.parent)]
    broken = app_home / "broken-target"
    broken.mkdir()
    w.model_panel.set_target(str(broken))
    with qtbot.waitSignal(w.controller.load_failed, timeout=5000):
        w.model_panel.load_button.click()
    text = log.read_text()
    assert "loading failed" in text and "the target's IR could not be compiled" in text and "Traceback" in text


# -- the window says what is in use, what is pending, and why a message waits ----------------------------
def test_after_a_failed_load_the_panel_names_the_model_still_in_use(make_window, app_home, qtbot):
    def fails(target, draft=None, device="CPU", **kw):
        if "broken" in str(target):
            raise RuntimeError("no such IR")
        return fake_loader(tokens_per_second=0.0)(target, draft, device, **kw)

    w = make_window(loader=fails)
    mp = w.model_panel
    assert mp.load_state.text() == "In use: tiny-target + tiny-draft on CPU"
    broken = app_home / "broken-target"
    broken.mkdir()
    mp.set_target(str(broken))
    with qtbot.waitSignal(w.controller.load_failed, timeout=5000):
        mp.load_button.click()
    assert "Not loaded" not in mp.load_state.text()
    assert "Still in use: tiny-target + tiny-draft on CPU" in mp.load_state.text()
    assert "tiny-target" in w.device_label.text(), "the status line agrees"
    assert mp.pending_note.isVisible() and "target tiny-target → broken-target" in mp.pending_note.text()


def test_a_changed_draft_or_device_shows_pending_until_load(make_window, qtbot, model_dirs):
    w = make_window()
    mp = w.model_panel
    assert not mp.pending_note.isVisible() and mp.load_button.text() == "Load"
    mp.set_draft(None)
    assert mp.pending_note.isVisible()
    assert "draft tiny-draft → none (the target alone)" in mp.pending_note.text()
    assert mp.load_button.text() == "Load (apply)"
    assert mp.set_device("GPU.0")
    assert "device CPU → GPU.0" in mp.pending_note.text()
    mp.set_draft(str(model_dirs[1]))
    mp.set_device("CPU")
    assert not mp.pending_note.isVisible(), "back to what runs: nothing pending"
    mp.set_device("GPU.1")
    with qtbot.waitSignal(w.controller.loaded, timeout=5000):
        mp.load_button.click()
    assert not mp.pending_note.isVisible() and mp.load_state.text().startswith("In use:")


def test_the_still_streaming_refusal_shows_above_the_message_box(make_window, qtbot):
    w = make_window({"tokens_per_second": 100.0})
    w.gen_panel.max_new_tokens.setValue(300)
    _send(w, qtbot, "first")
    _send(w, qtbot, "second")
    assert w.input_notice.isVisible() and "still streaming" in w.input_notice.text()
    assert w.input.toPlainText() == "second", "the message stays in the box"
    w.stop()
    qtbot.waitUntil(lambda: not w.controller.generating, timeout=5000)
    assert not w.input_notice.isVisible(), "gone once the conversation can send again"


def test_after_a_stop_the_reply_and_the_plot_header_say_the_same_tokens_per_step(make_window, qtbot):
    for _ in range(3):
        w = make_window({"tokens_per_second": 300.0})
        w.gen_panel.max_new_tokens.setValue(2000)
        _send(w, qtbot, "go")
        reply = w.current.messages[-1]
        qtbot.waitUntil(lambda: len(reply.content) > 200, timeout=5000)
        w.stop()
        qtbot.waitUntil(lambda: not w.controller.generating, timeout=5000)
        qtbot.wait(50)
        shown = f"{reply.stats['tokens_per_step']:.2f} tokens/step"
        assert shown in w.chat.toPlainText()
        assert f"{reply.stats['tokens_per_step']:.2f} tokens per step" in w.plots.summary.text(), (
            w.plots.summary.text(), shown)
        assert w.plots.metrics.target_steps == reply.stats["target_steps"]
        w.close()
