"""Tokenizer, chat template and incremental detokenization over openvino_tokenizers IRs."""
from __future__ import annotations

import codecs
from functools import cached_property
from pathlib import Path
from typing import Sequence

import openvino_genai as ov_genai

from engine.errors import ModelFolderError
from engine.events import TextPiece
from engine.models.files import openvino_reason, read_optional_json_object

TOKENIZER_FILES = ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                   "openvino_detokenizer.bin")


def check_text(text: str, what: str = "The prompt") -> None:
    """Text must be encodable as UTF-8: bytes a terminal or file could not decode arrive in Python as
    lone surrogates (U+DC80..U+DCFF), which the tokenizer cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raw = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
        raise ValueError(f"{what} is not valid UTF-8 text ({raw} at character {exc.start}): give it as UTF-8 "
                         "(check the terminal's or the file's encoding, e.g. `iconv -f latin1 -t utf-8`).") from None

Prompt = str | Sequence[dict[str, str]] | Sequence[int]  # text, chat messages, or token ids


class TextTokenizer:
    """openvino_genai.Tokenizer plus the stop ids a generation must honour."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        fix = "export the model again with `dflash-studio export --kind target` (or copy the folder again)."
        for name in TOKENIZER_FILES:
            f = self.folder / name
            if f.is_file() and f.stat().st_size == 0:
                raise ModelFolderError(f"{f} is empty (0 bytes; a copy or export that did not finish): {fix}")
        try:
            self.tok = ov_genai.Tokenizer(str(self.folder))
        except RuntimeError as exc:
            raise ModelFolderError(f"The tokenizer of {self.folder} (openvino_tokenizer.xml / "
                                   f"openvino_detokenizer.xml) cannot be read ({openvino_reason(exc)}): {fix}") from exc
        self.eos_token_ids: set[int] = set()
        eos = self.tok.get_eos_token_id()
        if eos is not None and eos >= 0:
            self.eos_token_ids.add(int(eos))
        ids = read_optional_json_object(self.folder / "generation_config.json", fix).get("eos_token_id")
        if isinstance(ids, int) or (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            self.eos_token_ids.update([ids] if isinstance(ids, int) else ids)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tok.chat_template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_text(text)
        return [int(x) for x in self.tok.encode(text, add_special_tokens=add_special_tokens).input_ids.data[0]]

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        for m in messages:
            check_text(m.get("content", ""), "The prompt" if len(messages) == 1 else f"The {m.get('role')} message")
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def prompt_text(self, prompt: Prompt, chat: bool | None = None) -> tuple[str, bool] | None:
        """The text a prompt stands for and whether encoding it adds special tokens (a chat template's
        text carries its own): text (through the chat template when `chat`, default: when the model has
        one), chat messages (the template); None for token ids, which stand as they are."""
        if isinstance(prompt, str):
            use_chat = self.has_chat_template if chat is None else chat
            if use_chat:
                return self.chat_prompt([{"role": "user", "content": prompt}]), False
            return prompt, True
        items = list(prompt)
        if items and isinstance(items[0], dict):
            if not self.has_chat_template:
                raise ValueError("This model has no chat template: send plain text for completion instead of "
                                 "chat messages.")
            return self.chat_prompt(items), False
        return None

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]:
        """Token ids for a prompt (prompt_text's rules). The paged engine's own encode_prompt adds the reuse
        of a finished request's ids for a chat's next turn (the prefix cache's keys)."""
        rendered = self.prompt_text(prompt, chat)
        if rendered is None:
            return [int(t) for t in prompt]
        text, special = rendered
        return self.encode(text, add_special_tokens=special)

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
