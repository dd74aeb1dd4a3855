"""Side panel: system prompt and generation settings (greedy; sampling comes with the engine)."""
from __future__ import annotations

from PySide6.QtCore import QSettings, Signal
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QPlainTextEdit, QSpinBox, QVBoxLayout

from app import settings as S
from engine.config import MAX_ASSISTANT_TOKENS, GenerationConfig


class GenerationPanel(QGroupBox):
    system_prompt_edited = Signal(str)

    def __init__(self, settings: QSettings, parent=None) -> None:
        super().__init__("Generation", parent)
        self.setObjectName("generationPanel")
        self.settings = settings
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("System prompt"))
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("Optional instructions for the assistant (used with chat templates).")
        self.system_prompt.setMaximumHeight(90)
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.textChanged.connect(lambda: self.system_prompt_edited.emit(self.system_prompt.toPlainText()))
        lay.addWidget(self.system_prompt)

        form = QFormLayout()
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setObjectName("maxNewTokens")
        self.max_new_tokens.setRange(1, 32768)
        self.max_new_tokens.setValue(S.get_int(settings, S.K_MAX_NEW_TOKENS, 256))
        self.max_new_tokens.setToolTip("The reply stops after this many new tokens.")
        form.addRow("Max new tokens", self.max_new_tokens)

        self.num_assistant = QSpinBox()
        self.num_assistant.setObjectName("numAssistantTokens")
        self.num_assistant.setRange(0, MAX_ASSISTANT_TOKENS)
        self.num_assistant.setSpecialValueText("draft's block")
        self.num_assistant.setValue(S.get_int(settings, S.K_NUM_ASSISTANT, 0))
        self.num_assistant.setToolTip("num_assistant_tokens: draft tokens proposed per step. "
                                      "“draft's block” uses the draft's own block size minus one.")
        form.addRow("Draft tokens per step", self.num_assistant)

        self.decoding = QLabel("Greedy (the target's most likely token). Sampling settings will appear "
                               "here once the engine supports sampling.")
        self.decoding.setObjectName("decodingNote")
        self.decoding.setWordWrap(True)
        form.addRow("Decoding", self.decoding)
        self.prompt_format = QLabel("—")
        self.prompt_format.setObjectName("promptFormat")
        self.prompt_format.setWordWrap(True)
        form.addRow("Prompt format", self.prompt_format)
        lay.addLayout(form)
        self.max_new_tokens.valueChanged.connect(lambda v: settings.setValue(S.K_MAX_NEW_TOKENS, v))
        self.num_assistant.valueChanged.connect(lambda v: settings.setValue(S.K_NUM_ASSISTANT, v))

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(text)
        self.system_prompt.blockSignals(False)

    def set_draft_loaded(self, loaded: bool, max_candidates: int | None = None) -> None:
        self.num_assistant.setMaximum(max_candidates if (loaded and max_candidates) else MAX_ASSISTANT_TOKENS)
        self.num_assistant.setEnabled(loaded)
        self.num_assistant.setToolTip(
            self.num_assistant.toolTip() if loaded else "No draft loaded: the target makes one token per step.")

    def set_chat_template(self, has_template: bool | None) -> None:
        if has_template is None:
            self.prompt_format.setText("—")
        elif has_template:
            self.prompt_format.setText("Chat template (the whole conversation is sent).")
        else:
            self.prompt_format.setText("Plain completion: this target has no chat template, so your "
                                       "message is continued as text.")

    def config(self, with_draft: bool) -> GenerationConfig:
        n = self.num_assistant.value()
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens.value(),
            num_assistant_tokens=(n if (n > 0 and with_draft) else None),
        ).validate()
