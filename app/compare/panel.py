"""The comparison panel: the same prompts through the target alone and each draft, side by side.

It builds an engine.bench.runner.BenchSpec from what is picked here (configurations, decoding,
prompt set) and the Session panel's target and device, runs it on the engine's worker thread
(EngineController.bench) with progress and cancel, and shows the runner's rows in a sortable table
and three bar charts; CSV / Markdown come from the runner's own tables, PNG is a picture of the
results. `dflash-studio bench` runs the same runner.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout,
                               QFrame, QGroupBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QListWidget,
                               QListWidgetItem, QProgressBar, QPushButton, QScrollArea, QSizePolicy, QSpinBox,
                               QSplitter, QTableWidget, QTableWidgetItem, QTextBrowser, QVBoxLayout,
                               QWidget)

from app import settings as S
from app.compare.charts import SLOW_COLOR, BenchCharts
from app.worker import BenchJob, EngineController, ErrorInfo
from engine.bench.datasets import available_sets
from engine.bench.report import BenchResult
from engine.bench.spec import BenchSpec, Decoding

FILE_SET = "__file__"
SORT_ROLE = Qt.ItemDataRole.UserRole + 7

# (header, row key, format) — the figures first, then what the configuration was.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("configuration", "config", "{}"),
    ("tok/s", "tok_s", "{:.1f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("tokens/step", "tokens_per_step", "{:.2f}"),
    ("TPOT ms", "tpot_ms", "{:.2f}"),
    ("TTFT ms", "ttft_ms", "{:.1f}"),
    ("matches target", "matches_target", "{}"),
    ("accepted", "acceptance_rate", "{:.0%}"),
    ("n", "num_assistant_tokens", "{}"),
    ("K", "markov_head_top_k", "{}"),
    ("decoding", "decoding", "{}"),
    ("variant", "variant", "{}"),
    ("draft step ms", "draft_step_ms", "{:.2f}"),
    ("backbone ms", "draft_model_ms", "{:.2f}"),
    ("head ms", "markov_head_ms", "{:.2f}"),
    ("sampling ms", "sampling_ms", "{:.2f}"),
    ("prompts", "prompts", "{}"),
)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def short_label(row: dict) -> str:
    """A chart label: target / draft name, n, K, the peer, the sampling temperature."""
    genai = row.get("engine") == "openvino_genai"
    if row.get("draft") is None:
        text = "target alone"
    else:
        text = f"{row['draft']} n{row['num_assistant_tokens']}"
        if row.get("markov_head_top_k") is not None:
            text += f" K{row['markov_head_top_k']}"
    if genai:
        text += " · genai"
    if row.get("decoding", "greedy") != "greedy":
        text += " · " + str(row["decoding"]).split(" seed")[0]
    return text


def parse_numbers(text: str, kind: type, field: str) -> list:
    """'3 7' / '3, 7' -> [3, 7]; ValueError naming the field when something is not a number."""
    out = []
    for part in text.replace(",", " ").split():
        try:
            out.append(kind(part))
        except ValueError:
            raise ValueError(f"{field}: {part!r} is not a {'whole number' if kind is int else 'number'}.") from None
    return out


class NumericItem(QTableWidgetItem):
    """A cell that sorts by its number (None sorts first), shows its formatted text."""

    def __lt__(self, other: QTableWidgetItem) -> bool:  # noqa: D105
        a, b = self.data(SORT_ROLE), other.data(SORT_ROLE)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return a < b
        if a is None or b is None:
            return a is None and b is not None
        return str(a) < str(b)


class ComparePanel(QWidget):
    run_started = Signal()
    run_finished = Signal(object)  # BenchResult, or None when it failed

    def __init__(self, controller: EngineController, model_panel: Any, settings: QSettings,
                 loader: Any = None, machine: dict[str, str] | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("comparePanel")
        self.controller = controller
        self.model_panel = model_panel
        self.settings = settings
        self.loader = loader  # None: the chat's loader (the real engine in the app)
        self.machine = machine
        self.result: BenchResult | None = None
        self.job: BenchJob | None = None
        self._file_set = ""
        self._t0 = 0.0

        split = QSplitter(Qt.Orientation.Horizontal)
        split.setChildrenCollapsible(False)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(split)
        split.addWidget(self._build_setup())
        split.addWidget(self._build_results())
        split.setStretchFactor(1, 1)
        split.setSizes([330, 900])

        controller.bench_progress.connect(self._on_progress)
        controller.bench_finished.connect(self._on_finished)
        controller.bench_failed.connect(self._on_failed)
        model_panel.selection_changed.connect(self.refresh_session)
        self._default_tick: str | None = None  # the draft ticked for the user (refresh_session)
        self._follow, self._populating = True, False
        self.draft_list.itemChanged.connect(self._ticked)
        self.refresh_session()
        self._update_buttons()

    # -- building ----------------------------------------------------------------------------------
    def _build_setup(self) -> QWidget:
        """The left side: what to compare, decoding, prompts, Run; in a scroll area as wide as the form."""
        side = QWidget()
        v = QVBoxLayout(side)
        v.setContentsMargins(0, 0, 4, 0)
        v.addWidget(self._what_box())
        v.addWidget(self._decoding_box())
        v.addWidget(self._prompts_box())
        self._add_run_controls(v)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(side)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # As wide as the form needs (never clipped), plus room for the vertical scroll bar.
        scroll.setMinimumWidth(max(300, side.minimumSizeHint().width()
                                   + scroll.verticalScrollBar().sizeHint().width() + 4))
        return scroll

    def _saved(self, name: str) -> str:
        return S.K_COMPARE + name

    @staticmethod
    def _form_box(title: str) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        f = QFormLayout(box)
        f.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        return box, f

    def _what_box(self) -> QGroupBox:
        """The session's target, the baselines and the drafts, and the per-draft settings to sweep."""
        g, key = self.settings, self._saved
        box, f = self._form_box("What to compare")
        self.session_label = QLabel()
        self.session_label.setObjectName("compareSession")
        self.session_label.setWordWrap(True)
        f.addRow(self.session_label)
        self.base_check = QCheckBox("Target alone (this engine)")
        self.base_check.setChecked(True)
        self.base_check.setEnabled(False)
        self.base_check.setToolTip("Always run: every speedup is this row's TPOT / the configuration's TPOT.")
        f.addRow(self.base_check)
        self.genai_target_check = QCheckBox("Target alone (openvino_genai.LLMPipeline)")
        self.genai_target_check.setObjectName("genaiTargetCheck")
        self.genai_target_check.setChecked(S.get_bool(g, key("genai_target"), True))
        f.addRow(self.genai_target_check)
        f.addRow(QLabel("Drafts (from the Session panel's list)"))
        self.draft_list = QListWidget()
        self.draft_list.setObjectName("compareDrafts")
        self.draft_list.setMaximumHeight(110)
        self.draft_list.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        f.addRow(self.draft_list)
        self.genai_dflash_check = QCheckBox("openvino_genai DFlash too (where it can run)")
        self.genai_dflash_check.setObjectName("genaiDflashCheck")
        self.genai_dflash_check.setToolTip("openvino_genai's own DFlash with the same draft: DFlash v1 drafts "
                                           "without a Markov head, greedy. Others are skipped with a note.")
        self.genai_dflash_check.setChecked(S.get_bool(g, key("genai_dflash"), True))
        f.addRow(self.genai_dflash_check)
        self.n_edit = QLineEdit(S.get_str(g, key("num_assistant_tokens")))
        self.n_edit.setObjectName("compareN")
        self.n_edit.setPlaceholderText("draft's default   (e.g. 3 7)")
        self.n_edit.setToolTip("num_assistant_tokens: one row per value. Empty: the draft's own default (its "
                               "config's num_assistant_tokens, else a full block).")
        f.addRow("Draft tokens/step", self.n_edit)
        self.k_edit = QLineEdit(S.get_str(g, key("markov_head_top_k")))
        self.k_edit.setObjectName("compareK")
        self.k_edit.setPlaceholderText("draft's default   (e.g. 8 0)")
        self.k_edit.setToolTip("markov_head_top_k for drafts with a Markov head: one row per value "
                               "(0 = DSpark's dense walk). Drafts without a head ignore it.")
        f.addRow("Markov head K", self.k_edit)
        return box

    def _decoding_box(self) -> QGroupBox:
        g, key = self.settings, self._saved
        box, f = self._form_box("Decoding")
        self.greedy_check = QCheckBox("Greedy (compared with the target alone)")
        self.greedy_check.setObjectName("compareGreedy")
        self.greedy_check.setChecked(S.get_bool(g, key("greedy"), True))
        f.addRow(self.greedy_check)
        self.temps_edit = QLineEdit(S.get_str(g, key("temperatures")))
        self.temps_edit.setObjectName("compareTemperatures")
        self.temps_edit.setPlaceholderText("none   (e.g. 0.7 1.0)")
        self.temps_edit.setToolTip("Sampled rows at each temperature (each with its own target-alone baseline).")
        f.addRow("Sampled at T", self.temps_edit)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.0, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(S.get_float(g, key("top_p"), 1.0))
        f.addRow("Top-p", self.top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000000)
        self.top_k.setSpecialValueText("off")
        self.top_k.setValue(S.get_int(g, key("top_k"), 0))
        f.addRow("Top-k", self.top_k)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setValue(S.get_int(g, key("seed"), 0))
        f.addRow("Seed", self.seed)
        return box

    def _prompts_box(self) -> QGroupBox:
        g, key = self.settings, self._saved
        box, f = self._form_box("Prompts")
        self.set_combo = QComboBox()
        self.set_combo.setObjectName("compareSet")
        for name, label in available_sets():
            self.set_combo.addItem(label, name)
        self.set_combo.addItem("JSONL file…", FILE_SET)
        self.set_combo.setToolTip("A JSONL file has one object per line with a \"prompt\" (or \"turns\") field.")
        f.addRow("Set", self.set_combo)
        self.count = QSpinBox()
        self.count.setObjectName("comparePrompts")
        self.count.setRange(1, 10000)
        self.count.setValue(S.get_int(g, key("prompts"), 4))
        f.addRow("Prompts", self.count)
        self.max_new = QSpinBox()
        self.max_new.setObjectName("compareMaxNew")
        self.max_new.setRange(2, 32768)
        self.max_new.setValue(S.get_int(g, key("max_new_tokens"), 64))
        f.addRow("New tokens each", self.max_new)
        self.exact_check = QCheckBox("Exact f32 inference")
        self.exact_check.setObjectName("compareExact")
        self.exact_check.setToolTip("f32 compute and KV cache, no dynamic quantization: greedy outputs then "
                                    "equal the target alone's token for token (slower).")
        self.exact_check.setChecked(S.get_bool(g, key("exact"), False))
        f.addRow(self.exact_check)
        saved = S.get_str(g, key("dataset"), "smoke")
        if Path(saved).suffix == ".jsonl" and Path(saved).is_file():
            self._use_file(saved)
        else:
            i = self.set_combo.findData(saved)
            self.set_combo.setCurrentIndex(max(i, 0))
        self.set_combo.activated.connect(self._set_chosen)
        return box

    def _add_run_controls(self, v: QVBoxLayout) -> None:
        """Run / Cancel, the progress bar and the status line."""
        row = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setObjectName("compareRun")
        self.run_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("compareCancel")
        row.addWidget(self.run_button)
        row.addWidget(self.cancel_button)
        v.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setObjectName("compareProgress")
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.setTextVisible(False)
        v.addWidget(self.progress)
        self.status = QLabel("Pick what to compare, then Run. Each configuration runs every prompt, one "
                             "request at a time, after one warm-up.")
        self.status.setObjectName("compareStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        v.addWidget(self.status)
        v.addStretch(1)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)

    def _build_results(self) -> QWidget:
        self.results = QWidget()
        self.results.setObjectName("compareResults")
        v = QVBoxLayout(self.results)
        v.setContentsMargins(4, 0, 0, 0)
        top = QHBoxLayout()
        self.summary = QLabel("No results yet: choose what to compare on the left and press Run.")
        self.summary.setObjectName("compareSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        top.addWidget(self.summary, 1)
        self.csv_button = QPushButton("Export CSV…")
        self.md_button = QPushButton("Export Markdown…")
        self.png_button = QPushButton("Export PNG…")
        for b in (self.csv_button, self.md_button, self.png_button):
            top.addWidget(b)
        self.csv_button.clicked.connect(lambda: self._export_dialog("CSV (*.csv)", ".csv", self.export_csv))
        self.md_button.clicked.connect(lambda: self._export_dialog("Markdown (*.md)", ".md", self.export_markdown))
        self.png_button.clicked.connect(lambda: self._export_dialog("PNG image (*.png)", ".png", self.export_png))
        v.addLayout(top)

        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("compareTable")
        self.table.setHorizontalHeaderLabels([c[0] for c in COLUMNS])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(22)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(False)
        hh.setSortIndicatorShown(True)
        hh.setSortIndicator(-1, Qt.SortOrder.AscendingOrder)
        self.table.setSortingEnabled(True)
        split.addWidget(self.table)
        self.charts = BenchCharts()
        split.addWidget(self.charts)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        v.addWidget(split, 1)
        self.notes = QTextBrowser()
        self.notes.setObjectName("compareNotes")
        self.notes.setStyleSheet("QTextBrowser { color:#475467; background:#f9fafb; border:1px solid #eaecf0; "
                                 "border-radius:4px; }")
        self.notes.setMaximumHeight(70)
        self.notes.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.notes.hide()
        v.addWidget(self.notes)
        return self.results

    # -- session (target, device, drafts) ----------------------------------------------------------
    def refresh_session(self) -> None:
        mp = self.model_panel
        target = mp.target_dir()
        device = mp.device()
        self.session_label.setText(f"<b>Target</b> {Path(target).name or '—'} on <b>{device}</b> "
                                   "(chosen in the Session panel)")
        self.session_label.setToolTip(target)
        checked = set(self.checked_drafts()) | set(S.get_list(self.settings, S.K_COMPARE + "drafts"))
        if self._follow and not self.settings.contains(S.K_COMPARE + "drafts"):
            # until the user ticks a box or a run saves a choice, the tick follows the chat's draft, so a first
            # Run compares it
            checked.discard(self._default_tick or "")
            self._default_tick = mp.draft_dir()
            if self._default_tick:
                checked.add(self._default_tick)
        self._populating = True
        self.draft_list.clear()
        for path, reasons in mp.draft_choices():
            # The fit is said in words after the name: a "✓" beside an unticked box read as ticked.
            it = QListWidgetItem(Path(path).name + ("  (fits)" if not reasons else "  (does not fit this target)"))
            it.setData(Qt.ItemDataRole.UserRole, path)
            if reasons:
                it.setFlags(it.flags() & ~Qt.ItemFlag.ItemIsEnabled & ~Qt.ItemFlag.ItemIsUserCheckable)
                it.setToolTip(path + "\nDoes not fit this target:\n" + "\n".join("• " + r for r in reasons))
            else:
                it.setFlags(it.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                it.setCheckState(Qt.CheckState.Checked if path in checked else Qt.CheckState.Unchecked)
                it.setToolTip(path)
            self.draft_list.addItem(it)
        if not self.draft_list.count():
            it = QListWidgetItem("No drafts listed: add one in the Session panel (Draft …).")
            it.setFlags(Qt.ItemFlag.NoItemFlags)
            self.draft_list.addItem(it)
        self._populating = False
        self._update_buttons()

    def _ticked(self, _item: QListWidgetItem) -> None:
        if not self._populating:
            self._follow = False  # the user's own choice from now on

    def checked_drafts(self) -> list[str]:
        out = []
        for i in range(self.draft_list.count()):
            it = self.draft_list.item(i)
            if it.data(Qt.ItemDataRole.UserRole) and it.checkState() == Qt.CheckState.Checked:
                out.append(it.data(Qt.ItemDataRole.UserRole))
        return out

    def set_drafts_checked(self, paths: list[str]) -> None:
        want = {str(p) for p in paths}
        for i in range(self.draft_list.count()):
            it = self.draft_list.item(i)
            p = it.data(Qt.ItemDataRole.UserRole)
            if p and it.flags() & Qt.ItemFlag.ItemIsUserCheckable:
                it.setCheckState(Qt.CheckState.Checked if p in want else Qt.CheckState.Unchecked)

    # -- prompt sets -------------------------------------------------------------------------------
    def _set_chosen(self, _i: int) -> None:
        if self.set_combo.currentData() == FILE_SET:
            path, _ = QFileDialog.getOpenFileName(self, "Prompt file (JSONL)", str(Path.home()),
                                                  "JSON lines (*.jsonl);;All files (*)")
            if path:
                self._use_file(path)
            else:
                self.set_combo.setCurrentIndex(0)

    def _use_file(self, path: str) -> None:
        self._file_set = path
        i = self.set_combo.findData(path)
        if i < 0:
            self.set_combo.insertItem(self.set_combo.count() - 1, Path(path).name, path)
            i = self.set_combo.count() - 2
            self.set_combo.setItemData(i, path, Qt.ItemDataRole.ToolTipRole)
        self.set_combo.setCurrentIndex(i)

    def set_dataset(self, name: str) -> None:
        """Choose a set by name (humaneval, mt-bench, a resources set) or a JSONL path."""
        i = self.set_combo.findData(name)
        if i >= 0:
            self.set_combo.setCurrentIndex(i)
        else:
            self._use_file(name)

    def dataset(self) -> str:
        return str(self.set_combo.currentData() or "smoke")

    # -- running -----------------------------------------------------------------------------------
    def spec(self) -> BenchSpec:
        """The BenchSpec of the current choices; ValueError naming the setting when one is wrong."""
        mp = self.model_panel
        target = mp.target_dir()
        if not target or not Path(target).is_dir():
            raise ValueError("Choose a target in the Session panel first (the comparison runs on it).")
        ns = parse_numbers(self.n_edit.text(), int, "Draft tokens/step") or [None]
        ks = parse_numbers(self.k_edit.text(), int, "Markov head K") or [None]
        temps = parse_numbers(self.temps_edit.text(), float, "Sampled at T")
        decodings = [Decoding()] if self.greedy_check.isChecked() else []
        for t in temps:
            decodings.append(Decoding(True, t, self.top_k.value(), self.top_p.value(), rng_seed=self.seed.value()))
        if not decodings:
            raise ValueError("Decoding: tick Greedy or give a sampling temperature.")
        drafts = [Path(p) for p in self.checked_drafts()]
        spec = BenchSpec(Path(target), drafts, self.dataset(), self.count.value(), self.max_new.value(),
                         mp.device(), "f32" if self.exact_check.isChecked() else "default", ns, ks, decodings,
                         genai_target=self.genai_target_check.isChecked(),
                         genai_dflash=self.genai_dflash_check.isChecked())
        return spec.validate()

    def run(self) -> bool:
        if self.controller.benchmarking:
            return False
        try:
            spec = self.spec()
        except ValueError as e:
            self._set_status(str(e), error=True)
            return False
        self._remember(spec)
        self.job = BenchJob(spec, loader=self.loader, machine=self.machine)
        if not self.controller.bench(self.job):
            self._set_status("The engine is shutting down.", error=True)
            return False
        self._t0 = time.perf_counter()
        self.progress.setValue(0)
        waiting = " (after the chat reply that is streaming)" if self.controller.generating else ""
        n_conf = len(spec.decodings) * (1 + len(spec.drafts) * len(spec.num_assistant_tokens))
        self._set_status(f"Starting{waiting}: {spec.prompts} {spec.dataset} prompts × at least {n_conf} "
                         f"configurations, {spec.max_new_tokens} new tokens each…")
        self._update_buttons()
        self.run_started.emit()
        return True

    def cancel(self) -> None:
        if self.controller.benchmarking:
            self.controller.cancel_bench()
            self._set_status("Cancelling: the runner stops before its next prompt…")
            self.cancel_button.setEnabled(False)

    @property
    def running(self) -> bool:
        return self.job is not None

    def _on_progress(self, message: str, fraction: object) -> None:
        if self.job is None:
            return
        if isinstance(fraction, (int, float)):
            self.progress.setValue(int(1000 * max(0.0, min(1.0, float(fraction)))))
            self.progress.setTextVisible(True)
            self.progress.setFormat(f"{100 * float(fraction):.0f}%")
        if not (self.job.cancel_event.is_set()):
            self._set_status(f"{message} · {time.perf_counter() - self._t0:.0f} s")

    def _on_finished(self, result: BenchResult) -> None:
        if self.job is None:
            return
        self.job = None
        secs = time.perf_counter() - self._t0
        self.show_result(result)
        if result.cancelled:
            self._set_status(f"Cancelled after {result.prompts_done} of {result.prompts_planned} prompts "
                             f"({secs:.0f} s). " + ("The table shows the prompts every configuration finished."
                                                    if result.prompts_done else "Nothing finished yet."))
        else:
            self.progress.setValue(1000)
            self._set_status(f"Done: {result.prompts_done} prompts × {len(result.rows)} configurations in "
                             f"{secs:.0f} s.")
        self._update_buttons()
        self.run_finished.emit(result)

    def _on_failed(self, err: ErrorInfo) -> None:
        if self.job is None:
            return
        self.job = None
        self._set_status(f"{err.title}: {err.message}", error=True)
        self.status.setToolTip(err.details)
        self._update_buttons()
        self.run_finished.emit(None)

    def _set_status(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet("color:#b42318;" if error else "")

    def _update_buttons(self) -> None:
        running = self.job is not None
        self.run_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        has = self.result is not None and bool(self.result.rows)
        for b in (self.csv_button, self.md_button, self.png_button):
            b.setEnabled(has and not running)

    def _remember(self, spec: BenchSpec) -> None:
        g, k = self.settings, S.K_COMPARE
        g.setValue(k + "genai_target", self.genai_target_check.isChecked())
        g.setValue(k + "genai_dflash", self.genai_dflash_check.isChecked())
        g.setValue(k + "num_assistant_tokens", self.n_edit.text())
        g.setValue(k + "markov_head_top_k", self.k_edit.text())
        g.setValue(k + "greedy", self.greedy_check.isChecked())
        g.setValue(k + "temperatures", self.temps_edit.text())
        g.setValue(k + "top_p", self.top_p.value())
        g.setValue(k + "top_k", self.top_k.value())
        g.setValue(k + "seed", self.seed.value())
        g.setValue(k + "dataset", spec.dataset)
        g.setValue(k + "prompts", self.count.value())
        g.setValue(k + "max_new_tokens", self.max_new.value())
        g.setValue(k + "exact", self.exact_check.isChecked())
        g.setValue(k + "drafts", [str(p) for p in spec.drafts])

    # -- results -----------------------------------------------------------------------------------
    def show_result(self, result: BenchResult) -> None:
        self.result = result
        rows = [r.as_dict() for r in result.rows]
        t = self.table
        t.setSortingEnabled(False)
        t.setRowCount(len(rows))
        for i, d in enumerate(rows):
            for j, (_h, key, fmt) in enumerate(COLUMNS):
                value = d.get(key)
                if key == "matches_target":
                    text = "n/a (sampled)" if value is None else f"{value}/{d['prompts']}"
                    sort = -1 if value is None else value / max(int(d["prompts"]), 1)
                elif value is None or (key in ("num_assistant_tokens",) and not value):
                    text, sort = "–", None
                else:
                    text, sort = fmt.format(value), value
                item = NumericItem(text)
                item.setData(SORT_ROLE, sort)
                if j:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if key == "config":
                    item.setToolTip("\n".join(f"{k}: {v}" for k, v in d.items()))
                if key == "speedup" and isinstance(value, (int, float)) and value < 1.0 and d.get("draft"):
                    item.setForeground(QColor(SLOW_COLOR))
                t.setItem(i, j, item)
        t.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)  # the run's order until a click
        t.setSortingEnabled(True)
        t.resizeColumnsToContents()
        t.setColumnWidth(0, min(max(t.columnWidth(0), 200), 330))
        want = t.horizontalHeader().height() + 22 * min(len(rows), 10) + 24
        t.setMinimumHeight(min(want, 280))
        self.charts.set_rows(rows, short_label)
        m = result.machine
        s = result.settings
        self.summary.setText(f"<b>{s.get('target')}</b> on {m.get('device', s.get('device'))} · "
                             f"{result.prompts_done} × {Path(str(s.get('dataset'))).name} prompts · "
                             f"{s.get('max_new_tokens')} new tokens · precision {s.get('precision')}")
        self.summary.setToolTip("\n".join(result.header_lines()))
        if result.notes:
            items = "".join(f"<li>{_html(n)}</li>" for n in result.notes)
            self.notes.setHtml(f"<div style='margin:0'><b>Notes</b> ({len(result.notes)})"
                               f"<ul style='margin:0 0 0 -20px'>{items}</ul></div>")
            self.notes.setToolTip("\n".join(result.notes))
            self.notes.show()
        else:
            self.notes.hide()
        self._update_buttons()

    def table_rows(self) -> list[list[str]]:
        """The table's text as shown (in its current sort order)."""
        return [[self.table.item(i, j).text() for j in range(self.table.columnCount())]
                for i in range(self.table.rowCount())]

    # -- export ------------------------------------------------------------------------------------
    def _export_dialog(self, filt: str, suffix: str, write) -> None:
        if self.result is None:
            return
        start = str(Path.home() / f"dflash-compare-{time.strftime('%Y%m%d-%H%M')}{suffix}")
        path, _ = QFileDialog.getSaveFileName(self, "Export the comparison", start, filt)
        if path:
            if not path.endswith(suffix):
                path += suffix
            try:
                write(path)
            except OSError as e:
                self._set_status(f"Could not write {path}: {e}", error=True)
                return
            self._set_status(f"Saved {path}")

    def export_csv(self, path: str | Path) -> Path:
        assert self.result is not None
        Path(path).write_text(self.result.csv(), encoding="utf-8")
        return Path(path)

    def export_markdown(self, path: str | Path) -> Path:
        assert self.result is not None
        Path(path).write_text("Comparison panel (DFlash Studio)\n\n" + self.result.markdown(), encoding="utf-8")
        return Path(path)

    def export_png(self, path: str | Path) -> Path:
        if not self.results.grab().save(str(path), "PNG"):
            raise OSError(f"Qt could not write the image {path}")
        return Path(path)
