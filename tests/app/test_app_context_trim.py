"""A chat that outgrows the target's context keeps going: the oldest turns are left out of the prompt
(the engine's fit_chat) and the reply says so (issue 20). Real engine, tiny Qwen3 target whose
config.json is given a small context so that a few turns outgrow it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.chat.model import DONE

pytestmark = pytest.mark.slow
CONTEXT = 200


@pytest.fixture
def small_context_target(tiny_qwen3_target: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-small-context"
    folder.mkdir()
    for f in tiny_qwen3_target.iterdir():
        if f.is_file() and f.name != "config.json":
            (folder / f.name).symlink_to(f)
    config = json.loads((tiny_qwen3_target / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return folder


def test_the_oldest_turns_go_and_the_reply_says_so(make_window, qtbot, small_context_target) -> None:
    from app.worker import default_loader

    w = make_window(load=False, loader=lambda t, d=None, device="CPU", **kw: default_loader(t, d, device=device),
                    validator=None)
    w.model_panel.set_target(str(small_context_target))
    w.model_panel.set_draft(None)
    with qtbot.waitSignal(w.controller.loaded, timeout=120000):
        w.model_panel.load_button.click()
    w.gen_panel.max_new_tokens.setValue(16)
    w.gen_panel.system_prompt.setPlainText("")
    question = "Tell me about lists and tuples in Python, with an example of each one please."
    for turn in range(8):
        with qtbot.waitSignal(w.controller.finished, timeout=120000):
            assert w.send(f"{turn}: {question}")
        reply = w.current.messages[-1]
        assert reply.status == DONE, reply.error
        if (reply.stats or {}).get("context_dropped_turns"):
            break
    else:
        pytest.fail("eight turns never outgrew a 200-token context")
    dropped = reply.stats["context_dropped_turns"]
    assert 0 < dropped < turn + 1
    assert f"its oldest {dropped} turn" in w.chat.toPlainText()
    assert len(w.current.messages) == 2 * (turn + 1), "the conversation itself keeps every turn"
    w.close()
    again = make_window(load=False)  # the note is part of the reply's saved stats
    assert again.current.messages[-1].stats["context_dropped_turns"] == dropped
    assert f"its oldest {dropped} turn" in again.chat.toPlainText()
