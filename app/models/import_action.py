"""File → "Import Hugging Face folder…": opens the import dialog and puts what it made in the model lists.

`install_import_action(main_window)` adds the action to the window's File menu (before "Prepare the
default model…") and returns it. An imported target becomes the current target and a recent one;
an imported draft the current draft and a recent one (the panel marks it ✓ / ✗ against the target
with the engine's reasons, as for any draft). Closing the window while an export runs cancels it
(the dialog removes what the export wrote).
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMainWindow

from app import settings as S
from app.models.child_process import add_file_action, show_one
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


def open_import_dialog(window: QMainWindow, folder: str | None = None) -> ImportDialog:
    """Show the import dialog (one at a time), checking drafts against the window's current target."""
    def make() -> ImportDialog:
        panel = window.model_panel
        dlg = ImportDialog(window, target_dir=panel.target_dir() or None, settings=window.settings, folder=folder)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.imported.connect(lambda path, kind: add_imported_model(panel, window.settings, path, kind))
        return dlg

    return show_one(window, "_import_dialog", make)[0]


def install_import_action(window: QMainWindow) -> QAction:
    """Add File → Import Hugging Face folder… to `window` (a MainWindow) and return the action."""
    act = add_file_action(window, ACTION_TEXT, "actImportHF",
                          "Convert a Hugging Face checkpoint (target or DFlash / DSpark draft) to OpenVINO and add it",
                          lambda: open_import_dialog(window), before=getattr(window, "act_prepare", None),
                          dialog=("_import_dialog", "cancel_export"))
    window.act_import_hf = act
    return act
