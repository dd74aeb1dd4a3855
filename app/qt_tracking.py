"""QTimer and QThread subclasses that register themselves, so tests can prove none is left running.

Every timer and thread the app creates goes through these classes; tests/app/conftest.py checks
after each test that no tracked thread is still running and no tracked timer is still active
(the same idea as napari's dangling-QThread / QTimer fixtures).
"""
from __future__ import annotations

import weakref

import shiboken6
from PySide6.QtCore import QThread, QTimer

_timers: "weakref.WeakSet[TrackedTimer]" = weakref.WeakSet()
_threads: "weakref.WeakSet[TrackedThread]" = weakref.WeakSet()


class TrackedTimer(QTimer):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        _timers.add(self)


class TrackedThread(QThread):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        _threads.add(self)


def active_timers() -> list[QTimer]:
    out = []
    for t in list(_timers):
        if shiboken6.isValid(t) and t.isActive():
            out.append(t)
    return out


def running_threads() -> list[QThread]:
    out = []
    for t in list(_threads):
        if shiboken6.isValid(t) and t.isRunning():
            out.append(t)
    return out
