"""The app's log file: `<data folder>/logs/dflash-studio.log`, rotating, so a user can send what went wrong.

Python logging with a RotatingFileHandler (1 MB, 3 old files kept) on the "dflash" logger; Qt's own
warnings and uncaught Python exceptions go there too. Help → "Log file" shows the path and
"Open log folder" opens it.
"""
from __future__ import annotations

import logging
import logging.handlers
import platform
import sys
from pathlib import Path

from engine import paths

LOGGER = "dflash"
FILE_NAME = "dflash-studio.log"
MAX_BYTES = 1_000_000
BACKUPS = 3
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def log_dir(root: Path | None = None) -> Path:
    return (root or paths.user_data_dir()) / "logs"


def log_path(root: Path | None = None) -> Path:
    return log_dir(root) / FILE_NAME


def _handler() -> logging.handlers.RotatingFileHandler | None:
    for h in logging.getLogger(LOGGER).handlers:
        if isinstance(h, logging.handlers.RotatingFileHandler) and getattr(h, "_dflash", False):
            return h
    return None


def setup_logging(root: Path | None = None) -> Path | None:
    """Log to the data folder's log file (once per folder; a new folder, as in tests, replaces it).

    Returns the file's path, or None when it cannot be written (the app runs on without a log)."""
    path = log_path(root)
    logger = logging.getLogger(LOGGER)
    old = _handler()
    if old is not None:
        if Path(old.baseFilename) == path.resolve():
            return path
        logger.removeHandler(old)
        old.close()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        h = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS,
                                                 encoding="utf-8", delay=False)
    except OSError as e:
        print(f"DFlash Studio: cannot write the log file {path}: {e}", file=sys.stderr)
        return None
    h._dflash = True  # type: ignore[attr-defined]
    h.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    logger.info("log opened: DFlash Studio on Python %s, %s", platform.python_version(), platform.platform())
    return path


def install_hooks() -> None:
    """Uncaught exceptions and Qt's warnings go to the log as well as to stderr."""
    logger = logging.getLogger(LOGGER)
    previous = sys.excepthook

    def hook(kind, value, tb):  # noqa: ANN001 - sys.excepthook's signature
        logger.error("uncaught exception", exc_info=(kind, value, tb))
        previous(kind, value, tb)

    sys.excepthook = hook
    try:
        from PySide6.QtCore import QtMsgType, qInstallMessageHandler
    except ImportError:
        return
    qt_log = logging.getLogger(LOGGER + ".qt")
    levels = {QtMsgType.QtDebugMsg: logging.DEBUG, QtMsgType.QtInfoMsg: logging.INFO,
              QtMsgType.QtWarningMsg: logging.WARNING, QtMsgType.QtCriticalMsg: logging.ERROR,
              QtMsgType.QtFatalMsg: logging.CRITICAL}

    def qt_handler(mode, _context, message):  # noqa: ANN001 - Qt's signature
        level = levels.get(mode, logging.WARNING)
        if level >= logging.WARNING:
            qt_log.log(level, "%s", message)
            print(message, file=sys.stderr)

    qInstallMessageHandler(qt_handler)
