"""`python -m app` without a display; window geometry; the worker's threading and batching."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from app.__main__ import has_display
from app.fake_engine import fake_loader
from app.worker import EngineController, GenerateRequest
from engine.config import GenerationConfig

REPO = Path(__file__).resolve().parents[2]


def test_no_display_says_how_to_get_one_and_fails():
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    r = subprocess.run([sys.executable, "-m", "app"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "needs a display" in r.stderr and "xvfb-run -a python -m app" in r.stderr


def test_unknown_arguments_are_left_to_qt():
    from app.__main__ import parse_args

    a = parse_args(["--target", "/m/t", "-style", "fusion"])
    assert a.target == "/m/t" and a.qt_args == ["-style", "fusion"] and not a.demo_engine


def test_has_display_rules():
    assert not has_display({}, "linux")
    assert has_display({"DISPLAY": ":0"}, "linux")
    assert has_display({"WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert has_display({"QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert has_display({}, "win32") and has_display({}, "darwin")


def test_window_geometry_is_remembered(make_window, qtbot):
    w = make_window(load=False)
    w.resize(1300, 860)
    qtbot.waitUntil(lambda: (w.width(), w.height()) == (1300, 860), timeout=2000)
    w.plots_dock.hide()
    saved = w.saveGeometry()
    w.close()
    from app import settings as S

    assert S.get_bytes(w.settings, S.K_GEOMETRY) == saved
    w2 = make_window(load=False)
    # The offscreen platform clamps windows to its 800x800 screen, so compare what it can show:
    # the restored frame is the saved one cut to the screen, and the dock layout is back.
    screen = w2.screen().availableGeometry()
    assert w2.width() == min(1300, screen.width()) or w2.width() == w2.minimumSizeHint().width()
    assert not w2.plots_dock.isVisible() and w2.side_dock.isVisible()


def test_worker_runs_the_engine_on_one_other_thread_and_batches(qtbot):
    c = EngineController(fake_loader(tokens_per_second=0.0))
    try:
        with qtbot.waitSignal(c.loaded, timeout=5000):
            c.load("/", None, "CPU")
        batches: list[int] = []
        c.events_ready.connect(lambda tag, evs: batches.append(len(evs)))
        with qtbot.waitSignal(c.finished, timeout=10000) as b:
            c.generate(GenerateRequest("t1", "hi", GenerationConfig(max_new_tokens=2000), chat=False))
        tag, fin = b.args
        assert tag == "t1" and fin.reason == "length" and fin.stats["tokens"] == 2000
        pipe = c._worker._pipe
        assert pipe.thread_ids and threading.get_ident() not in pipe.thread_ids and len(pipe.thread_ids) == 1
        assert sum(batches) == fin.stats["target_steps"] + 1 == 2000  # no draft: one token per step
        assert len(batches) <= 5, f"{len(batches)} signals for 2000 steps: not batched"
    finally:
        assert c.shutdown(5000)


def test_engine_whose_metrics_fail_still_finishes_the_reply(qtbot):
    """The figures under a reply are the engine's metrics() alone: when it cannot give them, the reply
    still ends with its text's token count and no figures made up by the window."""
    from app.fake_engine import FakePipeline

    class NoMetrics(FakePipeline):
        def metrics(self, request_id):
            raise NotImplementedError

    c = EngineController(lambda t, d=None, device="CPU", **kw: NoMetrics(t, d, device))
    try:
        with qtbot.waitSignal(c.loaded, timeout=5000):
            c.load("/", "/draft", "CPU")
        with qtbot.waitSignal(c.finished, timeout=5000) as b:
            c.generate(GenerateRequest("t", "hi", GenerationConfig(max_new_tokens=50), chat=False))
        fin = b.args[1]
        st = fin.stats
        assert fin.reason == "length" and st["source"] == "none" and st["tokens"] == 50
        assert not {"ttft_ms", "tokens_per_step", "acceptance_rate", "decode_tok_s"} & set(st)
    finally:
        c.shutdown()
