"""Replies streaming in several conversations at once: the worker pumps every live request through
shared engine steps, and the window keeps each reply's text in its own conversation.

The fake-engine tests check the window and the worker's routing; the `-m slow` tests run the real
engine on the tiny Qwen3 fixture (greedy, f32) and check that every reply is token for token what
its prompt gives alone, that the requests shared steps, and that a stop or a refused setting in one
conversation leaves the other alone.
"""
from __future__ import annotations

import json
import threading

import pytest
from PySide6.QtCore import Qt

from app.chat.model import CANCELLED, DONE, ERROR
from app.fake_engine import SAMPLE_TEXT, FakePipeline

WORDS = SAMPLE_TEXT.split()


def _expected_words(n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        out.extend(WORDS)
    return out[:n]


def _send_in_new_conversation(w, text: str) -> None:
    w.new_conversation()
    assert w.send(text)


def _redraw_is_same(w) -> bool:
    """The incrementally drawn chat equals a fresh drawing from the model (no text twice or lost)."""
    shown = w.chat.toPlainText()
    w.chat.render()
    return w.chat.toPlainText() == shown


# -- fake engine -----------------------------------------------------------------------------------

def test_two_conversations_stream_at_once_and_land_in_their_own_messages(make_window, qtbot, app_home):
    w = make_window({"tokens_per_second": 400.0})
    w.gen_panel.max_new_tokens.setValue(300)
    assert w.send("first question")
    conv_a, reply_a = w.current, w.current.messages[-1]
    w.gen_panel.max_new_tokens.setValue(200)
    _send_in_new_conversation(w, "second question")
    conv_b, reply_b = w.current, w.current.messages[-1]
    assert conv_a is not conv_b
    assert w.controller.generating and len(w.session.live_tags()) == 2
    assert "Generating 2 replies" in w.state_label.text()
    # Both conversations are marked as streaming in the list.
    marked = [w.conv_list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(w.conv_list.count())
              if not w.conv_list.item(i).icon().isNull()]
    assert sorted(marked) == sorted([conv_a.id, conv_b.id])
    # Both grow while B is on screen.
    qtbot.waitUntil(lambda: len(reply_a.content) > 40 and len(reply_b.content) > 40, timeout=10000)
    assert "first question" not in w.chat.toPlainText()
    # Switch back and forth while they stream: the view follows the conversation on screen.
    w.select_conversation(conv_a)
    assert "first question" in w.chat.toPlainText() and "second question" not in w.chat.toPlainText()
    qtbot.wait(60)
    w.select_conversation(conv_b)
    qtbot.wait(60)
    w.select_conversation(conv_a)
    qtbot.waitUntil(lambda: not w.session.streams, timeout=20000)
    assert reply_a.status == DONE and reply_b.status == DONE
    assert reply_a.content.split() == _expected_words(300)
    assert reply_b.content.split() == _expected_words(200)
    assert reply_a.stats["tokens"] == 300 and reply_b.stats["tokens"] == 200
    # What the view shows is the conversation on screen, drawn once.
    assert reply_a.content.strip() in w.chat.toPlainText() and _redraw_is_same(w)
    w.select_conversation(conv_b)
    assert reply_b.content.strip() in w.chat.toPlainText() and "first question" not in w.chat.toPlainText()
    assert all(w.conv_list.item(i).icon().isNull() for i in range(w.conv_list.count()))
    # Each conversation's file has its own reply.
    for conv, reply in ((conv_a, reply_a), (conv_b, reply_b)):
        rows = [json.loads(x) for x in (app_home / "history" / f"{conv.id}.jsonl").read_text().splitlines()]
        assert rows[2]["content"] == reply.content and rows[2]["status"] == "done"
    # The worker served them together: both were live in one engine.
    assert len(w.controller._worker._pipe.prompts) == 2


def test_second_message_in_the_same_conversation_is_refused_while_its_reply_streams(make_window, qtbot):
    w = make_window({"tokens_per_second": 200.0})
    w.gen_panel.max_new_tokens.setValue(3000)
    assert w.send("one")
    conv = w.current
    assert not w.send_button.isEnabled() and w.stop_button.isEnabled()
    w.input.setPlainText("two")
    w.input.submit()
    assert len(conv.messages) == 2 and w.input.toPlainText() == "two"  # kept in the box
    assert "This conversation's reply is still streaming" in w.state_label.text()
    assert "other conversations can chat" in w.state_label.text()
    # Another conversation can send meanwhile.
    w.new_conversation()
    assert w.send_button.isEnabled() and not w.stop_button.isEnabled()
    w.gen_panel.max_new_tokens.setValue(10)
    with qtbot.waitSignal(w.controller.finished, timeout=10000) as b:
        assert w.send("three")
    assert b.args[0] == w.current.messages[-1].id and w.current.messages[-1].status == DONE
    assert conv.messages[-1].status not in (DONE, CANCELLED)  # the long one still streams
    w.select_conversation(conv)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        qtbot.keyClick(w.input, Qt.Key.Key_Escape)


def test_stop_stops_only_the_conversation_on_screen(make_window, qtbot):
    w = make_window({"tokens_per_second": 300.0})
    w.gen_panel.max_new_tokens.setValue(5000)
    assert w.send("long one")
    conv_a, reply_a = w.current, w.current.messages[-1]
    w.gen_panel.max_new_tokens.setValue(150)
    _send_in_new_conversation(w, "short one")
    conv_b, reply_b = w.current, w.current.messages[-1]
    qtbot.waitUntil(lambda: len(reply_a.content) > 20 and len(reply_b.content) > 20, timeout=10000)
    w.select_conversation(conv_a)
    with qtbot.waitSignal(w.controller.finished, timeout=10000) as b:
        w.stop_button.click()
        assert reply_a.status == CANCELLED and reply_b.status not in (DONE, CANCELLED)
        assert "1 reply in other conversations still streaming" in w.state_label.text()
        assert not w.stop_button.isEnabled() and w.send_button.isEnabled()
    assert b.args[0] == reply_a.id and b.args[1].reason == "cancelled"
    qtbot.waitUntil(lambda: not w.session.streams, timeout=10000)
    assert reply_b.status == DONE and reply_b.content.split() == _expected_words(150)
    assert reply_a.status == CANCELLED and len(reply_a.content.split()) < 5000
    assert "short one" in w.state_label.text() and "done" in w.state_label.text()


def test_esc_stops_the_current_one_and_loading_stops_all(make_window, qtbot, model_dirs):
    w = make_window({"tokens_per_second": 300.0})
    w.gen_panel.max_new_tokens.setValue(5000)
    assert w.send("a")
    reply_a = w.current.messages[-1]
    _send_in_new_conversation(w, "b")
    reply_b = w.current.messages[-1]
    _send_in_new_conversation(w, "c")
    reply_c = w.current.messages[-1]
    qtbot.waitUntil(lambda: all(len(r.content) > 10 for r in (reply_a, reply_b, reply_c)), timeout=10000)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        qtbot.keyClick(w.input, Qt.Key.Key_Escape)
    assert reply_c.status == CANCELLED and len(w.session.live_tags()) == 2
    # Loading a model stops every reply first.
    with qtbot.waitSignal(w.controller.loaded, timeout=10000):
        w.model_panel.load_button.click()
        assert reply_a.status == CANCELLED and reply_b.status == CANCELLED
    qtbot.waitUntil(lambda: not w.session.streams and not w.controller.generating, timeout=10000)


def test_plots_follow_the_conversation_on_screen(make_window, qtbot):
    w = make_window({"tokens_per_second": 300.0})
    w.gen_panel.max_new_tokens.setValue(4000)
    assert w.send("plotted first")
    conv_a, reply_a = w.current, w.current.messages[-1]
    qtbot.waitUntil(lambda: w.plots.tokens.n > 5, timeout=10000)
    assert w.session.plot_tag == reply_a.id and "plotted first" in w.plots_dock.windowTitle()
    _send_in_new_conversation(w, "plotted second")
    reply_b = w.current.messages[-1]
    assert w.session.plot_tag == reply_b.id and "plotted second" in w.plots_dock.windowTitle()
    qtbot.waitUntil(lambda: w.plots.tokens.n > 3, timeout=10000)
    n_a = len([e for e in w.session.events[reply_a.id][1] if e.step > 0 and (e.tokens or e.drafted)])
    w.select_conversation(conv_a)  # replayed: the plots show A's steps so far, then keep following A
    assert w.session.plot_tag == reply_a.id and w.plots.tokens.n >= n_a > 5
    assert list(w.plots.steps.view()[:3]) == [1.0, 2.0, 3.0]
    w.stop()
    conv_b = w.conversations[0]
    w.select_conversation(conv_b)
    w.stop()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=10000)
    assert not w.plots.timer_active and w.session.plot_tag == reply_b.id
    # A finished reply's steps come back with its conversation; a conversation without one keeps them.
    w.select_conversation(conv_a)
    assert w.session.plot_tag == reply_a.id and w.plots.tokens.n >= n_a and not w.plots.timer_active
    w.new_conversation()
    assert w.session.plot_tag == reply_a.id and "plotted first" in w.plots_dock.windowTitle()


def test_a_failing_step_fails_every_live_reply_and_the_app_goes_on(make_window, qtbot):
    w = make_window({"tokens_per_second": 300.0, "fail_on_step": 40})
    w.gen_panel.max_new_tokens.setValue(5000)
    assert w.send("a")
    conv_a, reply_a = w.current, w.current.messages[-1]
    _send_in_new_conversation(w, "b")
    reply_b = w.current.messages[-1]
    failed: list[str] = []
    w.controller.failed.connect(lambda tag, err: failed.append(tag))
    qtbot.waitUntil(lambda: len(failed) == 2, timeout=10000)
    assert set(failed) == {reply_a.id, reply_b.id}
    assert reply_a.status == ERROR and reply_b.status == ERROR and reply_a.content and reply_b.content
    assert "fake engine failure" in (reply_a.error or "") and w.error_banner.isVisible()
    assert not w.session.streams and not w.controller.generating
    w.controller._worker._pipe.fail_on_step = None
    w.gen_panel.max_new_tokens.setValue(20)
    w.select_conversation(conv_a)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        assert w.send("again")
    assert [m.status for m in conv_a.messages] == [DONE, ERROR, DONE, DONE]


def test_an_engine_refusal_in_one_conversation_leaves_the_other_streaming(make_window, qtbot):
    w = make_window({"tokens_per_second": 300.0, "draft_variant": "dflash_v2", "draft_head_top_k": 8})
    w.gen_panel.max_new_tokens.setValue(400)
    assert w.send("fine")
    reply_a = w.current.messages[-1]
    w.new_conversation()
    conv_b = w.current
    w.gen_panel.markov_top_k.setValue(0)  # DFlash v2 refuses this in add_request
    with qtbot.waitSignal(w.controller.failed, timeout=10000):
        assert w.send("refused")
    assert conv_b.messages == [] and w.input.toPlainText() == "refused"
    assert "markov_head_top_k=0" in w.gen_panel.field_error("markov_head_top_k")
    assert reply_a.id in w.session.live_tags()
    qtbot.waitUntil(lambda: not w.session.streams, timeout=10000)
    assert reply_a.status == DONE and reply_a.content.split() == _expected_words(400)


class SerialFake(FakePipeline):
    """Serves one request at a time and drops a queued request on cancel without an event, as
    engine.genai_target.GenAITargetPipeline (the NPU path) does."""

    def step(self):
        live = [r for r in self._requests.values() if not r.finished]
        if not live:
            return []
        saved, self._requests = self._requests, {live[0].rid: live[0]}
        try:
            return super().step()
        finally:
            self._requests = saved

    def cancel(self, request_id: int) -> None:
        live = [r for r in self._requests.values() if not r.finished]
        if live and live[0].rid == request_id:
            super().cancel(request_id)
        else:
            self._requests.pop(request_id, None)


def test_an_engine_that_serves_one_request_at_a_time_serves_them_in_turn(make_window, qtbot):
    w = make_window(loader=lambda t, d=None, device="CPU", **kw: SerialFake(t, None, device, tokens_per_second=300.0),
                    draft=False)
    w.gen_panel.max_new_tokens.setValue(600)
    assert w.send("first")
    reply_a = w.current.messages[-1]
    _send_in_new_conversation(w, "second")
    reply_b = w.current.messages[-1]
    w.gen_panel.max_new_tokens.setValue(5000)
    _send_in_new_conversation(w, "third, cancelled while it waits")
    conv_c, reply_c = w.current, w.current.messages[-1]
    qtbot.waitUntil(lambda: len(reply_a.content) > 0, timeout=10000)
    assert reply_b.content == "" and reply_c.content == ""  # waiting for their turn
    with qtbot.waitSignal(w.controller.finished, timeout=5000) as b:
        w.stop()  # the queued one: the engine drops it silently, the worker ends it at its next step
    assert b.args[0] == reply_c.id and b.args[1].reason == "cancelled"
    assert reply_a.status not in (DONE, CANCELLED)
    qtbot.waitUntil(lambda: not w.session.streams, timeout=20000)
    assert reply_a.status == DONE and reply_b.status == DONE and reply_c.status == CANCELLED
    assert reply_a.content.split() == _expected_words(600) == reply_b.content.split()
    assert reply_c.content == "" and conv_c.messages[-1] is reply_c


def test_deleting_a_conversation_while_it_streams_does_not_bring_its_file_back(make_window, qtbot, app_home):
    w = make_window({"tokens_per_second": 300.0})
    w.gen_panel.max_new_tokens.setValue(5000)
    assert w.send("keep me")
    kept = w.current
    _send_in_new_conversation(w, "delete me")
    gone = w.current
    qtbot.waitUntil(lambda: len(gone.messages[-1].content) > 10, timeout=10000)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        w.delete_current(confirm=False)
    assert not (app_home / "history" / f"{gone.id}.jsonl").exists()
    assert kept.messages[-1].status not in (DONE, CANCELLED)
    w.select_conversation(kept)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        w.stop()
    assert [f.stem for f in (app_home / "history").glob("*.jsonl")] == [kept.id]


def test_closing_with_two_replies_streaming_stops_both(make_window, qtbot, app_home):
    w = make_window({"tokens_per_second": 300.0})
    w.gen_panel.max_new_tokens.setValue(100000)
    assert w.send("a")
    reply_a = w.current.messages[-1]
    _send_in_new_conversation(w, "b")
    reply_b = w.current.messages[-1]
    qtbot.waitUntil(lambda: len(reply_a.content) > 10 and len(reply_b.content) > 10, timeout=10000)
    thread = w.controller.thread
    w.close()
    assert not thread.isRunning()
    for reply in (reply_a, reply_b):
        assert reply.status == CANCELLED
    saved = {}
    for f in (app_home / "history").glob("*.jsonl"):
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        saved[rows[1]["content"]] = rows[2]
    assert sorted(saved) == ["a", "b"]
    for reply in saved.values():
        assert reply["status"] == "cancelled" and len(reply["content"]) > 10


# -- real engine (tiny Qwen3 fixture, greedy, f32) -------------------------------------------------

class Instrumented:
    """Records what the worker asks the real engine, and can hold it before a step (so the test
    knows two requests are queued before the first one could finish)."""

    def __init__(self, factory=None, **load_kw) -> None:
        self.factory = factory  # (target, draft, device) -> engine; None: the app's default loader
        self.load_kw = load_kw
        self.pipe = None
        self.added: list[tuple[int, object, object, object]] = []  # rid, prompt, config, chat
        self.step_requests: list[list[int]] = []
        self.go = threading.Event()
        self.go.set()

    def loader(self, target, draft=None, device="CPU", **kw):
        from app.worker import default_loader

        pipe = (self.factory(target, draft, device) if self.factory is not None
                else default_loader(target, draft, device=device, precision="f32", **self.load_kw))
        add, step = pipe.add_request, pipe.step

        def add_request(prompt, config=None, chat=None):
            rid = add(prompt, config, chat)
            self.added.append((rid, prompt, config, chat))
            return rid

        def held_step():
            assert self.go.wait(60), "the test never let the engine go on"
            events = step()
            self.step_requests.append(list(getattr(getattr(pipe, "last_step", None), "requests", [])))
            return events

        pipe.add_request, pipe.step = add_request, held_step
        self.pipe = pipe
        return pipe

    def solo(self, target, draft):
        """Each recorded request run alone on a fresh engine: {rid: GenerationResult}."""
        from engine.pipeline import SpeculativePipeline

        fresh = SpeculativePipeline.load(target, draft, precision="f32")
        return {rid: fresh.generate(prompt, config, chat) for rid, prompt, config, chat in self.added}


def _real_window(make_window, qtbot, inst, target, draft):
    w = make_window(load=False, loader=inst.loader, validator=None)
    w.model_panel.set_target(str(target))
    w.model_panel.set_draft(str(draft) if draft else None)
    assert w.model_panel.problems() == []
    with qtbot.waitSignal(w.controller.loaded, timeout=120000):
        w.model_panel.load_button.click()
    w.gen_panel.system_prompt.setPlainText("")
    w.gen_panel.greedy_radio.click()  # these compare with the engine's own greedy output
    return w


@pytest.mark.slow
@pytest.mark.parametrize("with_draft", [False, True], ids=["target-alone", "b8-trained-draft"])
def test_real_two_conversations_share_steps_and_match_their_solo_output(make_window, qtbot, request,
                                                                         tiny_qwen3_target, with_draft):
    draft = request.getfixturevalue("tiny_qwen3_drafts")["b8_trained"] if with_draft else None
    inst = Instrumented()
    w = _real_window(make_window, qtbot, inst, tiny_qwen3_target, draft)
    w.gen_panel.max_new_tokens.setValue(48)
    finished: dict[str, object] = {}
    started: dict[str, int] = {}
    w.controller.finished.connect(lambda tag, fin: finished.__setitem__(tag, fin))
    w.controller.started.connect(lambda tag, rid: started.__setitem__(tag, rid))
    inst.go.clear()  # the engine waits before its first step until both are queued
    assert w.send("Write a loop over a list.")
    conv_a, reply_a = w.current, w.current.messages[-1]
    w.gen_panel.max_new_tokens.setValue(40)
    _send_in_new_conversation(w, "def fibonacci(n):")
    conv_b, reply_b = w.current, w.current.messages[-1]
    assert len(w.controller.pending_tags) == 2
    inst.go.set()
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=120000)
    assert reply_a.status == DONE and reply_b.status == DONE and reply_a.content and reply_b.content
    # Shared steps: one engine step served both requests.
    assert max(len(r) for r in inst.step_requests) == 2, inst.step_requests
    # Each reply is exactly what its prompt gives alone (greedy, f32).
    solo = inst.solo(tiny_qwen3_target, draft)
    for reply in (reply_a, reply_b):
        rid = started[reply.id]
        assert inst.pipe.result(rid).token_ids == solo[rid].token_ids
        assert reply.content == solo[rid].text
        assert reply.stats["tokens"] == len(solo[rid].token_ids)
    assert [p[-1]["content"] for _r, p, _c, _ch in inst.added] == ["Write a loop over a list.", "def fibonacci(n):"]
    # Each conversation shows its own reply.
    w.select_conversation(conv_a)
    line = next(x for x in reply_a.content.splitlines() if x.strip())
    assert line in w.chat.toPlainText() and _redraw_is_same(w)
    if with_draft:
        assert any(d for _t, d in reply_a.pieces + reply_b.pieces), "the trained draft is accepted on these prompts"


@pytest.mark.slow
def test_real_stop_one_the_other_finishes_normally(make_window, qtbot, request, tiny_qwen3_target):
    draft = request.getfixturevalue("tiny_qwen3_drafts")["b8_trained"]
    inst = Instrumented()
    w = _real_window(make_window, qtbot, inst, tiny_qwen3_target, draft)
    started: dict[str, int] = {}
    w.controller.started.connect(lambda tag, rid: started.__setitem__(tag, rid))
    w.gen_panel.max_new_tokens.setValue(200)
    inst.go.clear()
    assert w.send("Tell a long story.")
    conv_a, reply_a = w.current, w.current.messages[-1]
    w.gen_panel.max_new_tokens.setValue(48)
    _send_in_new_conversation(w, "import os\nclass Walker:\n")
    conv_b, reply_b = w.current, w.current.messages[-1]
    # Sending again in B while its reply streams is refused, with the reason.
    w.input.setPlainText("and another")
    w.input.submit()
    assert len(conv_b.messages) == 2 and "This conversation's reply is still streaming" in w.state_label.text()
    inst.go.set()
    qtbot.waitUntil(lambda: len(inst.step_requests) >= 3, timeout=60000)
    inst.go.clear()  # hold the engine between two steps, then stop A there
    qtbot.waitUntil(lambda: reply_a.id in started and reply_b.id in started, timeout=60000)
    w.select_conversation(conv_a)
    assert reply_a.id in w.session.streams, "greedy and deterministic: reply A is still streaming after 3 steps"
    with qtbot.waitSignal(w.controller.finished, timeout=60000, check_params_cb=lambda t, f: t == reply_a.id) as b:
        w.stop()
        inst.go.set()
    assert b.args[1].reason == "cancelled" and reply_a.status == CANCELLED
    qtbot.waitUntil(lambda: not w.session.streams, timeout=60000)
    assert reply_b.status == DONE
    rid_b = started[reply_b.id]
    solo = inst.solo(tiny_qwen3_target, draft)
    assert inst.pipe.result(rid_b).token_ids == solo[rid_b].token_ids and reply_b.content == solo[rid_b].text
    assert inst.pipe.kv_stats()["used_blocks"] == 0


@pytest.mark.slow
def test_real_refused_setting_in_one_does_not_disturb_the_other(make_window, qtbot, tiny_qwen3_target):
    from engine.scheduler import SchedulerConfig

    inst = Instrumented(scheduler=SchedulerConfig(num_kv_blocks=16))  # a small cache: long replies do not fit
    w = _real_window(make_window, qtbot, inst, tiny_qwen3_target, None)
    started: dict[str, int] = {}
    w.controller.started.connect(lambda tag, rid: started.__setitem__(tag, rid))
    w.gen_panel.max_new_tokens.setValue(40)
    inst.go.clear()
    assert w.send("The quick brown fox")
    reply_a = w.current.messages[-1]
    w.new_conversation()
    conv_b = w.current
    w.gen_panel.max_new_tokens.setValue(2000)  # inside the 4,096-token context, past the 16-block cache
    with qtbot.waitSignal(w.controller.failed, timeout=60000) as b:
        assert w.send("far too long a reply")
        inst.go.set()
    assert b.args[1].stage == "start" and "num_kv_blocks" in b.args[1].message
    assert conv_b.messages == [] and w.input.toPlainText() == "far too long a reply"
    assert reply_a.id in w.session.streams or reply_a.status == DONE
    qtbot.waitUntil(lambda: not w.session.streams, timeout=60000)
    assert reply_a.status == DONE
    rid = started[reply_a.id]
    solo = inst.solo(tiny_qwen3_target, None)
    assert inst.pipe.result(rid).token_ids == solo[rid].token_ids and reply_a.content == solo[rid].text


@pytest.mark.slow
def test_real_target_alone_through_openvino_genai_serves_them_in_turn(make_window, qtbot, tiny_qwen3_target):
    """The NPU path (GenAITargetPipeline, one request at a time), run on CPU: both replies come, in turn,
    each equal to the engine's own greedy output for its prompt."""
    from engine.genai_target import GenAITargetPipeline

    inst = Instrumented(factory=lambda target, _draft, device: GenAITargetPipeline(target, device, "f32"))
    w = _real_window(make_window, qtbot, inst, tiny_qwen3_target, None)
    started: dict[str, int] = {}
    w.controller.started.connect(lambda tag, rid: started.__setitem__(tag, rid))
    w.gen_panel.max_new_tokens.setValue(24)
    inst.go.clear()
    assert w.send("Write a loop over a list.")
    reply_a = w.current.messages[-1]
    _send_in_new_conversation(w, "def fibonacci(n):")
    reply_b = w.current.messages[-1]
    w.gen_panel.max_new_tokens.setValue(2000)
    _send_in_new_conversation(w, "The quick brown fox")
    reply_c = w.current.messages[-1]
    with qtbot.waitSignal(w.controller.finished, timeout=60000, check_params_cb=lambda t, f: t == reply_c.id) as b:
        w.stop()  # C waits in the pipeline's own queue: dropped there, ended by the worker at the next step
        inst.go.set()
    assert b.args[1].reason == "cancelled" and reply_c.content == ""
    qtbot.waitUntil(lambda: not w.session.streams, timeout=120000)
    assert reply_a.status == DONE and reply_b.status == DONE and reply_a.content and reply_b.content, (
        reply_a.error, reply_b.error)
    solo = inst.solo(tiny_qwen3_target, None)  # the engine's own target alone
    for reply in (reply_a, reply_b):
        assert reply.content == solo[started[reply.id]].text
