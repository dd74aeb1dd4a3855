"""Import a Hugging Face folder: see what it holds, export it to OpenVINO in a child process, add it.

The dialog reads the folder with `engine.inspect_folder` (Qt-free, no torch), checks a draft checkpoint
against the chosen target before exporting, runs `python -m engine.cli export ...` as a QProcess
(the GUI process never imports torch or optimum) with its output streamed into a log, and validates
the result with the engine's own readers before it emits `imported(path, kind)`.

Disk: an import never overwrites a folder. The exporters write a `.<name>.partial-*` sibling and
rename it at the end; a cancelled or failed export kills the process and removes that sibling and
anything at the destination (which did not exist before), so nothing half-written stays behind.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from PySide6.QtCore import QProcess, QSettings, Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QFileDialog, QFormLayout, QGroupBox,
                               QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton,
                               QSizePolicy, QVBoxLayout, QWidget)

from app.models.child_process import LogView, child_process
from app.qt_tracking import TrackedTimer
from engine import inspect_folder as F
from engine import paths

K_LAST_FOLDER = "import/last_folder"

FORMAT_HINTS = {
    "int4": "int4: the smallest and fastest; some quality loss (for a draft: fewer accepted tokens, never other text).",
    "int8": "int8: a quarter of fp32's size, close to fp32 quality. The usual choice.",
    "fp16": "fp16: half of fp32's size, fp32 quality on GPU.",
    "fp32": "fp32: full precision, the largest; for exact comparisons.",
}

# What each exporter says (or leaves on disk) as it goes: (log text or None, step label).
# None = the step is recognised by the temp sibling appearing next to the destination.
TARGET_STEPS = (
    ("", "starting Python and optimum-intel"),
    ("Converting ", "converting to OpenVINO"),
    ("Compressing weights", "compressing the weights"),
    ("Locating decoder-layer outputs", "finding the decoder-layer outputs"),
    ("Moving the finished export", "moving the export into place"),
    ("", "checking the result"),
)
DRAFT_STEPS = (
    ("", "starting Python and torch, reading the checkpoint"),
    (None, "writing the OpenVINO IR"),
    ("", "checking the result"),
)

STATE_IDLE, STATE_RUNNING, STATE_CANCELLING, STATE_DONE, STATE_FAILED, STATE_CANCELLED = (
    "idle", "running", "cancelling", "done", "failed", "cancelled")


def export_command(kind: str, source: Path, dest: Path, weight_format: str) -> tuple[str, list[str]]:
    """The child process: this Python running the engine's CLI (`dflash-studio export`)."""
    return sys.executable, ["-m", "engine.cli", "export", "--kind", kind, "--input", str(source),
                            "--output", str(dest), "--weight-format", weight_format]


class ImportDialog(QDialog):
    """Pick a Hugging Face folder, see what it holds, export it, validate it, hand it to the model lists."""

    imported = Signal(str, str)  # OpenVINO folder, "target" | "draft"
    state_changed = Signal(str)  # idle | running | cancelling | done | failed | cancelled

    def __init__(self, parent: QWidget | None = None, *, target_dir: str | None = None,
                 settings: QSettings | None = None, models_root: Path | None = None,
                 drafts_root: Path | None = None, folder: str | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("importDialog")
        self.setWindowTitle("Import a Hugging Face folder")
        self.resize(760, 720)
        self.settings = settings
        self.models_root = Path(models_root) if models_root else paths.models_dir()
        self.drafts_root = Path(drafts_root) if drafts_root else paths.default_drafts_dir()
        self.target_dir: str | None = target_dir or None
        self.info: F.FolderInfo | None = None
        self.check: F.DraftCheck | None = None
        self.state = STATE_IDLE
        self.dest: Path | None = None
        self.result_path: Path | None = None
        self.result_kind: str | None = None
        self.result_reasons: list[str] = []
        self.error = ""
        self._dest_edited = False
        self._formats_for: Path | None = None  # the folder the format default was chosen for
        self._steps: tuple[tuple[str | None, str], ...] = ()
        self._step = 0
        self._started = 0.0
        self._tail = ""

        lay = QVBoxLayout(self)
        intro = QLabel("Convert a Hugging Face checkpoint folder (a chat model, or a DFlash / DSpark draft "
                       "trained for one) to OpenVINO, and add it to the model lists.")
        intro.setWordWrap(True)
        lay.addWidget(intro)

        row = QHBoxLayout()
        self.folder_edit = QLineEdit()
        self.folder_edit.setObjectName("importFolder")
        self.folder_edit.setPlaceholderText("Hugging Face folder (config.json, *.safetensors, tokenizer files)")
        self.folder_edit.editingFinished.connect(lambda: self.set_folder(self.folder_edit.text()))
        self.browse_button = QPushButton("Choose folder…")
        self.browse_button.setObjectName("importBrowse")
        self.browse_button.clicked.connect(self._browse_folder)
        row.addWidget(QLabel("Folder"))
        row.addWidget(self.folder_edit, 1)
        row.addWidget(self.browse_button)
        lay.addLayout(row)

        # -- what the folder holds -----------------------------------------------------------------
        self.holds_box = QGroupBox("What it holds")
        hl = QVBoxLayout(self.holds_box)
        self.title_label = QLabel("Choose a folder.")
        self.title_label.setObjectName("importTitle")
        self.title_label.setWordWrap(True)
        self.title_label.setTextFormat(Qt.TextFormat.RichText)
        hl.addWidget(self.title_label)
        self.facts = QFormLayout()
        self.facts.setContentsMargins(12, 0, 0, 0)
        self.facts.setHorizontalSpacing(14)
        hl.addLayout(self.facts)
        self.reason_label = QLabel()
        self.reason_label.setObjectName("importReason")
        self.reason_label.setWordWrap(True)
        self.reason_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        hl.addWidget(self.reason_label)
        self.notes_label = QLabel()
        self.notes_label.setObjectName("importNotes")
        self.notes_label.setWordWrap(True)
        self.notes_label.setStyleSheet("color: palette(placeholder-text);")
        hl.addWidget(self.notes_label)
        lay.addWidget(self.holds_box)

        # -- draft against target ------------------------------------------------------------------
        self.fit_box = QGroupBox("Does the draft fit the target?")
        fl = QVBoxLayout(self.fit_box)
        trow = QHBoxLayout()
        self.fit_target_label = QLabel()
        self.fit_target_label.setObjectName("importFitTarget")
        self.fit_target_label.setWordWrap(True)
        self.fit_target_button = QPushButton("Other target…")
        self.fit_target_button.clicked.connect(self._browse_target)
        trow.addWidget(self.fit_target_label, 1)
        trow.addWidget(self.fit_target_button)
        fl.addLayout(trow)
        self.fit_label = QLabel()
        self.fit_label.setObjectName("importFit")
        self.fit_label.setWordWrap(True)
        self.fit_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        fl.addWidget(self.fit_label)
        self.fit_notes = QLabel()
        self.fit_notes.setObjectName("importFitNotes")
        self.fit_notes.setWordWrap(True)
        self.fit_notes.setStyleSheet("color: palette(placeholder-text);")
        fl.addWidget(self.fit_notes)
        self.anyway_check = QCheckBox("Import it anyway (it will be listed as not fitting this target)")
        self.anyway_check.setObjectName("importAnyway")
        self.anyway_check.toggled.connect(lambda _on: self._update_buttons())
        fl.addWidget(self.anyway_check)
        lay.addWidget(self.fit_box)

        # -- export settings -----------------------------------------------------------------------
        self.export_box = QGroupBox("Export")
        form = QFormLayout(self.export_box)
        frow = QHBoxLayout()
        self.format_combo = QComboBox()
        self.format_combo.setObjectName("importFormat")
        for fmt in F.TARGET_WEIGHT_FORMATS:
            self.format_combo.addItem(fmt, fmt)
        self.format_combo.currentIndexChanged.connect(self._format_changed)
        self.format_hint = QLabel()
        self.format_hint.setWordWrap(True)
        self.format_hint.setStyleSheet("color: palette(placeholder-text);")
        frow.addWidget(self.format_combo)
        frow.addWidget(self.format_hint, 1)
        form.addRow("Weight format", frow)
        drow = QHBoxLayout()
        self.dest_edit = QLineEdit()
        self.dest_edit.setObjectName("importDest")
        self.dest_edit.textEdited.connect(self._dest_typed)
        self.dest_button = QPushButton("Choose…")
        self.dest_button.clicked.connect(self._browse_dest)
        drow.addWidget(self.dest_edit, 1)
        drow.addWidget(self.dest_button)
        form.addRow("Destination", drow)
        self.dest_problem = QLabel()
        self.dest_problem.setObjectName("importDestProblem")
        self.dest_problem.setWordWrap(True)
        form.addRow("", self.dest_problem)
        lay.addWidget(self.export_box)

        # -- progress, log, buttons ----------------------------------------------------------------
        self.status_label = QLabel()
        self.status_label.setObjectName("importStatus")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.status_label)
        self.progress = QProgressBar()
        self.progress.setObjectName("importProgress")
        self.progress.setTextVisible(True)
        lay.addWidget(self.progress)
        self.log = LogView()
        self.log.setObjectName("importLog")
        self.log.setPlaceholderText("The exporter's output appears here while it runs.")
        self.log.setMinimumHeight(110)
        self.log.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        lay.addWidget(self.log, 1)
        brow = QHBoxLayout()
        brow.addStretch(1)
        self.export_button = QPushButton("Export and add")
        self.export_button.setObjectName("importExport")
        self.export_button.setDefault(True)
        self.export_button.clicked.connect(self.start_export)
        self.cancel_button = QPushButton("Close")
        self.cancel_button.setObjectName("importCancel")
        self.cancel_button.setAutoDefault(False)
        self.cancel_button.clicked.connect(self._cancel_clicked)
        brow.addWidget(self.export_button)
        brow.addWidget(self.cancel_button)
        lay.addLayout(brow)

        self.proc = child_process(self)
        self.proc.readyReadStandardOutput.connect(self._read)
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)
        self.ticker = TrackedTimer(self)  # elapsed time, and the temp sibling's appearance (draft step 2)
        self.ticker.setInterval(500)
        self.ticker.timeout.connect(self._tick)

        self.export_unavailable = F.export_unavailable_reason()
        self._status("", "info")
        self._show_info()
        if folder:
            self.set_folder(folder)

    # -- the folder ------------------------------------------------------------------------------
    def set_folder(self, path: str) -> None:
        if self.state in (STATE_RUNNING, STATE_CANCELLING):
            return
        path = path.strip()
        if self.folder_edit.text() != path:
            self.folder_edit.setText(path)
        if not path:
            self.info = None
        else:
            self.info = F.inspect_hf_folder(path)
            if self.settings is not None:
                self.settings.setValue(K_LAST_FOLDER, path)
        self._set_state(STATE_IDLE)
        self._status("", "info")
        self._dest_edited = False
        self._show_info()

    def _browse_folder(self) -> None:
        start = self.folder_edit.text() or (self.settings.value(K_LAST_FOLDER, "") if self.settings else "")
        d = QFileDialog.getExistingDirectory(self, "Hugging Face folder to import", str(start or Path.home()))
        if d:
            self.set_folder(d)

    def set_target(self, target_dir: str | None) -> None:
        """The target a draft is checked against (the Session panel's current target by default)."""
        self.target_dir = target_dir or None
        self._show_info()

    def _browse_target(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Target to check the draft against (OpenVINO folder)",
                                             self.target_dir or str(self.models_root))
        if d:
            self.set_target(d)

    def _show_info(self) -> None:
        info = self.info
        while self.facts.rowCount():
            self.facts.removeRow(0)
        self.check = None
        self.reason_label.clear()
        self.notes_label.clear()
        if info is None:
            self.title_label.setText("Choose a Hugging Face folder to see what it holds.")
        elif info.usable:
            what = "A draft checkpoint" if info.kind == F.KIND_DRAFT else "A target model"
            self.title_label.setText(f"<b>✓ {what}, ready to export to OpenVINO</b>")
            for label, value in info.rows():
                v = QLabel(value)
                v.setWordWrap(True)
                self.facts.addRow(label, v)
        elif info.already_exported:
            self.title_label.setText(f"<b>{_esc(info.title)}</b>")
            self.reason_label.setText(info.reason)
            self._style(self.reason_label, "info")
        else:
            self.title_label.setText("<b style='color:#b42318'>✗ Nothing this app can import</b>")
            self.reason_label.setText(info.reason)
            self._style(self.reason_label, "error")
        notes = list(info.notes) if info else []
        self.notes_label.setText("\n".join("• " + n for n in notes))
        self.notes_label.setVisible(bool(notes))
        self.reason_label.setVisible(bool(self.reason_label.text()))

        is_draft = info is not None and info.model_kind == "draft"
        self.fit_box.setVisible(is_draft)
        if is_draft:
            self._show_fit()
        self.export_box.setVisible(info is not None and info.usable)
        if info is not None and info.usable:
            self._fill_formats(info)
            self._suggest_dest()
        self._update_buttons()

    def _show_fit(self) -> None:
        info = self.info
        assert info is not None
        target = self.target_dir
        self.fit_target_label.setText(f"Checked against the target <b>{_esc(Path(target).name)}</b> "
                                      f"<span style='color:gray'>({_esc(target)})</span>"
                                      if target else "No target chosen to check the draft against.")
        self.fit_notes.clear()
        self.fit_notes.setVisible(False)
        self.fit_target_label.setToolTip(target or "")
        if not target:
            self.fit_label.setText("The draft is checked when you choose it with a target, or pick one here.")
            self._style(self.fit_label, "info")
            self.anyway_check.setVisible(False)
            return
        if info.kind == F.KIND_DRAFT:
            self.check = F.check_hf_draft(info, target)
            reasons, notes, checked = self.check.reasons, self.check.notes, self.check.checked
        else:  # already exported: the engine's own check
            reasons, notes, checked = _engine_fit(target, str(info.path)), [], True
        lines = []
        if reasons:
            lines.append("✗ This draft does not fit the target:")
            lines += ["• " + r for r in reasons]
            state = "error"
        elif checked:
            lines.append("✓ It fits: vocabulary, hidden size and tapped layers match the target.")
            state = "ok"
        else:
            state = "info"
        self.fit_label.setText("\n".join(lines))
        self.fit_label.setVisible(bool(lines))
        self._style(self.fit_label, state)
        self.fit_notes.setText("\n".join("• " + n for n in notes))
        self.fit_notes.setVisible(bool(notes))
        self.anyway_check.setVisible(bool(reasons) and info.kind == F.KIND_DRAFT)
        if not reasons:
            self.anyway_check.setChecked(False)

    def _fill_formats(self, info: F.FolderInfo) -> None:
        allowed = F.DRAFT_WEIGHT_FORMATS if info.kind == F.KIND_DRAFT else F.TARGET_WEIGHT_FORMATS
        model = self.format_combo.model()
        self.format_combo.blockSignals(True)
        for i in range(self.format_combo.count()):
            fmt = self.format_combo.itemData(i)
            ok = fmt in allowed
            if isinstance(model, QStandardItemModel) and model.item(i) is not None:
                model.item(i).setEnabled(ok)
            self.format_combo.setItemData(i, FORMAT_HINTS[fmt] if ok else
                                          f"This exporter writes {', '.join(allowed)}.",
                                          Qt.ItemDataRole.ToolTipRole)
        default = F.DEFAULT_WEIGHT_FORMAT[info.kind]
        if self.format_combo.currentData() not in allowed or self._formats_for != info.path:
            self.format_combo.setCurrentIndex(self.format_combo.findData(default))
        self._formats_for = info.path
        self.format_combo.blockSignals(False)
        self._format_changed()

    def weight_format(self) -> str:
        return self.format_combo.currentData()

    def set_weight_format(self, fmt: str) -> None:
        self.format_combo.setCurrentIndex(self.format_combo.findData(fmt))

    def _format_changed(self, *_: object) -> None:
        fmt = self.weight_format()
        default = self.info is not None and self.info.usable and fmt == F.DEFAULT_WEIGHT_FORMAT.get(self.info.kind)
        self.format_hint.setText(FORMAT_HINTS.get(fmt, "") + (" (default)" if default else ""))
        if not self._dest_edited:
            self._suggest_dest()
        self._update_buttons()

    # -- destination -----------------------------------------------------------------------------
    def _suggest_dest(self) -> None:
        if self.info is None or not self.info.usable or self._dest_edited:
            return
        dest = F.suggest_destination(self.info, self.weight_format(), self.models_root, self.drafts_root)
        self.dest_edit.setText(str(dest))
        self._update_buttons()

    def _dest_typed(self, _text: str) -> None:
        self._dest_edited = True
        self._update_buttons()

    def set_destination(self, path: str) -> None:
        self._dest_edited = True
        self.dest_edit.setText(str(path))
        self._update_buttons()

    def _browse_dest(self) -> None:
        start = str(Path(self.dest_edit.text()).parent) if self.dest_edit.text() else str(self.models_root)
        d = QFileDialog.getExistingDirectory(self, "Folder to put the exported model in", start)
        if d:
            name = Path(self.dest_edit.text()).name or F.source_name(self.info.path if self.info else Path("model"))
            self.set_destination(str(Path(d) / name))

    def destination(self) -> Path:
        return Path(self.dest_edit.text().strip()).expanduser()

    # -- buttons and state -----------------------------------------------------------------------
    def blocking_problems(self) -> list[str]:
        """Why Export is disabled now (empty: it may start)."""
        info = self.info
        if info is None:
            return ["Choose a folder."]
        if info.already_exported:
            return []
        if not info.usable:
            return [info.reason]
        out = []
        if self.export_unavailable:
            out.append(self.export_unavailable)
        if self.check is not None and self.check.reasons and not self.anyway_check.isChecked():
            out.append("The draft does not fit the target (see above).")
        problem = F.destination_problem(self.destination(), info.path) if self.dest_edit.text().strip() else \
            "Choose a destination folder."
        if problem:
            out.append(problem)
        return out

    def _update_buttons(self) -> None:
        running = self.state in (STATE_RUNNING, STATE_CANCELLING)
        for w in (self.folder_edit, self.browse_button, self.format_combo, self.dest_edit, self.dest_button,
                  self.fit_target_button, self.anyway_check):
            w.setEnabled(not running)
        info = self.info
        if self.state == STATE_DONE:
            self.dest_problem.setVisible(False)
        elif info is not None and info.usable and not running:
            problem = F.destination_problem(self.destination(), info.path) if self.dest_edit.text().strip() else ""
            note = F.free_space_note(self.destination(), info.weights_bytes) if not problem else None
            self.dest_problem.setText(problem or note or "")
            self._style(self.dest_problem, "error" if problem else "warn")
            self.dest_problem.setVisible(bool(problem or note))
        problems = self.blocking_problems()
        exported = info is not None and info.already_exported
        self.export_button.setText("Add to the list" if exported else "Export and add")
        self.export_button.setVisible(self.state not in (STATE_DONE,))
        self.export_button.setEnabled(not running and not problems and self.state != STATE_DONE)
        self.export_button.setToolTip("\n".join(problems))
        self.cancel_button.setText("Cancel export" if running else "Close")
        self.cancel_button.setEnabled(self.state != STATE_CANCELLING)
        if self.state == STATE_IDLE:
            if info is not None and info.usable and self.export_unavailable:
                self._status(self.export_unavailable, "error")
            self.progress.setVisible(False)

    def _set_state(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        if state == STATE_IDLE:
            self.status_label.clear()
            self.log.clear()
        self._update_buttons()
        self.state_changed.emit(state)

    def _status(self, text: str, state: str) -> None:
        self.status_label.setText(text)
        self._style(self.status_label, state)
        self.status_label.setVisible(bool(text))

    @staticmethod
    def _style(label: QLabel, state: str) -> None:
        colors = {"error": "#b42318", "ok": "#067647", "warn": "#93370d", "info": "#475467"}  # as resources/style.qss
        label.setProperty("state", state)
        label.setStyleSheet(f"color: {colors.get(state, '#475467')};")

    # -- export ----------------------------------------------------------------------------------
    def start_export(self) -> None:
        """Export (or, for an OpenVINO folder, just validate and add) the chosen folder."""
        if self.state in (STATE_RUNNING, STATE_CANCELLING) or self.blocking_problems():
            return
        info = self.info
        assert info is not None
        if info.already_exported:
            self._validate_and_finish(info.path, info.model_kind or "target", created=False)
            return
        kind = "draft" if info.kind == F.KIND_DRAFT else "target"
        self.dest = self.destination()
        self.result_path = None
        self.error = ""
        self._steps = DRAFT_STEPS if kind == "draft" else TARGET_STEPS
        self._step = -1
        self.log.clear()
        self._tail = ""
        program, args = export_command(kind, info.path, self.dest, self.weight_format())
        self.log.write(f"$ {program} {' '.join(_quote(a) for a in args)}\n")
        self.progress.setRange(0, len(self._steps))
        self.progress.setVisible(True)
        self._advance(0)
        self._started = time.monotonic()
        self._set_state(STATE_RUNNING)
        self.ticker.start()
        self.proc.start(program, args)

    def _advance(self, step: int) -> None:
        if step <= self._step:
            return
        self._step = min(step, len(self._steps) - 1)
        label = self._steps[self._step][1]
        self.progress.setValue(self._step)
        self.progress.setFormat(f"Step {self._step + 1} of {len(self._steps)}: {label}")
        self._tick()

    def _tick(self) -> None:
        if self.state != STATE_RUNNING:
            return
        if self.dest is not None and self._steps is DRAFT_STEPS and F.leftovers(self.dest):
            self._advance(1)
        if self._steps is TARGET_STEPS and self._step == 0 and self.dest is not None and F.leftovers(self.dest):
            self._advance(1)
        label = self._steps[self._step][1] if self._steps else ""
        self._status(f"Exporting to {self.dest}: {label}… {time.monotonic() - self._started:.0f} s", "info")

    def _read(self) -> None:
        data = bytes(self.proc.readAllStandardOutput()).decode("utf-8", errors="replace")
        if not data:
            return
        self.log.write(data)
        self._tail = (self._tail + data)[-4000:]
        for i, (marker, _label) in enumerate(self._steps):
            if marker and marker in data:
                self._advance(i)

    def _error(self, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart:
            self.log.write(f"\nCould not start {self.proc.program()}: {self.proc.errorString()}\n")
            self._fail(f"The export could not start: {self.proc.errorString()}")

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._read()
        self.ticker.stop()
        if self.state == STATE_CANCELLING:
            self._cleanup_after_stop()
            self._set_state(STATE_CANCELLED)
            self._status("Export cancelled. Nothing was written and nothing was added to the lists.", "warn")
            self.progress.setVisible(False)
            return
        if self.state != STATE_RUNNING:
            return
        if status != QProcess.ExitStatus.NormalExit or code != 0:
            said = [ln.split("dflash-studio: ", 1)[1] for ln in self._tail.splitlines() if "dflash-studio: " in ln]
            why = said[-1] if said else ("the exporter crashed" if status != QProcess.ExitStatus.NormalExit
                                         else f"exit code {code}; the log says why")
            self._fail(f"The export failed: {why}")
            return
        self._advance(len(self._steps) - 1)
        assert self.dest is not None and self.info is not None
        self._validate_and_finish(self.dest, "draft" if self.info.kind == F.KIND_DRAFT else "target", created=True)

    def _validate_and_finish(self, folder: Path, kind: str, created: bool) -> None:
        """Read the folder back with the engine's readers; only a folder that passes reaches the lists."""
        reasons: list[str] = []
        try:
            if kind == "target":
                from engine.models.target import check_target_dir

                check_target_dir(folder)
            else:
                from engine.models.draft import read_draft_info

                read_draft_info(folder)
                if self.target_dir:
                    reasons = _engine_fit(self.target_dir, str(folder))
        except Exception as exc:  # noqa: BLE001 - any unreadable result is a failed import
            if created:
                self._fail(f"The exported folder does not read back as a {kind}: {exc}")
            else:
                self._status(f"This folder cannot be added as a {kind}: {exc}", "error")
            return
        self.result_path, self.result_kind, self.result_reasons = folder, kind, reasons
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.progress.setFormat("Done")
        self.progress.setVisible(created)
        where = "draft" if kind == "draft" else "target"
        took = f" (exported in {time.monotonic() - self._started:.0f} s)" if created else ""
        text = f"✓ {folder} is ready{took} and now in the {where} list."
        if reasons:
            text += ("\nIt does not fit the current target, so it is listed marked ✗:\n"
                     + "\n".join("• " + r for r in reasons))
        self._set_state(STATE_DONE)
        self._status(text, "warn" if reasons else "ok")
        self.imported.emit(str(folder), kind)

    def _fail(self, message: str) -> None:
        self.ticker.stop()
        if self.proc.state() != QProcess.ProcessState.NotRunning:
            self.proc.kill()
            self.proc.waitForFinished(5000)
        self._cleanup_after_stop()
        self.error = message
        self.progress.setVisible(False)
        self._set_state(STATE_FAILED)
        self._status(message + "\nNothing was written and nothing was added to the lists.", "error")

    def _cleanup_after_stop(self) -> None:
        """Remove what an export that did not finish left: temp siblings, and the destination (it did not
        exist when the export started, so whatever is there now is this export's)."""
        if self.dest is not None:
            removed = F.remove_export_leftovers(self.dest, remove_dest=True)
            for p in removed:
                self.log.write(f"Removed {p}\n")

    def cancel_export(self) -> None:
        """Kill the export and remove what it wrote; returns once the process has ended."""
        if self.state != STATE_RUNNING:
            return
        self._set_state(STATE_CANCELLING)
        self.log.write("\nCancelling: stopping the export…\n")
        self.proc.kill()
        if not self.proc.waitForFinished(10000):  # finished() -> _finished() does the cleanup
            self._cleanup_after_stop()
            self._set_state(STATE_CANCELLED)
        self.ticker.stop()

    def is_running(self) -> bool:
        return self.proc.state() != QProcess.ProcessState.NotRunning

    def _cancel_clicked(self) -> None:
        if self.state == STATE_RUNNING:
            self.cancel_export()
        else:
            self.reject()

    def reject(self) -> None:
        self.cancel_export()
        super().reject()

    def closeEvent(self, e) -> None:  # noqa: N802
        self.cancel_export()
        super().closeEvent(e)


def _engine_fit(target_dir: str, draft_dir: str) -> list[str]:
    from app.models.validation import engine_draft_reasons

    return engine_draft_reasons(target_dir, draft_dir)


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _quote(arg: str) -> str:
    return f"'{arg}'" if (" " in arg or not arg) else arg
