"""A chat turn over a fake engine: streaming, marks, stats, history saved and reloaded, plots."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt

from app.chat.model import DONE, ERROR
from app.fake_engine import FakePipeline
from app_helpers import draft_text, fragments, marked_text


def _send_with_enter(qtbot, w, text: str) -> None:
    w.input.setFocus()
    qtbot.keyClicks(w.input, text)
    qtbot.keyClick(w.input, Qt.Key.Key_Return)


def test_chat_turn_streams_marks_stats_and_history(make_window, qtbot, app_home, settings):
    w = make_window({"tokens_per_second": 3000.0})
    batches = []
    w.controller.events_ready.connect(lambda tag, evs: batches.append(len(evs)))
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _send_with_enter(qtbot, w, "What does the draft do?")
        assert w.stop_button.isEnabled() and not w.send_button.isEnabled()
    conv = w.current
    user, reply = conv.messages
    assert user.content == "What does the draft do?"
    assert reply.status == DONE and reply.finish_reason == "length"
    assert reply.content.startswith("Block speculative decoding")
    # Marks: some runs are accepted draft text, some are the target's, and the view shows both.
    assert any(d for _t, d in reply.pieces) and any(not d for _t, d in reply.pieces)
    shown = marked_text(w.chat)
    assert shown == draft_text(reply.pieces)
    assert any(not m and t.strip() for t, m in fragments(w.chat))
    # Stats are kept with the message and shown under it.
    st = reply.stats
    for key in ("ttft_ms", "decode_tok_s", "tokens_per_step", "acceptance_rate", "draft", "device"):
        assert key in st, key
    assert st["tokens"] == 256 and st["device"] == "CPU" and st["draft"] == "tiny-draft"
    text = w.chat.toPlainText()
    assert "tokens/step" in text and "% accepted" in text and "TTFT" in text and "draft: tiny-draft" in text
    # Batched: far fewer signals than steps.
    assert sum(batches) == st["target_steps"] + 1  # + the prefill step
    assert len(batches) < st["target_steps"] / 3
    # Plots got the verification steps (drawn by the GUI timer, which is stopped now).
    assert w.plots.tokens.n == st["target_steps"]
    assert w.plots.redraws >= 1 and not w.plots.timer_active
    assert 0 < w.plots.acceptance_percent()[0] <= 100
    # The chat template got the whole conversation.
    pipe: FakePipeline = w.controller._worker._pipe
    assert pipe.prompts[-1] == [{"role": "user", "content": "What does the draft do?"}]
    # History: saved atomically as JSONL in the user data folder ...
    files = list((app_home / "history").glob("*.jsonl"))
    assert [f.stem for f in files] == [conv.id]
    rows = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert rows[0]["title"] == "What does the draft do?" and rows[2]["stats"]["tokens"] == 256
    w.close()

    # ... and reloaded at the next start, marks and stats included.
    w2 = make_window(load=False)
    assert [c.id for c in w2.conversations] == [conv.id]
    assert w2.current.id == conv.id
    r2 = w2.current.messages[1]
    assert r2.pieces == reply.pieces and r2.stats["tokens"] == 256
    assert marked_text(w2.chat) == shown
    assert "tokens/step" in w2.chat.toPlainText()


def test_second_turn_sends_history_and_system_prompt(make_window, qtbot):
    w = make_window({"tokens_per_second": 0.0})
    w.gen_panel.system_prompt.setPlainText("Answer in one line.")
    w.gen_panel.max_new_tokens.setValue(12)
    w.gen_panel.num_assistant.setValue(3)
    for q in ("first", "second"):
        with qtbot.waitSignal(w.controller.finished, timeout=5000):
            assert w.send(q)
    pipe = w.controller._worker._pipe
    roles = [m["role"] for m in pipe.prompts[-1]]
    assert roles == ["system", "user", "assistant", "user"]
    assert pipe.prompts[-1][0]["content"] == "Answer in one line."
    assert w.current.messages[-1].stats["tokens"] == 12
    assert pipe.configs[-1].num_assistant_tokens == 3 and pipe.configs[-1].max_new_tokens == 12
    assert w.current.system_prompt == "Answer in one line."


def test_plain_completion_for_a_base_model(make_window, qtbot):
    w = make_window({"has_chat_template": False})
    assert "Plain completion" in w.gen_panel.prompt_format.text()
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        w.send("Once upon a time")
    assert w.controller._worker._pipe.prompts[-1] == "Once upon a time"


def test_mark_switch_recolours_without_losing_text(make_window, qtbot):
    w = make_window()
    w.gen_panel.max_new_tokens.setValue(40)
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        w.send("hi")
    before = w.chat.toPlainText()
    assert marked_text(w.chat)
    w.mark_switch.setChecked(False)
    assert marked_text(w.chat) == "" and w.chat.toPlainText() == before
    assert not w.act_mark.isChecked()
    w.act_mark.setChecked(True)
    assert marked_text(w.chat) and w.mark_switch.isChecked()


def test_shift_enter_adds_a_line_and_enter_sends(make_window, qtbot):
    w = make_window()
    w.input.setFocus()
    qtbot.keyClicks(w.input, "line one")
    qtbot.keyClick(w.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(w.input, "line two")
    assert w.input.toPlainText() == "line one\nline two"
    assert not w.current.messages
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        qtbot.keyClick(w.input, Qt.Key.Key_Enter)
    assert w.current.messages[0].content == "line one\nline two"
    assert w.input.toPlainText() == ""


def test_several_conversations(make_window, qtbot, app_home):
    w = make_window()
    w.gen_panel.max_new_tokens.setValue(8)
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        w.send("alpha question")
    first = w.current
    w.new_conversation()
    assert w.current is not first and w.chat.toPlainText() == ""
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        w.send("beta question")
    assert w.conv_list.count() == 2
    titles = {w.conv_list.item(i).text() for i in range(2)}
    assert titles == {"alpha question", "beta question"}
    # Switch back through the list.
    for i in range(2):
        if w.conv_list.item(i).text() == "alpha question":
            w.conv_list.setCurrentRow(i)
    assert w.current is first and "alpha question" in w.chat.toPlainText()
    assert len(list((app_home / "history").glob("*.jsonl"))) == 2
    w.delete_current(confirm=False)
    assert len(list((app_home / "history").glob("*.jsonl"))) == 1
    assert w.conv_list.count() == 1


def test_corrupt_history_is_reported_at_start(make_window, app_home):
    hist = app_home / "history"
    hist.mkdir(exist_ok=True)
    (hist / "bad.jsonl").write_text("this is not json\n")
    w = make_window(load=False)
    assert w.notice_banner.isVisible()
    text = w.notice_banner.label.text()
    assert "could not be read" in text and "bad.jsonl" in text and "line 1 is not valid JSON" in text
    assert (hist / "corrupt").is_dir() and len(list((hist / "corrupt").iterdir())) == 1


def test_engine_error_is_readable_and_app_stays_usable(make_window, qtbot):
    w = make_window({"fail_on_step": 4, "tokens_per_second": 0.0})
    with qtbot.waitSignal(w.controller.failed, timeout=5000):
        w.send("this will break")
    reply = w.current.messages[-1]
    assert reply.status == ERROR and "fake engine failure" in reply.error
    assert w.error_banner.isVisible()
    assert "Unexpected engine error" in w.error_banner.label.text()
    assert "Traceback" in w.error_banner.details
    assert "Error:" in w.chat.toPlainText() and "this will break" in w.chat.toPlainText()
    assert w.send_button.isEnabled()
    # Still usable: load a working engine again and chat on in the same conversation.
    w.controller._worker._loader = __import__("app.fake_engine", fromlist=["fake_loader"]).fake_loader()
    with qtbot.waitSignal(w.controller.loaded, timeout=5000):
        w.model_panel.load_button.click()
    w.gen_panel.max_new_tokens.setValue(5)
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        assert w.send("again")
    assert [(m.role, m.status) for m in w.current.messages] == [
        ("user", DONE), ("assistant", ERROR), ("user", DONE), ("assistant", DONE)]
    # The failed reply is not sent back to the model as context.
    assert w.controller._worker._pipe.prompts[-1] == [{"role": "user", "content": "this will break"},
                                                      {"role": "user", "content": "again"}]


def test_load_error_keeps_previous_engine(make_window, qtbot, model_dirs):
    from engine.errors import ModelFolderError

    w = make_window()

    def broken(*a, **k):
        raise ModelFolderError("openvino_model.xml is missing in /nowhere: prepare or export the target first.")

    w.controller._worker._loader = broken
    with qtbot.waitSignal(w.controller.load_failed, timeout=5000):
        w.model_panel.load_button.click()
    assert "Model folder problem" in w.error_banner.label.text()
    assert "openvino_model.xml is missing" in w.error_banner.label.text()
    assert w.engine_info is not None and w.send_button.isEnabled()
    with qtbot.waitSignal(w.controller.finished, timeout=5000):
        assert w.send("still works")
