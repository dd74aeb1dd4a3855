"""A real chat turn: the app over engine.pipeline.SpeculativePipeline on the tiny Qwen3 fixture."""
from __future__ import annotations

import json

import pytest

from app.chat.model import CANCELLED, DONE
from app_helpers import marked_text

pytestmark = pytest.mark.slow


def _drafts(request) -> dict:
    return request.getfixturevalue("tiny_qwen3_drafts")


def _real_window(make_window, qtbot, target, draft):
    from app.worker import default_loader

    w = make_window(load=False, loader=lambda t, d=None, device="CPU", **kw: default_loader(
        t, d, device=device, precision="f32"), validator=None)
    w.model_panel.set_target(str(target))
    w.model_panel.set_draft(str(draft) if draft else None)
    assert w.model_panel.problems() == []
    with qtbot.waitSignal(w.controller.loaded, timeout=120000):
        w.model_panel.load_button.click()
    w.gen_panel.greedy_radio.click()  # these compare with the engine's own greedy output
    return w


def test_real_chat_turn_target_alone(make_window, qtbot, tiny_qwen3_target, app_home):
    w = _real_window(make_window, qtbot, tiny_qwen3_target, None)
    assert w.engine_info.has_chat_template and w.engine_info.device == "CPU"
    assert "Device in use: CPU" in w.device_label.text()
    w.gen_panel.max_new_tokens.setValue(24)
    with qtbot.waitSignal(w.controller.finished, timeout=120000):
        assert w.send("Write a loop over a list.")
    reply = w.current.messages[-1]
    assert reply.status == DONE and reply.content
    assert not any(d for _t, d in reply.pieces), "no draft: nothing can be marked"
    st = reply.stats
    assert st["source"] == "engine" and st["draft"] == "none" and st["device"] == "CPU"
    assert st["tokens_per_step"] == pytest.approx(1.0) or st["target_steps"] == 0
    assert "TTFT" in w.chat.toPlainText()


def test_real_chat_turn_with_draft_marks_stats_history(make_window, qtbot, request, tiny_qwen3_target, app_home):
    drafts = _drafts(request)
    draft = drafts.get("b8_trained") or next(iter(drafts.values()))
    w = _real_window(make_window, qtbot, tiny_qwen3_target, draft)
    assert w.engine_info.draft_name
    w.gen_panel.max_new_tokens.setValue(64)
    with qtbot.waitSignal(w.controller.finished, timeout=120000):
        assert w.send("Write a loop over a list.")
    reply = w.current.messages[-1]
    assert reply.status == DONE and reply.content
    st = reply.stats
    for key in ("ttft_ms", "decode_tok_s", "tokens_per_step", "acceptance_rate"):
        assert key in st
    assert st["draft"] == w.engine_info.draft_name and st["device"] == "CPU"
    if st["acceptance_rate"] > 0:
        assert marked_text(w.chat), "accepted draft tokens must be marked"
    assert "tokens/step" in w.chat.toPlainText()
    assert w.plots.tokens.n == st["target_steps"]
    (f,) = (app_home / "history").glob("*.jsonl")
    rows = [json.loads(x) for x in f.read_text().splitlines()]
    assert rows[2]["content"] == reply.content and rows[2]["stats"]["tokens"] == st["tokens"]
    conv_id = w.current.id
    w.close()
    w2 = make_window(load=False)
    assert w2.current.id == conv_id and w2.current.messages[-1].pieces == reply.pieces


def test_real_cancel_mid_stream(make_window, qtbot, request, tiny_qwen3_target):
    drafts = _drafts(request)
    draft = drafts.get("b8_trained") or next(iter(drafts.values()))
    w = _real_window(make_window, qtbot, tiny_qwen3_target, draft)
    w.gen_panel.max_new_tokens.setValue(4000)
    w.gen_panel.system_prompt.setPlainText("")
    assert w.send("Tell a long story.")
    qtbot.waitUntil(lambda: len(w.current.messages[-1].content) > 0 or not w.session.streams, timeout=60000)
    if not w.session.streams:
        pytest.skip("the tiny model stopped (eos) before it could be cancelled")
    with qtbot.waitSignal(w.controller.finished, timeout=60000) as b:
        w.stop()
    assert b.args[1].reason == "cancelled"
    assert w.current.messages[-1].status == CANCELLED
