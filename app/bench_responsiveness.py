"""How responsive the window stays while the worker streams 1,000 tokens per second (no model needed).

    QT_QPA_PLATFORM=offscreen python -m app.bench_responsiveness      # or under xvfb-run -a

The real MainWindow runs over the fake engine (app/fake_engine.py), paced at 1,000 tokens/s. While
a long reply streams, a probe timer on the GUI thread asks to fire every 10 ms; how late each tick
fires is the event-loop latency a person would feel as lag (typing, scrolling, the Stop button).
It is measured idle first, then streaming with a draft (~3 tokens per step) and without one (one
token per step: the most events), each with the worker's batching on (the app's setting) and off
(one signal per engine step) for contrast.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROBE_MS = 10


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))
    return s[k]


class Probe:
    """A 10 ms PreciseTimer on the GUI thread; records how late each tick fires."""

    def __init__(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.late_ms: list[float] = []
        self._last = 0.0
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(PROBE_MS)
        self.timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.late_ms.clear()
        self._last = time.perf_counter()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.late_ms.append(max(0.0, (now - self._last) * 1000.0 - PROBE_MS))
        self._last = now


def summary(late: list[float]) -> dict[str, float]:
    return {
        "ticks": len(late),
        "p50_ms": round(_percentile(late, 50), 2),
        "p95_ms": round(_percentile(late, 95), 2),
        "p99_ms": round(_percentile(late, 99), 2),
        "max_ms": round(max(late) if late else 0.0, 2),
        "mean_ms": round(statistics.fmean(late) if late else 0.0, 2),
    }


def run(seconds: float, tokens_per_second: float) -> dict:
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    from app import settings as S
    from app.fake_engine import fake_loader
    from app.main_window import MainWindow

    qapp = QApplication.instance() or QApplication(["bench"])
    home = Path(tempfile.mkdtemp(prefix="dflash-bench-"))
    os.environ["DFLASH_STUDIO_HOME"] = str(home)
    target, draft = home / "target", home / "draft"
    target.mkdir()
    draft.mkdir()

    def spin(cond, timeout: float) -> None:
        """Run the real event loop (no busy polling) until cond() or the timeout."""
        from PySide6.QtCore import QTimer

        loop = QEventLoop()
        end = time.monotonic() + timeout
        check = QTimer()
        check.setInterval(20)
        check.timeout.connect(lambda: (cond() or time.monotonic() >= end) and loop.quit())
        check.start()
        if not cond():
            loop.exec()
        check.stop()

    probe = Probe()
    # Idle baseline: the window shown, nothing streaming.
    results: dict = {"platform": qapp.platformName(), "python": platform.python_version(),
                     "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                     "tokens_per_second_asked": tokens_per_second, "seconds_per_run": seconds, "runs": []}
    cases = [("draft, batched (app setting)", True, 0.033), ("no draft, batched (app setting)", False, 0.033),
             ("draft, one signal per step", True, 0.0), ("no draft, one signal per step", False, 0.0)]
    first = True
    for name, with_draft, flush in cases:
        w = MainWindow(settings=S.open_settings(home / f"settings-{len(results['runs'])}.ini"),
                       loader=fake_loader(tokens_per_second=tokens_per_second), autoload=False,
                       draft_validator=lambda t, d: [], flush_interval_s=flush, history_root=home / "history")
        w.show()
        w.model_panel.set_target(str(target))
        w.model_panel.set_draft(str(draft) if with_draft else None)
        w.load_models(str(target), str(draft) if with_draft else None, "CPU")
        spin(lambda: w.engine_info is not None, 10)
        if first:
            probe.start()
            spin(lambda: False, min(2.0, seconds))
            probe.stop()
            results["idle"] = summary(probe.late_ms)
            first = False
        batches = {"n": 0, "events": 0}
        w.controller.events_ready.connect(lambda _t, evs: (batches.__setitem__("n", batches["n"] + 1),
                                                            batches.__setitem__("events", batches["events"] + len(evs))))
        w.gen_panel.max_new_tokens.setValue(int(tokens_per_second * seconds))
        t0 = time.perf_counter()
        probe.start()
        w.send("Stream as fast as you can.")
        spin(lambda: not w.streams, seconds * 4 + 10)
        probe.stop()
        wall = time.perf_counter() - t0
        reply = w.current.messages[-1]
        stats = reply.stats or {}
        results["runs"].append({
            "case": name,
            "tokens": stats.get("tokens"),
            "wall_s": round(wall, 2),
            "tokens_per_s_shown": round(stats.get("tokens", 0) / wall, 1) if wall else 0,
            "engine_steps": batches["events"],
            "signals": batches["n"],
            "plot_redraws": w.plots.redraws,
            "plot_interval_ms_at_end": w.plots.interval_ms,
            "text_interval_ms_at_end": w.text_interval_ms,
            "chat_chars": len(w.chat.toPlainText()),
            "latency": summary(probe.late_ms),
        })
        w.close()
        w.deleteLater()
        spin(lambda: False, 0.2)
    return results


def markdown(r: dict) -> str:
    lines = [
        f"Event-loop latency (how late a 10 ms GUI timer fires) while the worker streams "
        f"{r['tokens_per_second_asked']:.0f} tokens/s from the fake engine for ~{r['seconds_per_run']:.0f} s per run. "
        f"Qt platform `{r['platform']}`, Python {r['python']}, {r['cpus']} CPUs"
        + (f" (1-minute load average {r['load_average_1min'][0]:.1f} before, {r['load_average_1min'][1]:.1f} after: "
           "other work shared the CPUs)." if r.get("load_average_1min") and r["load_average_1min"][0] is not None else "."),
        "",
        "| case | tokens | tokens/s shown | engine steps | signals to the GUI | plot redraws (interval at end) | p50 | p95 | p99 | max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    idle = r["idle"]
    lines.append(f"| idle window (baseline) | – | – | – | – | – | {idle['p50_ms']} ms | {idle['p95_ms']} ms | "
                 f"{idle['p99_ms']} ms | {idle['max_ms']} ms |")
    for run_ in r["runs"]:
        lat = run_["latency"]
        lines.append(f"| {run_['case']} | {run_['tokens']} | {run_['tokens_per_s_shown']} | {run_['engine_steps']} | "
                     f"{run_['signals']} | {run_['plot_redraws']} ({run_['plot_interval_ms_at_end']} ms) | {lat['p50_ms']} ms | {lat['p95_ms']} ms | "
                     f"{lat['p99_ms']} ms | {lat['max_ms']} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="length of each streaming run")
    p.add_argument("--tokens-per-second", type=float, default=1000.0)
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args(argv)
    if not any(os.environ.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    r = run(args.seconds, args.tokens_per_second)
    r["load_average_1min"] = [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None]
    print(markdown(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
