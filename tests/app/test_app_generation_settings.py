"""The Generation panel: greedy / sampling controls, penalties, stops, markov_head_top_k, errors at the field."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.chat.model import DONE


def _type_and_send(w, qtbot, text: str) -> None:
    w.input.setFocus()
    qtbot.keyClicks(w.input, text)
    qtbot.keyClick(w.input, Qt.Key.Key_Return)


def test_sampling_fields_follow_the_switch_and_reach_the_engine(make_window, qtbot):
    w = make_window()
    g = w.gen_panel
    assert g.sample_radio.isChecked(), "the chat default is sampling (this target recommends nothing: the preset)"
    g.greedy_radio.click()  # greedy is one click away
    assert g.greedy_radio.isChecked()
    for name in ("temperature", "top_k", "top_p", "min_p", "rng_seed"):
        assert not g._rows[name].isEnabled(), name  # greedy: the sampling fields are off
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "stop_strings", "min_new_tokens"):
        assert g._rows[name].isEnabled(), name  # these apply to greedy decoding too
    cfg = g.config(with_draft=True)
    assert not cfg.do_sample and cfg.rng_seed is None and cfg.temperature == 1.0

    g.sample_radio.setChecked(True)
    assert all(g._rows[n].isEnabled() for n in ("temperature", "top_k", "top_p", "min_p", "rng_seed"))
    assert not g.seed.isEnabled()  # "fixed" is off: a fresh seed per reply
    g.seed_check.setChecked(True)
    assert g.seed.isEnabled()
    g.temperature.setValue(0.8)
    g.top_k.setValue(40)
    g.top_p.setValue(0.9)
    g.min_p.setValue(0.05)
    g.seed.setValue(1234)
    g.repetition_penalty.setValue(1.1)
    g.presence_penalty.setValue(0.5)
    g.frequency_penalty.setValue(0.25)
    g.min_new_tokens.setValue(3)
    g.stop_strings.setPlainText("###\nEND\\n")
    g.max_new_tokens.setValue(12)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _type_and_send(w, qtbot, "hello")
    pipe = w.controller._worker._pipe
    cfg = pipe.configs[-1]
    assert cfg.do_sample and cfg.temperature == 0.8 and cfg.top_k == 40 and cfg.top_p == 0.9
    assert cfg.min_p == 0.05 and cfg.rng_seed == 1234 and cfg.repetition_penalty == 1.1
    assert cfg.presence_penalty == 0.5 and cfg.frequency_penalty == 0.25 and cfg.min_new_tokens == 3
    assert cfg.stop_strings == ["###", "END\n"] and cfg.max_new_tokens == 12
    reply = w.current.messages[-1]
    assert reply.stats["decoding"] == "sampled T=0.8 seed 1234"
    assert "sampled T=0.8" in w.chat.toPlainText()

    # The settings come back in a new window.
    w.close()
    w2 = make_window(load=False)
    g2 = w2.gen_panel
    assert g2.sample_radio.isChecked() and g2.temperature.value() == 0.8 and g2.seed_check.isChecked()
    assert g2.stop_strings.toPlainText() == "###\nEND\\n" and g2.top_k.value() == 40


def test_invalid_value_is_shown_at_its_field_and_nothing_is_lost(make_window, qtbot):
    w = make_window()
    g = w.gen_panel
    g.sample_radio.setChecked(True)
    g.temperature.setValue(0.0)
    # Shown as soon as it is typed: the engine's own message (GenerationConfig.validate) under the field.
    assert "temperature=0.0 is outside (0.0, inf]" in g.field_error("temperature")
    n_before = len(w.current.messages)
    w.input.setFocus()
    qtbot.keyClicks(w.input, "keep me")
    qtbot.keyClick(w.input, Qt.Key.Key_Return)
    assert len(w.current.messages) == n_before  # not sent
    assert w.input.toPlainText() == "keep me"
    assert "Generation panel" in w.state_label.text()
    assert not w.error_banner.isVisible()
    g.temperature.setValue(0.7)
    assert g.field_error("temperature") == ""
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        qtbot.keyClick(w.input, Qt.Key.Key_Return)
    assert w.current.messages[-1].status == DONE and w.input.toPlainText() == ""


def test_markov_head_k_only_for_drafts_with_a_head(make_window, qtbot, model_dirs):
    w = make_window()  # a DFlash v1 draft: no head
    g = w.gen_panel
    assert not g.form.isRowVisible(g._rows["markov_head_top_k"])
    assert g.config(with_draft=True).markov_head_top_k is None
    w.close()

    w = make_window({"draft_variant": "dspark", "draft_head_top_k": 8, "confidence": True})
    g = w.gen_panel
    assert w.engine_info.draft.variant == "dspark" and w.engine_info.draft.has_head
    assert g.form.isRowVisible(g._rows["markov_head_top_k"])
    assert "default (8)" in g.markov_top_k.specialValueText()
    assert "dense Markov walk" in g.markov_head_top_k_note.text()
    assert g.config(with_draft=True).markov_head_top_k is None  # the draft's default
    g.markov_top_k.setValue(4)
    g.max_new_tokens.setValue(30)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _type_and_send(w, qtbot, "hi")
    assert w.controller._worker._pipe.configs[-1].markov_head_top_k == 4
    st = w.current.messages[-1].stats
    assert st["variant"] == "dspark" and st["markov_head_top_k"] == 4
    assert "(dspark, K=4)" in w.chat.toPlainText()
    # The draft's confidence per block position is drawn over the acceptance bars.
    assert w.plots.conf_n.any() and "confidence" in w.plots.p_accept.getPlotItem().titleLabel.text


def test_engine_refusal_goes_back_to_the_field(make_window, qtbot):
    """DFlash v2 refuses markov_head_top_k=0 in add_request: the turn is taken back, the text returns."""
    w = make_window({"draft_variant": "dflash_v2", "draft_head_top_k": 8})
    g = w.gen_panel
    assert "selector" in g.markov_head_top_k_note.text()
    g.markov_top_k.setValue(0)
    assert g.field_error("markov_head_top_k") == ""  # only the engine knows this draft cannot
    n_before = len(w.current.messages)
    with qtbot.waitSignal(w.controller.failed, timeout=10000):
        _type_and_send(w, qtbot, "dense please")
    assert len(w.current.messages) == n_before
    assert w.input.toPlainText() == "dense please"
    assert "markov_head_top_k=0" in g.field_error("markov_head_top_k")
    assert "dense please" not in w.chat.toPlainText()
    assert not w.session.streams and w.send_button.isEnabled()
    g.markov_top_k.setValue(8)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        qtbot.keyClick(w.input, Qt.Key.Key_Return)
    assert w.current.messages[-1].status == DONE
    assert g.field_error("markov_head_top_k") == ""


def test_draft_tokens_per_step_shows_the_drafts_own_default(make_window, monkeypatch):
    """The "unset" value names the number the engine will use: the draft's whole block (7) under "what pays" (the
    default: one request alone verifies the tuned count or the block), its tuned default (3 for the shipped DSpark
    draft) under "every drafted token"; a choice is kept in the settings."""
    from app.fake_engine import FakePipeline

    monkeypatch.setattr(FakePipeline, "default_num_candidates", property(lambda self: 3))
    w = make_window()
    g = w.gen_panel
    assert w.engine_info.draft.default_candidates == 3 and w.engine_info.draft.max_candidates == 7
    assert g.num_assistant.value() == 0 and g.num_assistant.specialValueText() == "draft's default (7)"
    assert g.config(with_draft=True).draft_policy == "adaptive"
    g.draft_policy.setCurrentIndex(g.draft_policy.findData("always"))
    assert g.num_assistant.specialValueText() == "draft's default (3)"
    assert g.config(with_draft=True).draft_policy == "always" and g.config(with_draft=False).draft_policy is None
    assert g.num_assistant.maximum() == 7 and g.num_assistant.isEnabled()
    assert g.config(with_draft=True).num_assistant_tokens is None  # unset: the engine applies its default
    w.close()
    w = make_window()
    assert w.gen_panel.policy_name == "always"  # kept in the settings
    w.close()

    w = make_window(draft=False)
    assert w.gen_panel.num_assistant.specialValueText() == "draft's default"
    assert not w.gen_panel.num_assistant.isEnabled()


def test_chat_default_is_the_models_recommended_sampling_greedy_one_click_away(make_window, model_dirs, qtbot):
    target, _draft = model_dirs
    (target / "generation_config.json").write_text(
        '{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20}')
    w = make_window()
    g = w.gen_panel
    assert g.sample_radio.isChecked() and g.temperature.value() == 0.6 and g.top_p.value() == 0.95
    assert g.top_k.value() == 20
    assert g.decoding_note.text() == "Recommended: T=0.6, top-p 0.95, top-k 20 (the model's generation_config.json)"
    g.max_new_tokens.setValue(8)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        _type_and_send(w, qtbot, "hello")
    cfg = w.controller._worker._pipe.configs[-1]
    assert cfg.do_sample and cfg.temperature == 0.6 and cfg.top_p == 0.95 and cfg.top_k == 20

    g.greedy_radio.click()  # one click: greedy, and that choice is remembered
    assert not g.config(with_draft=True).do_sample
    assert g.decoding_note.text().endswith("; yours differs")
    w.close()
    w2 = make_window()  # loads the same target again: the person's greedy stays
    assert w2.gen_panel.greedy_radio.isChecked()
    w2.gen_panel.recommended_button.click()
    assert w2.gen_panel.sample_radio.isChecked() and w2.gen_panel.temperature.value() == 0.6
    assert "yours differs" not in w2.gen_panel.decoding_note.text()


def test_the_session_panel_fits_1440x900_with_the_npu_notice(make_window, qtbot, qapp):
    """The side panel's content fits its dock at the default 1440x900 (no horizontal clipping, no vertical
    scrolling) with the NPU notice and the recommended-decoding note shown, in the app's own style."""
    from pathlib import Path

    qss = Path(__file__).resolve().parents[2] / "resources" / "style.qss"
    qapp.setStyleSheet(qss.read_text(encoding="utf-8"))
    try:
        w = make_window(draft=False)
        w.resize(1440, 900)
        mp = w.model_panel
        assert mp.set_device("NPU")
        qtbot.wait(100)
        assert mp.device_notice.isVisible() and w.gen_panel.decoding_note.isVisible()
        scroll = w.side_dock.widget()
        side = scroll.widget()
        assert side.minimumSizeHint().width() <= scroll.viewport().width()
        assert side.heightForWidth(scroll.viewport().width()) <= scroll.viewport().height()
        assert not scroll.verticalScrollBar().isVisible() and not scroll.horizontalScrollBar().isVisible()
        w.gen_panel.more_button.click()  # unfolded, the rest of the settings scroll into view
        assert not w.gen_panel.more_box.isHidden()
    finally:
        qapp.setStyleSheet("")
