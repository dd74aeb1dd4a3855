"""The Server panel (pytest-qt) over the app's real engine worker: a chat and a client request run in the
same engine steps, the request list shows them, settings persist, and a model switch lets the running
request finish while new ones run on the new model."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before pytest-qt makes the QApplication

import json
import socket
import threading
import time

import httpx
import pytest

from app import settings as S
from app.server.panel import ServerPanel
from app.worker import EngineController, GenerateRequest, default_loader
from engine.config import GenerationConfig
from fixtures.tiny_drafts import TRAIN_PROMPTS


@pytest.fixture(scope="module")
def tiny_draft(tiny_qwen3_drafts):
    return tiny_qwen3_drafts["b8_trained"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def app_parts(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path / "home"))
    shared_steps: list[int] = []
    both_in = threading.Event()  # the engine holds its first request until the second one is in (<= 30 s)

    def loader(target, draft=None, device="CPU", **kw):
        pipe = default_loader(target, draft, device=device, precision="f32")
        step = pipe.step
        deadline: list[float] = []

        def counted_step():
            if not both_in.is_set():
                deadline[:] = deadline or [time.monotonic() + 30]
                if len(pipe._running) + len(pipe._waiting) >= 2 or time.monotonic() > deadline[0]:
                    both_in.set()
                else:
                    time.sleep(0.002)
                    return []  # the worker takes queued requests before its next step
            events = step()
            shared_steps.append(len(pipe.last_step.requests))
            return events

        pipe.step = counted_step
        return pipe

    settings = S.open_settings(tmp_path / "settings.ini")
    controller = EngineController(loader)
    panel = ServerPanel(controller, settings)
    qtbot.addWidget(panel)
    yield controller, panel, settings, shared_steps
    panel.stop()
    controller.shutdown()


def _stream(url: str, body: dict, out: dict) -> None:
    lines = []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
    out["lines"] = lines


def test_server_panel_serves_beside_a_chat(qtbot, app_parts, tiny_qwen3_target, tiny_draft):
    controller, panel, settings, shared_steps = app_parts
    with qtbot.waitSignal(controller.loaded, timeout=120000):
        controller.load(str(tiny_qwen3_target), str(tiny_draft), "CPU")
    assert not panel.start_button.isEnabled() or not panel.running
    panel.host.setText("0.0.0.0")
    assert not panel.start()  # beyond loopback without a key
    assert "without an API key" in panel.status.text()
    panel.host.setText("127.0.0.1")
    panel.port.setValue(_free_port())
    panel.start_button.click()
    assert panel.running and panel.url.text() == f"http://127.0.0.1:{panel.port.value()}/v1"
    assert tiny_qwen3_target.name in panel.status.text()
    url = panel.url.text()
    model = httpx.get(f"{url}/models").json()["data"][0]
    assert model["id"] == tiny_qwen3_target.name and model["draft"] == tiny_draft.name

    client: dict = {}
    body = {"model": model["id"], "prompt": TRAIN_PROMPTS[0], "max_tokens": 48, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    t = threading.Thread(target=_stream, args=(url, body, client))
    chat_done: list = []
    controller.finished.connect(lambda tag, fin: chat_done.append(fin))
    t.start()
    controller.generate(GenerateRequest("chat-1", [{"role": "user", "content": TRAIN_PROMPTS[1]}],
                                        GenerationConfig(max_new_tokens=48, ignore_eos=True)))
    qtbot.waitUntil(lambda: bool(chat_done) and not t.is_alive(), timeout=120000)
    assert client["status"] == 200 and client["lines"][-1] == "[DONE]"
    usage = json.loads(client["lines"][-2])["usage"]
    assert usage["completion_tokens"] == 48 and chat_done[0].stats["tokens"] == 48
    assert max(shared_steps) >= 2  # the chat and the client request shared engine steps
    panel.refresh()
    cols = {panel.table.horizontalHeaderItem(j).text(): j for j in range(panel.table.columnCount())}
    row = [panel.table.item(0, j).text() for j in range(panel.table.columnCount())]
    assert row[cols["Tokens"]] == "48" and row[cols["State"]] == "length"
    assert float(row[cols["Tok/step"]]) > 1.0 and row[cols["Accept"]].endswith("%")

    # a model switch: the running request finishes on the old model, the next one runs on the new one
    running: dict = {}
    body2 = dict(body, max_tokens=64)
    t2 = threading.Thread(target=_stream, args=(url, body2, running))
    t2.start()
    qtbot.waitUntil(lambda: any(r.state == "running" for r in panel.bridge.rows()), timeout=60000)
    with qtbot.waitSignal(controller.loaded, timeout=120000):
        controller.load(str(tiny_qwen3_target), None, "CPU")
    t2.join(120)
    assert running["lines"][-1] == "[DONE]"
    assert json.loads(running["lines"][-2])["usage"]["completion_tokens"] == 64
    after = httpx.get(f"{url}/models").json()["data"][0]
    assert after["draft"] is None
    r = httpx.post(f"{url}/completions", json={"model": after["id"], "prompt": "x", "max_tokens": 4, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200 and r.json()["speculative"]["draft"] is None

    # settings persist
    panel.stop()
    assert not panel.running and panel.start_button.isEnabled()
    panel.api_key.setText("k1")
    panel.api_key.editingFinished.emit()
    again = ServerPanel(controller, settings)
    qtbot.addWidget(again)
    assert (again.host.text(), again.port.value(), again.api_key.text()) == ("127.0.0.1", panel.port.value(), "k1")
