"""pytest-qt fixtures for the app: offscreen Qt, a private user data folder, fake engines, leak checks."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

import time
from pathlib import Path
from typing import Callable

import pytest

from app import settings as S
from app.fake_engine import fake_loader
from app.qt_tracking import active_timers, running_threads
from engine.devices import DeviceInfo, list_devices


class FakeCore:
    """Stands in for openvino.Core: available_devices and get_property(device, key)."""

    def __init__(self, devices: dict[str, dict[str, str]]) -> None:
        self._devices = devices

    @property
    def available_devices(self) -> list[str]:
        return list(self._devices)

    def get_property(self, device: str, key: str):
        props = self._devices[device]
        if key not in props:
            raise RuntimeError(f"{device} does not support {key}")
        return props[key]


@pytest.fixture
def fake_core() -> FakeCore:
    return FakeCore({
        "CPU": {"FULL_DEVICE_NAME": "Intel(R) Core(TM) Ultra 7 155H"},
        "GPU.0": {"FULL_DEVICE_NAME": "Intel(R) Arc(TM) Graphics (iGPU)", "DEVICE_TYPE": "Type.INTEGRATED"},
        "GPU.1": {"FULL_DEVICE_NAME": "Intel(R) Arc(TM) A770 Graphics (dGPU)", "DEVICE_TYPE": "Type.DISCRETE"},
        "NPU": {"FULL_DEVICE_NAME": "Intel(R) AI Boost"},
    })


@pytest.fixture
def fake_devices(fake_core) -> list[DeviceInfo]:
    return list_devices(fake_core)


@pytest.fixture(autouse=True)
def app_home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own user data folder (history, models, settings)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def no_qt_leaks(qapp):
    """No QThread still running and no QTimer still active once a test (and its windows) ended."""
    yield
    deadline = time.monotonic() + 5.0
    while running_threads() and time.monotonic() < deadline:
        qapp.processEvents()
        time.sleep(0.01)
    threads = running_threads()
    timers = active_timers()
    assert not threads, f"QThreads left running: {[t.objectName() for t in threads]}"
    assert not timers, f"QTimers left active: {[(t.parent(), t.interval()) for t in timers]}"


@pytest.fixture
def settings(app_home):
    s = S.open_settings(app_home / "settings.ini")
    yield s
    s.sync()


@pytest.fixture
def model_dirs(tmp_path) -> tuple[Path, Path]:
    target = tmp_path / "models" / "tiny-target"
    draft = tmp_path / "models" / "tiny-draft"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    return target, draft


def fits(_target: str, _draft: str) -> list[str]:
    return []


@pytest.fixture
def make_window(qtbot, settings, fake_devices, model_dirs):
    """Build MainWindows over a fake engine; they are closed (and checked for leaks) afterwards."""
    from app.main_window import MainWindow

    made: list[MainWindow] = []

    def make(loader_options: dict | None = None, *, load: bool = True, draft: bool = True,
             validator: Callable[[str, str], list[str]] = fits, loader=None, **kw) -> MainWindow:
        opts = {"tokens_per_second": 0.0}
        opts.update(loader_options or {})
        w = MainWindow(settings=settings, loader=loader or fake_loader(**opts), devices=fake_devices,
                       draft_validator=validator, autoload=False, **kw)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        if load:
            target, d = model_dirs
            w.model_panel.set_target(str(target))
            w.model_panel.set_draft(str(d) if draft else None)
            w.model_panel.set_device("CPU")
            with qtbot.waitSignal(w.controller.loaded, timeout=5000):
                w.model_panel.load_button.click()
        return w

    yield make
    for w in made:
        w.close()
    for w in made:
        assert not w.controller.thread.isRunning(), "closing the window must stop the engine thread"
