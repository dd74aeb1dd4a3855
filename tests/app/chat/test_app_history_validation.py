"""History files with wrong types, ranges, non-finite numbers or deep nesting are set aside, never crash the
window; a fuzz run over 1,000 mutated valid files (types, values, truncations, nesting)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from app.chat.model import Conversation, Message
from app.chat.store import HistoryStore
from app.chat.view import ChatView, format_stats
from app.chat.conversation_list import conversation_tooltip

ISSUE_REPRO = ('{"kind":"conversation","title":"x","updated":9e12}\n'
               '{"kind":"message","role":"assistant","content":"x","stats":{"ttft_ms":null}}\n')


def _valid(rng: random.Random | None = None) -> Conversation:
    rng = rng or random.Random(0)
    c = Conversation(title="Trip", system_prompt="Be brief.")
    for i in range(rng.randint(1, 3)):
        c.messages.append(Message("user", f"question {i}"))
        m = Message("assistant", status=rng.choice(["done", "cancelled", "streaming", "error"]))
        m.append_piece("Block ", False)
        m.append_piece("speculative ", True)
        m.append_piece("decoding.\n", rng.random() < 0.5)
        m.stats = {"ttft_ms": 12.5, "decode_tok_s": 80.0, "tokens_per_step": 2.1, "acceptance_rate": 0.6,
                   "target_steps": 40, "tokens": 88, "acceptance_by_position": [0.9, 0.5], "draft": "dspark",
                   "variant": "dspark", "markov_head_top_k": 8, "decoding": "sampled T=0.7", "device": "CPU",
                   "source": "engine", "finish_reason": "length"}
        m.finish_reason = "length"
        c.messages.append(m)
    return c


def _file_text(conv: Conversation) -> str:
    lines = [json.dumps(conv.header_json())] + [json.dumps(m.to_json()) for m in conv.messages]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name, text, says", [
    ("issue", ISSUE_REPRO, "line 1: updated"),
    ("ttft-null", ISSUE_REPRO.replace("9e12", "1.7e9"), "stats.ttft_ms is null"),
    ("ttft-text", ISSUE_REPRO.replace("9e12", "1.7e9").replace("null", '"fast"'), "stats.ttft_ms is text"),
    ("rate-text", '{"kind":"conversation"}\n{"kind":"message","role":"assistant","content":"x",'
                  '"stats":{"acceptance_rate":"60%"}}\n', "stats.acceptance_rate is text"),
    ("updated-nan", '{"kind":"conversation","updated":NaN}\n', "line 1: NaN"),
    ("updated-1e20", '{"kind":"conversation","updated":1e20}\n', "line 1: updated is 1e+20, outside"),
    ("deep", '{"kind":"conversation"}\n{"kind":"message","role":"user","content":"x","stats":{"a":'
             + "[" * 100_000 + "]" * 100_000 + "}}\n", "line 2: it nests deeper than"),
    ("pieces-flag", '{"kind":"conversation"}\n{"kind":"message","role":"assistant","content":"x",'
                    '"pieces":[["x", 1]]}\n', "pieces[0] is not a [text, true/false] pair"),
    ("created-text", '{"kind":"conversation","created":"yesterday"}\n', "line 1: created is text"),
    ("title-list", '{"kind":"conversation","title":["a"]}\n', "line 1: title is a list"),
    ("stats-list", '{"kind":"conversation"}\n{"kind":"message","role":"user","content":"x","stats":[1]}\n',
     "stats is a list"),
    ("status", '{"kind":"conversation"}\n{"kind":"message","role":"user","content":"x","status":7}\n',
     "status 7 is not one of"),
    ("infinity", '{"kind":"conversation"}\n{"kind":"message","role":"user","content":"x","created":-Infinity}\n',
     "-Infinity is not a number JSON allows"),
    ("huge-int", '{"kind":"conversation","updated":' + "9" * 5000 + "}\n", "line 1 is not valid JSON"),
    ("steps-float", '{"kind":"conversation"}\n{"kind":"message","role":"assistant","content":"x",'
                    '"stats":{"target_steps":2.5}}\n', "stats.target_steps is 2.5, not a whole number"),
])
def test_a_bad_field_sets_the_file_aside_with_the_field_named(tmp_path, name, text, says):
    store = HistoryStore(tmp_path)
    good = _valid()
    store.save(good)
    (tmp_path / f"{name}.jsonl").write_text(text)
    convs, bad = store.load_all()
    assert [c.id for c in convs] == [good.id], "the other conversations load"
    (b,) = bad
    assert b.path.name == f"{name}.jsonl" and says in b.reason, b.reason
    assert b.moved_to is not None and b.moved_to.read_text() == text, "set aside whole, not deleted"


def test_the_issue_repro_opens_the_window_with_a_notice_naming_the_file(make_window, app_home):
    hist = app_home / "history"
    hist.mkdir(exist_ok=True)
    good = _valid()
    HistoryStore(hist).save(good)
    (hist / "bad.jsonl").write_text(ISSUE_REPRO)
    w = make_window(load=False)
    assert w.isVisible()
    assert [c.id for c in w.conversations] == [good.id]
    assert w.notice_banner.isVisible() and "bad.jsonl" in w.notice_banner.label.text()
    assert "updated" in w.notice_banner.label.text()
    assert "Block speculative decoding." in w.chat.toPlainText()


# -- fuzz --------------------------------------------------------------------------------------------
_VALUES = [None, True, False, 0, -1, 1.5, -1e300, 1e20, 9e15, float("nan"), float("inf"), "", "x", "NaN",
           [], [None], {}, {"a": 1}, [["x", True]], "9" * 50, 10**30, "__DEEP__"]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def _mutate(text: str, rng: random.Random) -> str:
    """One random mutation of a valid file: a value's type or range, a key dropped, a truncation,
    bytes inserted, deep nesting, lines shuffled or dropped."""
    lines = text.splitlines()
    kind = rng.randrange(7)
    if kind <= 2:  # a value replaced at a random place (the header or a message)
        i = rng.randrange(len(lines))
        obj = json.loads(lines[i])
        path = rng.choice([p for p in _paths(obj) if p])
        _set(obj, path, rng.choice(_VALUES))
        deep = rng.choice([5, 50, 5000, 200_000])
        lines[i] = json.dumps(obj).replace('"__DEEP__"', "[" * deep + "]" * deep)
    elif kind == 3:  # a key dropped
        i = rng.randrange(len(lines))
        obj = json.loads(lines[i])
        path = rng.choice([p for p in _paths(obj) if p])
        parent = obj
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
        lines[i] = json.dumps(obj)
    elif kind == 4:  # truncated at a random byte (a killed write without the atomic rename)
        data = "\n".join(lines)
        return data[: rng.randrange(len(data))]
    elif kind == 5:  # random bytes / characters inserted
        data = "\n".join(lines)
        at = rng.randrange(len(data))
        junk = rng.choice(["\x00", "\ufeff", "}", "{", ",", "\n", '"', "NaN", "[" * 3000, "\udcff"])
        return data[:at] + junk + data[at:]
    else:  # lines shuffled or dropped
        if rng.random() < 0.5:
            rng.shuffle(lines)
        else:
            del lines[rng.randrange(len(lines))]
    return "\n".join(lines) + "\n"


def _window_objects(conv: Conversation, view: ChatView) -> None:
    """What the window builds from a loaded conversation: its list tooltip, its drawing in the chat view,
    each reply's stats line, the chat template messages and the title."""
    conversation_tooltip(conv)
    view.set_conversation(conv)
    for m in conv.messages:
        format_stats(m.stats)
    conv.chat_messages()
    conv.auto_title()


def test_fuzz_1000_mutated_history_files_never_break_loading_or_the_window(tmp_path, qtbot, make_window,
                                                                          app_home, monkeypatch):
    rng = random.Random(20)
    valid = [_file_text(_valid(random.Random(k))) for k in range(5)]
    view = ChatView()
    qtbot.addWidget(view)
    loaded = aside = 0
    window_runs = 0
    for n in range(1000):
        text = _mutate(rng.choice(valid), rng)
        root = tmp_path / f"h{n}"
        root.mkdir()
        (root / "conv.jsonl").write_text(text, encoding="utf-8", errors="surrogatepass")
        convs, bad = HistoryStore(root).load_all()  # must not raise
        assert len(convs) + len(bad) == 1, "every file either loads or is set aside and named"
        if bad:
            aside += 1
            assert bad[0].path.name == "conv.jsonl" and bad[0].moved_to and bad[0].moved_to.exists()
        else:
            loaded += 1
            _window_objects(convs[0], view)
        if n % 100 == 0:  # a real window over a sample of them
            hist = app_home / "history"
            hist.mkdir(exist_ok=True)
            for f in hist.glob("*.jsonl"):
                f.unlink()
            (hist / f"fuzz{n}.jsonl").write_text(text, encoding="utf-8", errors="surrogatepass")
            w = make_window(load=False)
            assert w.isVisible() and w.current is not None
            assert len(w.conversations) == 1  # the loaded one, or a fresh empty one when it was set aside
            if bad:
                assert f"fuzz{n}.jsonl" in w.notice_banner.label.text()
            w.close()
            window_runs += 1
    assert window_runs == 10
    assert loaded > 50 and aside > 300, (loaded, aside)  # the mutations exercise both sides
