"""History: JSONL per conversation, atomic writes, corrupt files set aside and reported."""
from __future__ import annotations

import json

from app.chat.model import CANCELLED, INTERRUPTED, STREAMING, Conversation, Message
from app.chat.store import HistoryStore


def _conv() -> Conversation:
    c = Conversation(title="Speculation", system_prompt="Be brief.")
    c.messages.append(Message("user", "What is DFlash?"))
    m = Message("assistant")
    m.append_piece("Block ", False)
    m.append_piece("speculative ", True)
    m.append_piece("decoding.", True)
    m.stats = {"ttft_ms": 12.5, "decode_tok_s": 80.0, "tokens_per_step": 3.2, "acceptance_rate": 0.6}
    c.messages.append(m)
    return c


def test_roundtrip_keeps_marks_and_stats(tmp_path):
    store = HistoryStore(tmp_path)
    c = _conv()
    path = store.save(c)
    assert path.name == f"{c.id}.jsonl"
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "conversation" and len(lines) == 3
    assert not list(tmp_path.glob("*.tmp")), "the temp file must be renamed over the target"
    convs, bad = store.load_all()
    assert not bad
    (r,) = convs
    assert r.title == "Speculation" and r.system_prompt == "Be brief."
    a = r.messages[1]
    assert a.pieces == [("Block ", False), ("speculative decoding.", True)]
    assert a.stats["tokens_per_step"] == 3.2
    assert r.chat_messages() == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "What is DFlash?"},
                                 {"role": "assistant", "content": "Block speculative decoding."}]


def test_saving_again_replaces_the_file_atomically(tmp_path, monkeypatch):
    store = HistoryStore(tmp_path)
    c = _conv()
    store.save(c)
    before = store.path_for(c).read_text()
    c.messages.append(Message("user", "more"))

    import app.chat.store as mod

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(mod.os, "replace", boom)
    try:
        store.save(c)
    except OSError:
        pass
    assert store.path_for(c).read_text() == before, "a failed save must leave the old file whole"
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupt_files_are_set_aside_and_reported(tmp_path):
    store = HistoryStore(tmp_path)
    good = _conv()
    store.save(good)
    (tmp_path / "broken.jsonl").write_text('{"kind": "conversation", "id": "broken"}\n{not json\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "wrong.jsonl").write_text('{"kind": "message", "role": "user", "content": "x"}\n')
    convs, bad = store.load_all()
    assert [c.id for c in convs] == [good.id]
    reasons = {b.path.name: b.reason for b in bad}
    assert reasons["broken.jsonl"].startswith("line 2 is not valid JSON")
    assert reasons["empty.jsonl"] == "the file is empty"
    assert "header" in reasons["wrong.jsonl"]
    for b in bad:
        assert b.moved_to is not None and b.moved_to.exists() and not b.path.exists()
        assert b.moved_to.parent == tmp_path / "corrupt"
    # A second start does not report them again (they are aside) and nothing was lost.
    convs2, bad2 = store.load_all()
    assert not bad2 and len(list((tmp_path / "corrupt").iterdir())) == 3


def test_a_reply_saved_while_streaming_loads_as_interrupted(tmp_path):
    store = HistoryStore(tmp_path)
    c = Conversation()
    c.messages.append(Message("user", "hi"))
    c.messages.append(Message("assistant", status=STREAMING))
    c.messages[-1].append_piece("par", False)
    store.save(c)
    (r,), _ = store.load_all()
    assert r.messages[-1].status == INTERRUPTED
    stopped = Message("assistant", "x", pieces=[("x", True)], status=CANCELLED)
    assert Message.from_json(stopped.to_json()).status == CANCELLED
