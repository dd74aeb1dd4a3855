"""Work around PySide6 6.12's reference-count bug on Python < 3.12 (upstream PYSIDE-3474).

On this project's Python 3.11 with PySide6 6.12.0, measured here: every call of a Qt method that
returns nothing (QLabel.setText, QCheckBox.setChecked, QApplication.processEvents, ...) drops one
reference to None, and every Signal.emit drops one reference to True. After a few thousand calls
the count reaches zero and the interpreter aborts with "Fatal Python error: none_dealloc" (or
"bool_dealloc"), in minutes for a streaming chat window. Python 3.12 made these objects immortal,
which is why it is not affected there.

The workaround gives None, True and False a reference count so large (2**40) that the leak can
never bring it to zero, the same effect as 3.12's immortal objects. It changes nothing else and
runs only on an affected combination. Remove it when the project moves to Python 3.12 or to a
PySide6 release with the fix.
"""
from __future__ import annotations

import sys

_APPLIED = False
BOOST = 1 << 40


def affected(python: tuple[int, int] | None = None, pyside: str | None = None) -> bool:
    python = python or sys.version_info[:2]
    if python >= (3, 12):
        return False
    if pyside is None:
        try:
            import PySide6
        except ImportError:
            return False
        pyside = PySide6.__version__
    return pyside.startswith("6.12.")


def apply() -> bool:
    """Make None/True/False effectively immortal when the bug applies. True if it did (once)."""
    global _APPLIED
    if _APPLIED or not affected():
        return _APPLIED
    if hasattr(sys, "gettotalrefcount") or sys.implementation.name != "cpython":
        return False  # debug builds and other interpreters lay objects out differently
    import ctypes

    for obj in (None, True, False):
        ctypes.c_ssize_t.from_address(id(obj)).value += BOOST
    _APPLIED = True
    return True
