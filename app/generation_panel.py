"""Side panel: system prompt and generation settings -> engine.config.GenerationConfig.

Greedy or sampling (temperature, top-k, top-p, min-p, an optional fixed seed: enabled only when
sampling), penalties (they apply to greedy decoding too), min new tokens, stop strings, draft
tokens per step, how much of each drafted window the target verifies (draft_policy: adaptive, the
default, or every candidate) and, when the loaded draft has a Markov head, its Top-K (markov_head_top_k).
The panel checks nothing itself: GenerationConfig.validate() and the engine's add_request do, and
their ValueError (which names the field) is shown under that field; nothing typed is lost.
"""
from __future__ import annotations

import re

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (QButtonGroup, QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox,
                               QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QRadioButton, QSpinBox, QToolButton, QVBoxLayout,
                               QWidget)

from app import settings as S
from engine.config import MAX_ASSISTANT_TOKENS, GenerationConfig
from engine.draft_policy import ADAPTIVE, ALWAYS, DEFAULT_POLICY, POLICIES, default_count
from engine.generation_defaults import DecodingDefaults

# Settings that make up "the decoding": editing one of them is the person's own choice.
DECODING_KEYS = (S.K_DO_SAMPLE, S.K_TEMPERATURE, S.K_TOP_K, S.K_TOP_P, S.K_MIN_P, S.K_REPETITION_PENALTY)

SEED_MAX = 2**31 - 1
NUM_ASSISTANT_TIP = ("num_assistant_tokens: draft tokens proposed per step. The default is a full block when the "
                     "target verifies what pays (one request alone checks the draft's own count or the whole block; "
                     "beside others it drafts the draft's own count), else the draft's own value (its config's "
                     "num_assistant_tokens).")
DRAFT_POLICY_LABELS = {ADAPTIVE: "What pays (adaptive)", ALWAYS: "Every drafted token"}
DRAFT_POLICY_TIP = ("draft_policy: how many of each step's drafted tokens the target checks. “What pays” (the "
                    "default) checks the ones likely enough to be accepted to be worth their cost (how sure the "
                    "draft was, calibrated, and the measured cost of the target's rows); “Every drafted token” "
                    "checks them all. The text is the same either way: only the speed changes.")
_FIELD = re.compile(r"^\s*([a-z_]+)\b")


def field_of_error(message: str) -> str | None:
    """The GenerationConfig field a ValueError names first ("top_p=0.0 is outside ..."), if any."""
    text = message.split(" failed: ", 1)[-1]  # ErrorInfo messages start with "<doing> failed: "
    m = _FIELD.match(text)
    if m and m.group(1) in GenerationConfig.field_names():
        return m.group(1)
    return None


def parse_stop_strings(text: str) -> list[str]:
    r"""One stop string per line; \n and \t stand for a line break and a tab."""
    out = []
    for line in text.splitlines():
        if line.strip():
            out.append(line.replace("\\n", "\n").replace("\\t", "\t"))
    return out


def _dspin(lo: float, hi: float, step: float, decimals: int, value: float, name: str) -> QDoubleSpinBox:
    w = QDoubleSpinBox()
    w.setObjectName(name)
    w.setRange(lo, hi)
    w.setSingleStep(step)
    w.setDecimals(decimals)
    w.setValue(value)
    w.setKeyboardTracking(False)
    return w


def _ispin(lo: int, hi: int, value: int, name: str) -> QSpinBox:
    w = QSpinBox()
    w.setObjectName(name)
    w.setRange(lo, hi)
    w.setValue(value)
    w.setKeyboardTracking(False)
    return w


class GenerationPanel(QGroupBox):
    system_prompt_edited = Signal(str)
    settings_changed = Signal()

    def __init__(self, settings: QSettings, parent=None) -> None:
        super().__init__("Generation", parent)
        self.setObjectName("generationPanel")
        self.settings = settings
        self._errors: dict[str, QLabel] = {}
        self._rows: dict[str, QWidget] = {}
        self._draft_loaded = False
        self._default_candidates = 0
        self._cut_candidates = 0
        self._has_head = False
        self._variant: str | None = None
        self._default_top_k = 0
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("System prompt"))
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("Optional instructions for the assistant (used with chat templates).")
        self.system_prompt.setMaximumHeight(64)
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.textChanged.connect(lambda: self.system_prompt_edited.emit(self.system_prompt.toPlainText()))
        lay.addWidget(self.system_prompt)

        g = lambda key, default: S.get_float(settings, key, default)  # noqa: E731
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form = form
        self.max_new_tokens = _ispin(1, 32768, S.get_int(settings, S.K_MAX_NEW_TOKENS, 256), "maxNewTokens")
        self.max_new_tokens.setToolTip("The reply stops after this many new tokens.")
        self._add(form, "Max new tokens", "max_new_tokens", self.max_new_tokens)
        # Settings used less often (penalties, min new tokens, stop strings) fold away, so the panel fits a
        # 1440x900 screen with the device notice shown; a bad value there unfolds them.
        more = QFormLayout()
        more.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        more.setContentsMargins(0, 0, 0, 0)
        self.more_form = more
        self.min_new_tokens = _ispin(0, 32768, S.get_int(settings, S.K_MIN_NEW_TOKENS, 0), "minNewTokens")
        self.min_new_tokens.setToolTip("End-of-text is not allowed before this many new tokens.")
        self._add(more, "Min new tokens", "min_new_tokens", self.min_new_tokens)

        self.num_assistant = _ispin(0, MAX_ASSISTANT_TOKENS, S.get_int(settings, S.K_NUM_ASSISTANT, 0),
                                    "numAssistantTokens")
        self.num_assistant.setSpecialValueText("draft's default")
        self.num_assistant.setToolTip(NUM_ASSISTANT_TIP)
        self._add(form, "Draft tokens per step", "num_assistant_tokens", self.num_assistant)

        self.draft_policy = QComboBox()
        self.draft_policy.setObjectName("draftPolicy")
        for name in (ADAPTIVE, ALWAYS):
            self.draft_policy.addItem(DRAFT_POLICY_LABELS[name], name)
        saved = S.get_str(settings, S.K_DRAFT_POLICY, DEFAULT_POLICY)
        self.draft_policy.setCurrentIndex(max(0, self.draft_policy.findData(saved if saved in POLICIES
                                                                           else DEFAULT_POLICY)))
        self.draft_policy.setToolTip(DRAFT_POLICY_TIP)
        self._add(more, "Verify", "draft_policy", self.draft_policy)

        self.markov_top_k = _ispin(-1, 100000, S.get_int(settings, S.K_MARKOV_TOP_K, -1), "markovHeadTopK")
        self.markov_top_k.setSpecialValueText("draft's default")
        self._add(form, "Markov head K", "markov_head_top_k", self.markov_top_k,
                  note="K candidates per position scored by the head; 0 = dense Markov walk (DSpark only).")

        # Decoding: greedy or sampling
        mode = QWidget()
        mh = QHBoxLayout(mode)
        mh.setContentsMargins(0, 0, 0, 0)
        self.greedy_radio = QRadioButton("Greedy")
        self.greedy_radio.setObjectName("greedyRadio")
        self.greedy_radio.setToolTip("The target's most likely token every time (same output as the target alone).")
        self.sample_radio = QRadioButton("Sampling")
        self.sample_radio.setObjectName("sampleRadio")
        self.sample_radio.setToolTip("Draw tokens; drafts are verified by exact rejection sampling, so the "
                                     "text has the target's own distribution.")
        self._mode = QButtonGroup(self)
        self._mode.addButton(self.greedy_radio)
        self._mode.addButton(self.sample_radio)
        mh.addWidget(self.greedy_radio)
        mh.addWidget(self.sample_radio)
        mh.addStretch(1)
        self.recommended_button = QPushButton("Recommended")
        self.recommended_button.setObjectName("recommendedButton")
        self.recommended_button.setToolTip("The loaded target's own recommended sampling (its generation_config.json, "
                                           "else a preset)")
        self.recommended_button.setEnabled(False)
        dec = QWidget()
        dv = QVBoxLayout(dec)
        dv.setContentsMargins(0, 0, 0, 0)
        dv.setSpacing(1)
        dv.addWidget(mode)
        self.decoding_note = QLabel()
        self.decoding_note.setObjectName("decodingNote")
        self.decoding_note.setWordWrap(True)
        self.decoding_note.setStyleSheet("color:#475467;")
        self.decoding_note.hide()
        dv.addWidget(self.decoding_note)
        dv.addWidget(self.recommended_button, 0, Qt.AlignmentFlag.AlignLeft)
        form.addRow("Decoding", dec)
        self._recommended: DecodingDefaults | None = None
        self._applying = False
        sampling = S.get_bool(settings, S.K_DO_SAMPLE, False)
        (self.sample_radio if sampling else self.greedy_radio).setChecked(True)

        self.temperature = _dspin(0.0, 10.0, 0.05, 2, g(S.K_TEMPERATURE, 0.7), "temperature")
        self._add(form, "Temperature", "temperature", self.temperature)
        self.top_k = _ispin(0, 1000000, S.get_int(settings, S.K_TOP_K, 0), "topK")
        self.top_k.setSpecialValueText("off")
        self._add(form, "Top-k", "top_k", self.top_k)
        self.top_p = _dspin(0.0, 1.0, 0.05, 2, g(S.K_TOP_P, 1.0), "topP")
        self._add(form, "Top-p", "top_p", self.top_p)
        self.min_p = _dspin(0.0, 1.0, 0.01, 2, g(S.K_MIN_P, 0.0), "minP")
        self._add(form, "Min-p", "min_p", self.min_p)
        seed_w = QWidget()
        sh = QHBoxLayout(seed_w)
        sh.setContentsMargins(0, 0, 0, 0)
        self.seed_check = QCheckBox("fixed")
        self.seed_check.setObjectName("seedCheck")
        self.seed_check.setToolTip("Unchecked: a fresh random seed for every reply.")
        self.seed_check.setChecked(S.get_bool(settings, S.K_SEED_ON, False))
        self.seed = _ispin(0, SEED_MAX, S.get_int(settings, S.K_SEED, 0), "seed")
        sh.addWidget(self.seed_check)
        sh.addWidget(self.seed, 1)
        self._add(form, "Seed", "rng_seed", seed_w)
        self._sampling_fields = ("temperature", "top_k", "top_p", "min_p", "rng_seed")

        self.repetition_penalty = _dspin(0.0, 10.0, 0.05, 2, g(S.K_REPETITION_PENALTY, 1.0), "repetitionPenalty")
        self.repetition_penalty.setToolTip("> 1 discourages tokens already in the prompt or reply (greedy too).")
        self._add(more, "Repetition penalty", "repetition_penalty", self.repetition_penalty)
        self.presence_penalty = _dspin(0.0, 10.0, 0.1, 2, g(S.K_PRESENCE_PENALTY, 0.0), "presencePenalty")
        self.presence_penalty.setToolTip("Subtracted once from tokens already generated (greedy too).")
        self._add(more, "Presence penalty", "presence_penalty", self.presence_penalty)
        self.frequency_penalty = _dspin(0.0, 10.0, 0.1, 2, g(S.K_FREQUENCY_PENALTY, 0.0), "frequencyPenalty")
        self.frequency_penalty.setToolTip("Subtracted per occurrence in the reply (greedy too).")
        self._add(more, "Frequency penalty", "frequency_penalty", self.frequency_penalty)

        self.stop_strings = QPlainTextEdit()
        self.stop_strings.setObjectName("stopStrings")
        self.stop_strings.setPlaceholderText("One per line (\\n = line break)")
        self.stop_strings.setTabChangesFocus(True)
        self.stop_strings.setMaximumHeight(48)
        self.stop_strings.setPlainText(S.get_str(settings, S.K_STOP_STRINGS))
        self._add(more, "Stop strings", "stop_strings", self.stop_strings)

        self.prompt_format = QLabel("—")
        self.prompt_format.setObjectName("promptFormat")
        self.prompt_format.setWordWrap(True)
        form.addRow("Prompt format", self.prompt_format)  # shown when it is the surprising one (plain text)
        form.setRowVisible(self.prompt_format, False)
        lay.addLayout(form)
        self.more_button = QToolButton()
        self.more_button.setObjectName("moreButton")
        self.more_button.setText("Penalties, min new tokens, stop strings")
        self.more_button.setCheckable(True)
        self.more_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.more_button.setAutoRaise(True)
        self.more_box = QWidget()
        self.more_box.setLayout(more)
        lay.addWidget(self.more_button)
        lay.addWidget(self.more_box)
        self.more_button.toggled.connect(self._show_more)
        self._show_more(S.get_bool(settings, S.K_MORE_SETTINGS, False))

        self._persist(self.max_new_tokens, S.K_MAX_NEW_TOKENS)
        self._persist(self.min_new_tokens, S.K_MIN_NEW_TOKENS)
        self._persist(self.num_assistant, S.K_NUM_ASSISTANT)
        self._persist(self.markov_top_k, S.K_MARKOV_TOP_K)
        self.draft_policy.currentIndexChanged.connect(self._policy_changed)
        self._persist(self.temperature, S.K_TEMPERATURE)
        self._persist(self.top_k, S.K_TOP_K)
        self._persist(self.top_p, S.K_TOP_P)
        self._persist(self.min_p, S.K_MIN_P)
        self._persist(self.seed, S.K_SEED)
        self._persist(self.repetition_penalty, S.K_REPETITION_PENALTY)
        self._persist(self.presence_penalty, S.K_PRESENCE_PENALTY)
        self._persist(self.frequency_penalty, S.K_FREQUENCY_PENALTY)
        self.seed_check.toggled.connect(lambda v: self._changed(S.K_SEED_ON, v))
        self.seed_check.toggled.connect(self._update_enabled)
        self.sample_radio.toggled.connect(lambda v: self._changed(S.K_DO_SAMPLE, v))
        self.sample_radio.toggled.connect(self._update_enabled)
        self.stop_strings.textChanged.connect(
            lambda: self._changed(S.K_STOP_STRINGS, self.stop_strings.toPlainText()))
        self.recommended_button.clicked.connect(self.apply_recommended)
        self.set_draft_loaded(False)
        self._update_enabled()

    # -- building ----------------------------------------------------------------------------------
    def _add(self, form: QFormLayout, label: str, field: str, widget: QWidget, note: str = "") -> None:
        """A form row: the field, an optional note, and a hidden error line under it."""
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(1)
        v.addWidget(widget)
        if note:
            n = QLabel(note)
            n.setObjectName(f"{field}Note")
            n.setWordWrap(True)
            n.setStyleSheet("color:#475467;")
            v.addWidget(n)
            setattr(self, f"{field}_note", n)
        err = QLabel()
        err.setObjectName("fieldError")
        err.setProperty("field", field)
        err.setWordWrap(True)
        err.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        err.setStyleSheet("color:#b42318;")
        err.hide()
        v.addWidget(err)
        self._errors[field] = err
        self._rows[field] = box
        form.addRow(label, box)

    def _show_more(self, on: bool) -> None:
        if self.more_button.isChecked() != on:
            self.more_button.setChecked(on)  # comes back here through toggled
            return
        self.more_button.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.more_box.setVisible(on)
        self.settings.setValue(S.K_MORE_SETTINGS, on)

    def _policy_changed(self, _index: int) -> None:
        self._update_num_assistant_default()
        self._changed(S.K_DRAFT_POLICY, self.policy_name)

    @property
    def policy_name(self) -> str:
        return str(self.draft_policy.currentData() or DEFAULT_POLICY)

    def _update_num_assistant_default(self) -> None:
        """The drafted count a request gets when it does not say, under the chosen policy (the engine's rule)."""
        if not self._draft_loaded:
            self.num_assistant.setSpecialValueText("draft's default")
            return
        count = default_count(self.policy_name, self._default_candidates, self._cut_candidates)
        if count:
            text = f"draft's default ({count})"
        else:
            text = "draft's default"
        self.num_assistant.setSpecialValueText(text)

    def _persist(self, w, key: str) -> None:
        w.valueChanged.connect(lambda v: self._changed(key, v))

    def _changed(self, key: str, value) -> None:
        self.settings.setValue(key, value)
        if key in DECODING_KEYS and not self._applying and not self.custom_decoding:
            self.settings.setValue(S.K_DECODING_CUSTOM, True)  # the person's choice from now on
            self._update_decoding_note()
        self.revalidate()
        self.settings_changed.emit()

    # -- recommended decoding ---------------------------------------------------------------------
    @property
    def custom_decoding(self) -> bool:
        return S.get_bool(self.settings, S.K_DECODING_CUSTOM, False)

    def set_recommended(self, rec: DecodingDefaults) -> None:
        """The loaded target's recommended decoding: applied unless the person chose their own."""
        self._recommended = rec
        self.recommended_button.setEnabled(True)
        if not self.custom_decoding:
            self.apply_recommended()
        self._update_decoding_note()

    def apply_recommended(self) -> None:
        """Put the decoding back to the target's recommendation (the Recommended button)."""
        rec = self._recommended
        if rec is None:
            return
        self._applying = True
        try:
            (self.sample_radio if rec.do_sample else self.greedy_radio).setChecked(True)
            self.temperature.setValue(rec.temperature)
            self.top_k.setValue(rec.top_k)
            self.top_p.setValue(rec.top_p)
            self.min_p.setValue(rec.min_p)
            self.repetition_penalty.setValue(rec.repetition_penalty)
        finally:
            self._applying = False
        self.settings.setValue(S.K_DECODING_CUSTOM, False)
        self._update_decoding_note()

    def _update_decoding_note(self) -> None:
        rec = self._recommended
        if rec is None:
            self.decoding_note.hide()
            return
        where = "the model's generation_config.json" if rec.source != "preset" else "preset"
        text = f"Recommended: {rec.describe()} ({where})"
        if self.custom_decoding:
            text += "; yours differs"
        self.decoding_note.setText(text)
        self.decoding_note.setToolTip("The loaded target's own recommended decoding"
                                      + (f"; a preset because {rec.note}" if rec.note else "")
                                      + ". Greedy is one click away; Recommended puts this back.")
        self.decoding_note.show()

    # -- state from the loaded engine -------------------------------------------------------------
    def set_system_prompt(self, text: str) -> None:
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(text)
        self.system_prompt.blockSignals(False)

    def set_draft_loaded(self, loaded: bool, max_candidates: int | None = None, variant: str | None = None,
                         has_head: bool = False, default_top_k: int = 0, default_candidates: int = 0,
                         cut_candidates: int = 0) -> None:
        self._draft_loaded = loaded
        self._has_head = loaded and has_head
        self._variant = variant if loaded else None
        self._default_top_k = default_top_k
        self._default_candidates = default_candidates
        self._cut_candidates = cut_candidates or default_candidates  # what "what pays" drafts when unset
        self.num_assistant.setMaximum(max_candidates if (loaded and max_candidates) else MAX_ASSISTANT_TOKENS)
        self.num_assistant.setEnabled(loaded)
        self.draft_policy.setEnabled(loaded)
        self._update_num_assistant_default()
        self.num_assistant.setToolTip(NUM_ASSISTANT_TIP if loaded
                                      else "No draft loaded: the target makes one token per step.")
        # markov_head_top_k only means something for a draft with a head (DSpark's, DFlash v2's selector).
        self.form.setRowVisible(self._rows["markov_head_top_k"], self._has_head)
        if self._has_head:
            self.markov_top_k.setSpecialValueText(f"draft's default ({default_top_k})")
            if variant == "dflash_v2":
                note = "K candidates per position scored by DFlash v2's selector (K ≥ 1)."
            else:
                note = "K candidates per position scored by the Markov head; 0 = the dense Markov walk."
            self.markov_head_top_k_note.setText(note)
        self.revalidate()

    def set_chat_template(self, has_template: bool | None) -> None:
        # The usual case (a chat template) needs no row; plain completion is the one to point out.
        self.form.setRowVisible(self.prompt_format, has_template is False)
        if has_template is None:
            self.prompt_format.setText("—")
        elif has_template:
            self.prompt_format.setText("Chat template (the whole conversation is sent).")
        else:
            self.prompt_format.setText("Plain completion: this target has no chat template, so your "
                                       "message is continued as text.")

    @property
    def sampling(self) -> bool:
        return self.sample_radio.isChecked()

    def _update_enabled(self, *_: object) -> None:
        on = self.sampling
        for name in self._sampling_fields:
            self._rows[name].setEnabled(on)
            self.form.labelForField(self._rows[name]).setEnabled(on)
        self.seed.setEnabled(on and self.seed_check.isChecked())
        self.revalidate()

    # -- the config --------------------------------------------------------------------------------
    def raw_config(self, with_draft: bool) -> GenerationConfig:
        """The settings as a GenerationConfig, not validated."""
        n = self.num_assistant.value()
        k = self.markov_top_k.value()
        sampling = self.sampling
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens.value(),
            min_new_tokens=self.min_new_tokens.value(),
            num_assistant_tokens=(n if (n > 0 and with_draft) else None),
            markov_head_top_k=(k if (k >= 0 and with_draft and self._has_head) else None),
            draft_policy=(self.policy_name if with_draft else None),
            stop_strings=parse_stop_strings(self.stop_strings.toPlainText()),
            do_sample=sampling,
            temperature=self.temperature.value() if sampling else 1.0,
            top_k=self.top_k.value() if sampling else 0,
            top_p=self.top_p.value() if sampling else 1.0,
            min_p=self.min_p.value() if sampling else 0.0,
            repetition_penalty=self.repetition_penalty.value(),
            presence_penalty=self.presence_penalty.value(),
            frequency_penalty=self.frequency_penalty.value(),
            rng_seed=(self.seed.value() if (sampling and self.seed_check.isChecked()) else None),
        )

    def config(self, with_draft: bool) -> GenerationConfig:
        """The validated GenerationConfig; a ValueError (also shown under its field) when a value is bad."""
        cfg = self.raw_config(with_draft)
        try:
            cfg.validate()
        except ValueError as e:
            self.show_error(str(e))
            raise
        self.clear_errors()
        return cfg

    def revalidate(self) -> None:
        """Check the settings as they are edited; show the engine's message under the bad field."""
        try:
            self.raw_config(self._draft_loaded).validate()
        except ValueError as e:
            self.show_error(str(e))
            return
        self.clear_errors()

    def show_error(self, message: str) -> bool:
        """Show a ValueError's message under the field it names. False when it names no field here."""
        name = field_of_error(message)
        self.clear_errors()
        if name is None or name not in self._errors:
            return False
        label = self._errors[name]
        label.setText(message.split(" failed: ", 1)[-1])
        label.show()
        if self.more_box.isAncestorOf(label):
            self._show_more(True)  # the field with the problem is never folded away
        return True

    def clear_errors(self) -> None:
        for label in self._errors.values():
            if not label.isHidden():
                label.hide()
                label.clear()

    def field_error(self, name: str) -> str:
        label = self._errors.get(name)
        return label.text() if label is not None and not label.isHidden() else ""
