"""DFlash Studio desktop front end (PySide6 + pyqtgraph).

The app renders engine events and sends user intent to the engine; it holds no model math.
Everything that talks to OpenVINO lives in `engine/` and runs on one worker thread.
"""
from app import _pyside_compat

_pyside_compat.apply()  # before any Qt call: see the module's note (PySide6 6.12 on Python 3.11)
