"""The Server panel: start/stop the local OpenAI-compatible server, its address and key, the URL to
paste into a client, and a live list of the client requests with their tokens per step and acceptance.

The server shares the app's engine worker (app/server/worker_loop.py), so a chat and a client
request stream side by side. The panel only shows what engine/serve reports (Bridge.rows()).
"""
from __future__ import annotations

import secrets

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QFormLayout, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QSpinBox,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app import settings as S
from app.qt_tracking import TrackedTimer
from app.worker import EngineController
from engine.errors import DFlashError
from engine.serve import DEFAULT_MAX_QUEUE

REFRESH_MS = 250
STOP_GRACE_S = 5.0  # Stop: running requests get this long to finish
# request, chat|text, state, prompt tokens, generated tokens, target steps, tokens per step, acceptance, seconds
COLUMNS = ("Request", "Kind", "State", "Prompt", "Tokens", "Steps", "Tok/step", "Accept", "s")


class ServerPanel(QWidget):
    started = Signal(str)  # the URL
    stopped = Signal()

    def __init__(self, controller: EngineController, settings: QSettings, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("serverPanel")
        self.controller = controller
        self.settings = settings
        self.bridge = None  # engine.serve.bridge.Bridge while running (engine/serve loads on first start)
        self.http = None  # engine.serve.server.UvicornServer
        self.loop = None  # app.server.worker_loop.WorkerLoop

        form = QFormLayout()
        self.host = QLineEdit(S.get_str(settings, S.K_SERVER_HOST, "127.0.0.1"))
        self.host.setObjectName("serverHost")
        self.host.setToolTip("127.0.0.1: this machine only. Any other address needs an API key.")
        self.port = QSpinBox()
        self.port.setObjectName("serverPort")
        self.port.setRange(1, 65535)
        self.port.setValue(S.get_int(settings, S.K_SERVER_PORT, 8000))
        key_row = QHBoxLayout()
        self.api_key = QLineEdit(S.get_str(settings, S.K_SERVER_API_KEY, ""))
        self.api_key.setObjectName("serverApiKey")
        self.api_key.setPlaceholderText("none (loopback only)")
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.new_key = QPushButton("New key")
        self.new_key.setToolTip("Fill in a random key; clients send it as 'Authorization: Bearer KEY'")
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(self.new_key)
        self.max_queue = QSpinBox()
        self.max_queue.setObjectName("serverMaxQueue")
        self.max_queue.setRange(0, 10000)
        self.max_queue.setValue(S.get_int(settings, S.K_SERVER_MAX_QUEUE, DEFAULT_MAX_QUEUE))
        self.max_queue.setToolTip("Requests that may wait behind the running ones; more are answered 429 at once")
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        form.addRow("Queue", self.max_queue)

        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start server")
        self.start_button.setObjectName("serverStart")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("serverStop")
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)

        url_row = QHBoxLayout()
        self.url = QLineEdit()
        self.url.setObjectName("serverUrl")
        self.url.setReadOnly(True)
        self.url.setPlaceholderText("not running")
        self.copy_button = QPushButton("Copy")
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.copy_button)
        self.status = QLabel("Stopped.")
        self.status.setObjectName("serverStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("serverRequests")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        for j, tip in enumerate(("request id", "chat or text completion", "running, or how it ended",
                                 "prompt tokens", "generated tokens", "target steps", "tokens per target step",
                                 "draft tokens accepted / validated", "seconds since it arrived")):
            self.table.horizontalHeaderItem(j).setToolTip(tip)

        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        v.addLayout(form)
        v.addLayout(buttons)
        v.addWidget(QLabel("Base URL for OpenAI clients:"))
        v.addLayout(url_row)
        v.addWidget(self.status)
        v.addWidget(self.table, 1)

        self._timer = TrackedTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        self.start_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url.text()))
        self.new_key.clicked.connect(lambda: self.api_key.setText(secrets.token_urlsafe(24)))
        controller.loaded.connect(lambda _info: self._show_running())
        for edit in (self.host, self.api_key):
            edit.editingFinished.connect(self._save)
        for spin in (self.port, self.max_queue):
            spin.valueChanged.connect(lambda _v: self._save())
        self._update()

    @property
    def running(self) -> bool:
        return self.http is not None

    def start(self) -> bool:
        """Start on the host/port/key in the fields; a refusal (no key beyond loopback, busy port) is shown."""
        if self.running:
            return True
        from app.server.worker_loop import WorkerLoop
        from engine.serve.bridge import Bridge
        from engine.serve.server import http_server, url_for

        host, key = self.host.text().strip() or "127.0.0.1", self.api_key.text().strip() or None
        self._save()
        loop = WorkerLoop(self.controller)
        bridge = Bridge(loop, max_queue=self.max_queue.value())
        try:
            http = http_server(bridge, host, self.port.value(), key, graceful_s=STOP_GRACE_S)
        except DFlashError as exc:
            self.status.setText(f"Not started: {exc}")
            self._update()
            return False
        self.controller.set_step_observer(bridge.observe_step)
        http.start()
        self.loop, self.bridge, self.http = loop, bridge, http
        self.url.setText(url_for(host, http.port))
        self._show_running()
        self._timer.start()
        self._update()
        self.started.emit(self.url.text())
        return True

    def stop(self) -> None:
        """Refuse new requests, let running ones finish (a few seconds), then cancel what is left."""
        if not self.running:
            return
        self.bridge.close()
        self.http.stop(STOP_GRACE_S + 5)
        self.loop.cancel_all()
        self.controller.set_step_observer(None)
        self._timer.stop()
        self.refresh()
        self.http = None
        self.url.clear()
        self.status.setText("Stopped.")
        self._update()
        self.stopped.emit()

    def refresh(self) -> None:
        """The request list from the bridge (live ones first, then the recent finished ones)."""
        if self.bridge is None:
            return
        rows = self.bridge.rows()
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cells = (r.id.split("-", 1)[-1][:6], "chat" if r.kind == "chat" else "text", r.finish_reason if r.state == "done" else r.state,
                     str(r.prompt_tokens), str(r.completion_tokens), str(r.steps),
                     f"{r.tokens_per_step:.2f}" if r.steps else "–", f"{r.acceptance:.0%}" if r.drafted else "–",
                     f"{r.seconds:.1f}")
            for j, text in enumerate(cells):
                item = self.table.item(i, j)
                if item is None:
                    item = QTableWidgetItem()
                    self.table.setItem(i, j, item)
                item.setText(text)
        if self.running:
            self._show_running()

    def _show_running(self) -> None:
        if not self.running:
            return
        model = self.bridge.model()
        name = f"model \"{model.id}\"" + (f" + draft {model.draft_name}" if model.draft_name else "") if model else \
            "no model loaded yet (requests get 503 until one is)"
        self.status.setText(f"Serving {name} · {self.bridge.running_count()} running, "
                            f"{self.bridge.waiting_count()} waiting")

    def _save(self) -> None:
        self.settings.setValue(S.K_SERVER_HOST, self.host.text().strip())
        self.settings.setValue(S.K_SERVER_PORT, self.port.value())
        self.settings.setValue(S.K_SERVER_API_KEY, self.api_key.text().strip())
        self.settings.setValue(S.K_SERVER_MAX_QUEUE, self.max_queue.value())

    def _update(self) -> None:
        on = self.running
        self.start_button.setEnabled(not on)
        self.stop_button.setEnabled(on)
        for w in (self.host, self.port, self.api_key, self.new_key, self.max_queue):
            w.setEnabled(not on)
