"""Tokenizer, chat template and incremental detokenization over openvino_tokenizers IRs."""
from __future__ import annotations

import codecs
import json
from functools import cached_property
from pathlib import Path
from typing import Sequence

import openvino_genai as ov_genai

from engine.events import TextPiece

Prompt = str | Sequence[dict[str, str]] | Sequence[int]  # text, chat messages, or token ids


class TextTokenizer:
    """openvino_genai.Tokenizer plus the stop ids a generation must honour."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.tok = ov_genai.Tokenizer(str(self.folder))
        self.eos_token_ids: set[int] = set()
        eos = self.tok.get_eos_token_id()
        if eos is not None and eos >= 0:
            self.eos_token_ids.add(int(eos))
        gen_cfg = self.folder / "generation_config.json"
        if gen_cfg.is_file():
            ids = json.loads(gen_cfg.read_text()).get("eos_token_id")
            self.eos_token_ids.update([ids] if isinstance(ids, int) else (ids or []))

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tok.chat_template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(x) for x in self.tok.encode(text, add_special_tokens=add_special_tokens).input_ids.data[0]]

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt: text (through the chat template when `chat`, default: when the model
        has one), chat messages (the template), or token ids as they are."""
        if isinstance(prompt, str):
            use_chat = self.has_chat_template if chat is None else chat
            if use_chat:
                return self.encode(self.chat_prompt([{"role": "user", "content": prompt}]), add_special_tokens=False)
            return self.encode(prompt)
        items = list(prompt)
        if items and isinstance(items[0], dict):
            if not self.has_chat_template:
                raise ValueError("This model has no chat template: send plain text for completion instead of "
                                 "chat messages.")
            return self.encode(self.chat_prompt(items), add_special_tokens=False)
        return [int(t) for t in items]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True) if ids else ""

    @cached_property
    def byte_table(self) -> list[bytes] | None:
        """Bytes of every token id (b"" for skipped special tokens), if that reproduces decode().

        Streaming then costs a table lookup per token instead of a detokenizer inference per
        step. Checked at build time on sample text against the detokenizer
        IR; tokenizers whose decoding is more than byte concatenation (normalizers, space
        clean-up) return None and stream through the windowed IR path.
        """
        vocab = self.tok.get_vocab()
        if not vocab or not all(isinstance(k, bytes) for k in list(vocab)[:8]):
            return None
        table = [b""] * (max(vocab.values()) + 1)
        for piece, idx in vocab.items():
            table[idx] = piece
        for piece, idx in vocab.items():
            if piece.startswith(b"<") and piece.endswith(b">") and len(piece) > 2 and not self.decode([idx]):
                table[idx] = b""
        sample = ("def f(x):\n    return x  # naïve café ünïcode ✓ 数字\n\tTabs, spaces  and\r\nlines! "
                  "<|im_start|>user\nHi<|im_end|>")
        ids = self.encode(sample, add_special_tokens=False)
        try:
            joined = b"".join(table[i] for i in ids).decode("utf-8")
        except (IndexError, UnicodeDecodeError):
            return None
        return table if joined == self.decode(ids) else None


class IncrementalDetokenizer:
    """Turns committed tokens into text pieces, marking text that came from accepted draft tokens.

    With a byte table (byte-level BPE tokenizers) each token's bytes go through an incremental
    UTF-8 decoder, which holds back an incomplete character until a later token completes it.
    Otherwise a short window is decoded with the detokenizer IR: `prefix_offset..read_offset` is
    the last stretch already shown, decoded again so that merges across the boundary come out
    right, and text ending in U+FFFD is held back.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.table = tokenizer.byte_table
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.ids: list[int] = []
        self.text = ""  # text emitted so far
        self._prefix_offset = 0
        self._read_offset = 0

    def _advance(self, upto: int) -> str:
        """Text newly readable in ids[:upto]."""
        if self.table is not None:
            table = self.table
            data = b"".join(table[i] if i < len(table) else b"" for i in self.ids[self._read_offset: upto])
            self._read_offset = upto
            return self._utf8.decode(data)
        prefix = self.tokenizer.decode(self.ids[self._prefix_offset: self._read_offset])
        full = self.tokenizer.decode(self.ids[self._prefix_offset: upto])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, upto
        return full[len(prefix):]

    def feed(self, tokens: list[int], accepted: int) -> list[TextPiece]:
        start = len(self.ids)
        self.ids.extend(tokens)
        pieces = []
        for upto, from_draft in ((start + accepted, True), (len(self.ids), False)):
            if upto > self._read_offset:
                delta = self._advance(upto)
                if delta:
                    pieces.append(TextPiece(delta, from_draft))
                    self.text += delta
        return pieces
