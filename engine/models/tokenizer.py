"""Tokenizer, chat template and incremental detokenization over openvino_tokenizers IRs."""
from __future__ import annotations

import json
from pathlib import Path

import openvino_genai as ov_genai

from engine.events import TextPiece


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

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True) if ids else ""


class IncrementalDetokenizer:
    """Turns committed tokens into text pieces, marking text that came from accepted draft tokens.

    Text ending in an incomplete UTF-8 sequence (U+FFFD) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # text emitted so far

    def _stable(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids).rstrip("\ufffd")

    def feed(self, tokens: list[int], accepted: int) -> list[TextPiece]:
        pieces: list[TextPiece] = []
        if accepted:
            text = self._stable(self.ids + tokens[:accepted])
            if text.startswith(self.text) and len(text) > len(self.text):
                pieces.append(TextPiece(text[len(self.text):], True))
                self.text = text
        self.ids.extend(tokens)
        text = self._stable(self.ids)
        # Byte-level BPE decodes prefix-stably; if a detokenizer ever revises earlier text, the
        # consumer keeps what it showed and gets only what lies past it.
        if len(text) > len(self.text):
            pieces.append(TextPiece(text[len(self.text):], False))
            self.text = text
        return pieces
