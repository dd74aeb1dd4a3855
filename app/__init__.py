"""DFlash Studio desktop front end (PySide6 + pyqtgraph).

The app renders engine events and sends user intent to the engine; it holds no model math.
Everything that talks to OpenVINO lives in `engine/` and runs on one worker thread.
"""
