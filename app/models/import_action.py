"""File → "Import Hugging Face folder…": opens the import dialog and puts what it made in the model lists.

`install_import_action(main_window)` adds the action to the window's File menu (before "Prepare the
default model…") and returns it. An imported target becomes the current target and a recent one;
an imported draft the current draft and a recent one (the panel marks it ✓ / ✗ against the target
with the engine's reasons, as for any draft). Closing the window while an export runs cancels it
(the dialog removes what the export wrote).
"""
from __future__ import annotations

import shiboken6
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMainWindow, QMenu

from app import settings as S
from app.models.import_dialog import ImportDialog

ACTION_TEXT = "&Import Hugging Face folder…"


def add_imported_model(panel, settings, path: str, kind: str) -> None:
    """Hand a new OpenVINO folder to the pickers (their public setters) and remember it as recent."""
    if kind == "target":
        S.push_recent(settings, S.K_RECENT_TARGETS, path)
        panel.refresh_targets()
        panel.set_target(path)
    else:
        S.push_recent(settings, S.K_RECENT_DRAFTS, path)
        panel.set_draft(path)


class _CancelOnClose(QObject):
    """Cancels a running export when the main window closes (the export must not outlive it)."""

    def __init__(self, window: QMainWindow) -> None:
        super().__init__(window)
        self.window = window

    def eventFilter(self, obj, event) -> bool:  # noqa: N802
        if obj is self.window and event.type() == QEvent.Type.Close:
            dlg = getattr(self.window, "_import_dialog", None)
            if dlg is not None and shiboken6.isValid(dlg):
                dlg.cancel_export()
        return False


def open_import_dialog(window: QMainWindow, folder: str | None = None) -> ImportDialog:
    """Show the import dialog (one at a time), checking drafts against the window's current target."""
    dlg = getattr(window, "_import_dialog", None)
    if dlg is not None and shiboken6.isValid(dlg):
        dlg.raise_()
        dlg.activateWindow()
        return dlg
    panel = window.model_panel
    dlg = ImportDialog(window, target_dir=panel.target_dir() or None, settings=window.settings, folder=folder)
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.imported.connect(lambda path, kind: add_imported_model(panel, window.settings, path, kind))
    dlg.finished.connect(lambda _r: setattr(window, "_import_dialog", None))
    window._import_dialog = dlg
    dlg.open()
    return dlg


def _file_menu(window: QMainWindow) -> QMenu:
    for a in window.menuBar().actions():
        if a.menu() is not None and a.text().replace("&", "") == "File":
            return a.menu()
    return window.menuBar().addMenu("&File")


def install_import_action(window: QMainWindow) -> QAction:
    """Add File → Import Hugging Face folder… to `window` (a MainWindow) and return the action."""
    act = QAction(ACTION_TEXT, window)
    act.setObjectName("actImportHF")
    act.setStatusTip("Convert a Hugging Face checkpoint (target or DFlash / DSpark draft) to OpenVINO and add it")
    menu = _file_menu(window)
    before = getattr(window, "act_prepare", None)
    if before is not None and before in menu.actions():
        menu.insertAction(before, act)
    else:
        menu.addAction(act)
    act.triggered.connect(lambda: open_import_dialog(window))
    window.act_import_hf = act
    window._import_dialog = None
    window.installEventFilter(_CancelOnClose(window))
    return act
