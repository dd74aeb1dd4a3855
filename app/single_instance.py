"""One window per data folder: a lock on the chat history, and a local socket to bring it forward.

Two windows over one history folder overwrite each other's conversations (each saves its own copy).
The first window holds a QLockFile (`<data folder>/gui.lock`; a lock whose process died is stale and
taken over) and listens on a QLocalServer named after the folder. A second launch connects and asks
it to come forward, then exits; when the owner does not answer (hung, or another user's session),
the second opens read-only and says so. The lock guards the chat history only: `generate`, `bench`
and `serve` never take it.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger("dflash.instance")
LOCK_NAME = "gui.lock"
RAISE = b"raise\n"
ACK = b"ok\n"


def server_name(data_dir: Path) -> str:
    """A socket name per data folder (and user: QLocalServer names live in the user's runtime dir on Unix)."""
    digest = hashlib.sha1(str(Path(data_dir).resolve()).encode("utf-8")).hexdigest()[:16]
    return f"dflash-studio-{digest}"


class InstanceGuard(QObject):
    """acquire() -> True for the first window of a data folder; then `activate` fires when another
    launch asks it to come forward."""

    activate = Signal()

    def __init__(self, data_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.data_dir = Path(data_dir)
        self.lock_path = self.data_dir / LOCK_NAME
        self._lock = QLockFile(str(self.lock_path))
        self._lock.setStaleLockTime(0)  # stale only when its process is gone, never by age
        self._server: QLocalServer | None = None
        self.name = server_name(self.data_dir)
        self.owner = False

    def acquire(self) -> bool:
        """Take the lock (and listen for later launches). False when another window holds it."""
        if not self._lock.tryLock(200):
            log.info("data folder %s is locked (%s) by %s", self.data_dir, self._lock.error().name, self.holder())
            return False
        self.owner = True
        QLocalServer.removeServer(self.name)  # a socket left by a window that was killed
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if server.listen(self.name):
            server.newConnection.connect(self._on_connection)
            self._server = server
        else:  # the lock still guards the history; only "bring it forward" is lost
            log.warning("could not listen on %s: %s", self.name, server.errorString())
        log.info("this window owns the data folder %s", self.data_dir)
        return True

    def holder(self) -> str:
        """Who holds the lock, in words (for the read-only notice)."""
        info = self._lock.getLockInfo()  # PySide6: (pid, hostname, appname), or a falsy value
        if info and len(info) == 3 and info[0]:
            return f"process {info[0]} on {info[1]}"
        return "another process"

    def bring_forward(self, timeout_ms: int = 1500) -> bool:
        """Ask the window that owns the folder to come forward. True when it answered."""
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        if not sock.waitForConnected(timeout_ms):
            log.info("the owning window did not answer on %s: %s", self.name, sock.errorString())
            return False
        sock.write(RAISE)
        sock.waitForBytesWritten(timeout_ms)
        answered = sock.waitForReadyRead(timeout_ms) and sock.readAll().data().startswith(ACK)
        sock.disconnectFromServer()
        return bool(answered)

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.owner:
            self._lock.unlock()
            self.owner = False

    def _on_connection(self) -> None:
        while self._server is not None and self._server.hasPendingConnections():
            sock = self._server.nextPendingConnection()
            sock.readyRead.connect(lambda s=sock: self._on_message(s))
            sock.disconnected.connect(sock.deleteLater)

    def _on_message(self, sock: QLocalSocket) -> None:
        if sock.readAll().data().startswith(RAISE):
            sock.write(ACK)
            sock.flush()
            log.info("another launch asked this window to come forward")
            self.activate.emit()
