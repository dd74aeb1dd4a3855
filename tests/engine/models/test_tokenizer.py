"""Streaming detokenization: the pieces of any split of the tokens join to the full decode."""
from __future__ import annotations

import random

import pytest

from engine.models.tokenizer import IncrementalDetokenizer, TextTokenizer

TEXT = "def naïve(x):\n    return '数字 ✓ café'  # ünïcode\n\tDone! 🙂 " * 3


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_target) -> TextTokenizer:
    return TextTokenizer(tiny_qwen3_target)


@pytest.mark.parametrize("path", ["byte table", "detokenizer window"])
def test_any_split_streams_the_full_text(tokenizer: TextTokenizer, path: str) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    if path == "byte table":
        assert tokenizer.byte_table is not None
    rng = random.Random(7)
    for _ in range(5):
        det = IncrementalDetokenizer(tokenizer)
        if path != "byte table":
            det.table = None
        i, pieces = 0, []
        while i < len(ids):
            n = rng.randint(1, 6)
            pieces += det.feed(ids[i: i + n], rng.randint(0, n - 1))
            i += n
        assert "".join(p.text for p in pieces) == tokenizer.decode(ids) == det.text
        assert all("\ufffd" not in p.text for p in pieces)  # split characters are held back, never shown broken


def test_accepted_tokens_are_marked_as_draft_text(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("hello world and more words", add_special_tokens=False)
    det = IncrementalDetokenizer(tokenizer)
    pieces = det.feed(ids, accepted=len(ids) - 1)
    assert pieces[0].from_draft and not pieces[-1].from_draft
    assert pieces[0].text == tokenizer.decode(ids[:-1])
