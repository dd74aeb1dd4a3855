"""Three live plots: per step drafted / verified / accepted candidates (and tokens per step), acceptance
by block position, draft vs target ms.

Acceptance by position is engine.metrics.RequestMetrics' own counter (the figure under the reply);
the per-step marks show what the draft policy did: the candidates the draft proposed, how many of
them the target verified (the adaptive policy verifies only what pays), how many it accepted.

`add_events()` only appends numbers to growing numpy buffers (cheap, called for every batch the
worker sends); a GUI-thread timer at 25 Hz redraws when something changed. Plot items are made
once and updated with setData; pyqtgraph is never touched from the worker thread.
"""
from __future__ import annotations

from typing import Iterable

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.qt_tracking import TrackedTimer
from engine.events import StepEvent
from engine.metrics import RequestMetrics

REDRAW_MS = 40  # 25 Hz while drawing is cheap
MAX_REDRAW_MS = 100  # the slowest it gets when drawing is expensive (slow machine): still 10 Hz
DRAW_SHARE = 0.2  # drawing may use at most ~this share of the GUI thread
DRAFT_COLOR = "#2e9d4a"
TARGET_COLOR = "#3b6fd8"
MEAN_COLOR = "#d97706"
PROPOSED_COLOR = "#9ca3af"
# short enough for the plot's default width (the x axis already says "target step")
TOKENS_TITLE = (f"<span style='color:{PROPOSED_COLOR}'>drafted</span> · "
                f"<span style='color:{TARGET_COLOR}'>verified</span> · "
                f"<span style='color:{DRAFT_COLOR}'>accepted</span> · "
                f"<span style='color:{MEAN_COLOR}'>tokens</span>")
TOKENS_TIP = ("Per target step: candidates drafted (grey), verified (blue) and accepted (green dots); "
              "orange: tokens the step produced, the mean of the last 16 steps.")
ACCEPT_TITLE = "Acceptance by block position"
ACCEPT_CONF_TITLE = "Acceptance · <span style='color:#d97706'>draft confidence</span>"


class GrowBuffer:
    """A float array that doubles when full (amortised O(1) appends)."""

    def __init__(self, capacity: int = 256) -> None:
        self._a = np.zeros(capacity, dtype=np.float64)
        self.n = 0

    def append(self, v: float) -> None:
        if self.n == len(self._a):
            self._a = np.concatenate([self._a, np.zeros(len(self._a), dtype=np.float64)])
        self._a[self.n] = v
        self.n += 1

    def view(self) -> np.ndarray:
        return self._a[: self.n]

    def clear(self) -> None:
        self.n = 0


class TimedPlotWidget(pg.PlotWidget):
    """A PlotWidget that remembers how long its last paint took (to pace the redraw timer)."""

    paint_ms = 0.0

    def paintEvent(self, ev) -> None:  # noqa: N802
        t0 = time.perf_counter()
        super().paintEvent(ev)
        self.paint_ms = (time.perf_counter() - t0) * 1000.0


class LivePlots(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("livePlots")
        pg.setConfigOptions(antialias=False)
        self.steps = GrowBuffer()  # verification step number
        self.tokens = GrowBuffer()  # tokens committed by that step
        self.proposed = GrowBuffer()  # candidates the draft proposed for the window the step validated
        self.verified = GrowBuffer()  # of them, validated by the target in this step
        self.accepted = GrowBuffer()  # of those, accepted
        self.draft_ms = GrowBuffer()
        self.target_ms = GrowBuffer()
        self.metrics = RequestMetrics()  # the same count as the figure under the reply (acceptance by position too)
        self.conf_sum = np.zeros(0, dtype=np.float64)  # per block position: the draft's confidence, summed
        self.conf_n = np.zeros(0, dtype=np.int64)  # (drafts with a confidence head only)
        self._has_conf = False
        self._dirty = False
        self.redraws = 0
        self._ytop = -1.0
        self._span = -1
        self._xmax = -1.0  # shared x range of the two "per step" plots
        self._ms_top = -1.0
        self._hint = None

        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 2, 4, 2)
        lay.setSpacing(2)
        self.summary = QLabel("No steps yet. Send a message to see the decoder at work.")
        self.summary.setObjectName("plotSummary")
        lay.addWidget(self.summary)
        row = QHBoxLayout()
        row.setSpacing(6)
        lay.addLayout(row, 1)

        self.p_tokens = self._plot(TOKENS_TITLE, "target step", "candidates / tokens")
        self.p_tokens.setToolTip(TOKENS_TIP)
        self.c_proposed = self.p_tokens.plot([], [], pen=pg.mkPen(PROPOSED_COLOR, width=1), name="drafted")
        self.c_verified = self.p_tokens.plot([], [], pen=pg.mkPen(TARGET_COLOR, width=1), name="verified")
        self.c_accepted = self.p_tokens.plot([], [], pen=None, symbol="o", symbolSize=3, symbolBrush=DRAFT_COLOR,
                                             symbolPen=None, name="accepted")
        self.c_mean = self.p_tokens.plot([], [], pen=pg.mkPen(MEAN_COLOR, width=1), name="mean of last 16")
        self.p_tokens.setYRange(0, 4, padding=0.05)
        self._ytop = 4.0
        row.addWidget(self.p_tokens, 1)

        self.p_accept = self._plot(ACCEPT_TITLE, "position in block", "% accepted")
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=DRAFT_COLOR, pen=None)
        self.p_accept.addItem(self.bars)
        # The draft's own confidence per position (DSpark's confidence head), drawn over the bars.
        self.c_conf = self.p_accept.plot([], [], pen=pg.mkPen(MEAN_COLOR, width=1), symbol="o", symbolSize=5,
                                         symbolBrush=MEAN_COLOR, symbolPen=None)
        self.p_accept.setYRange(0, 100, padding=0.02)
        self.p_accept.setXRange(0.5, 7.5, padding=0)
        self.no_draft_text = pg.TextItem("", color="#667085", anchor=(0.5, 0.5))
        self.no_draft_text.setTextWidth(150)
        self.no_draft_text.setPos(4.0, 50.0)
        self.p_accept.addItem(self.no_draft_text)
        row.addWidget(self.p_accept, 1)

        self.p_time = self._plot(f"ms per step: <span style='color:{DRAFT_COLOR}'>draft</span> vs "
                                 f"<span style='color:{TARGET_COLOR}'>target</span>", "target step", "ms")
        self.c_draft = self.p_time.plot([], [], pen=pg.mkPen(DRAFT_COLOR, width=1), name="draft")
        self.c_target = self.p_time.plot([], [], pen=pg.mkPen(TARGET_COLOR, width=1), name="target")
        for p in (self.p_tokens, self.p_accept, self.p_time):
            p.disableAutoRange()  # ranges are set by hand, in steps, so axes are not re-laid out per frame
        row.addWidget(self.p_time, 1)

        self._timer = TrackedTimer(self)
        self._timer.setInterval(REDRAW_MS)
        self._timer.timeout.connect(self._tick)
        self._running = False
        self._last_cost_ms = 0.0

    def _plot(self, title: str, xlabel: str, ylabel: str) -> pg.PlotWidget:
        w = TimedPlotWidget(background="w")
        w.setTitle(title, color="#111827", size="9pt")
        w.setLabel("bottom", xlabel)
        w.setLabel("left", ylabel)
        w.showGrid(x=False, y=True, alpha=0.2)
        w.setMenuEnabled(False)
        w.setMouseEnabled(x=False, y=False)
        w.hideButtons()
        w.setMinimumHeight(150)
        item = w.getPlotItem()
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        return w

    # -- data (cheap; any rate) ------------------------------------------------------------------
    @staticmethod
    def _nice_ceiling(v: float) -> float:
        """The next of 1, 2, 5 x 10^k at or above v (axis tops that change rarely)."""
        if v <= 0:
            return 1.0
        k = 10.0 ** np.floor(np.log10(v))
        for m in (1.0, 2.0, 5.0, 10.0):
            if v <= m * k:
                return m * k
        return 10.0 * k

    def reset(self) -> None:
        for b in (self.steps, self.tokens, self.proposed, self.verified, self.accepted, self.draft_ms,
                  self.target_ms):
            b.clear()
        self.metrics = RequestMetrics()
        self.conf_sum = np.zeros(0, dtype=np.float64)
        self.conf_n = np.zeros(0, dtype=np.int64)
        if self._has_conf:
            self._has_conf = False
            self.p_accept.setTitle(ACCEPT_TITLE, color="#111827", size="9pt")
        self._xmax = self._ms_top = -1.0
        self._dirty = True
        self._redraw()

    def add_events(self, events: Iterable[StepEvent]) -> None:
        for ev in events:
            # The steps and tokens per step are engine.metrics.RequestMetrics' own (the figure under the
            # reply): the prefill and a cancel that ran no inference are not steps; a step counts the
            # tokens it produced, an EOS or a stop-string cut included.
            before = self.metrics.target_steps
            self.metrics.record(ev)
            if self.metrics.target_steps == before:
                continue
            self.steps.append(ev.step)
            self.tokens.append(ev.produced)
            k = len(ev.drafted)
            self.proposed.append(float(max(ev.window_proposed, k)))
            self.verified.append(float(k))
            self.accepted.append(float(min(ev.accepted, k)))
            t = ev.timings
            self.draft_ms.append(float(t.draft_step_ms))
            self.target_ms.append(float(t.target_ms))
            if k:
                conf = ev.confidence
                if conf:
                    c = np.asarray(conf[:k], dtype=np.float64)
                    if len(c) > len(self.conf_sum):
                        grow = len(c) - len(self.conf_sum)
                        self.conf_sum = np.concatenate([self.conf_sum, np.zeros(grow)])
                        self.conf_n = np.concatenate([self.conf_n, np.zeros(grow, dtype=np.int64)])
                    self.conf_sum[: len(c)] += c
                    self.conf_n[: len(c)] += 1
            self._dirty = True

    # -- drawing (GUI thread timer) --------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        if self.isVisible() and not self._timer.isActive():
            self._timer.start()

    def stop(self) -> None:
        """Stop the timer after one last draw."""
        self._running = False
        self._timer.stop()
        self._redraw()

    @property
    def timer_active(self) -> bool:
        return self._timer.isActive()

    def showEvent(self, e) -> None:  # noqa: N802
        super().showEvent(e)
        if self._running and not self._timer.isActive():
            self._timer.start()
        self._redraw()

    def hideEvent(self, e) -> None:  # noqa: N802
        self._timer.stop()  # no drawing while nobody can see it
        super().hideEvent(e)

    def acceptance_percent(self) -> np.ndarray:
        """Per block position: % of the windows verified that far whose candidate there was accepted."""
        return 100.0 * np.asarray(self.metrics.acceptance_by_position, dtype=np.float64)

    def confidence_percent(self) -> np.ndarray:
        """Mean draft confidence per block position, in % (empty without a confidence head)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.conf_n > 0, 100.0 * self.conf_sum / np.maximum(self.conf_n, 1), np.nan)

    @property
    def interval_ms(self) -> int:
        return self._timer.interval()

    def _tick(self) -> None:
        """Redraw, then pace the timer so drawing (data + paint) stays a small share of the GUI."""
        painted = sum(p.paint_ms for p in (self.p_tokens, self.p_accept, self.p_time))  # the last frame
        t0 = time.perf_counter()
        drew = self._redraw()
        cost = painted + (time.perf_counter() - t0) * 1000.0
        if drew:
            self._last_cost_ms = cost
            want = int(min(MAX_REDRAW_MS, max(REDRAW_MS, cost / DRAW_SHARE)))
            if abs(want - self._timer.interval()) > 5:
                self._timer.setInterval(want)

    def _redraw(self) -> bool:
        if not self._dirty:
            return False
        self._dirty = False
        self.redraws += 1
        x = self.steps.view()
        y = self.tokens.view()
        self.c_proposed.setData(x, self.proposed.view(), skipFiniteCheck=True)
        self.c_verified.setData(x, self.verified.view(), skipFiniteCheck=True)
        self.c_accepted.setData(x, self.accepted.view(), skipFiniteCheck=True)
        if len(y):
            w = 16
            c = np.cumsum(np.insert(y, 0, 0.0))
            lo = np.maximum(np.arange(1, len(y) + 1) - w, 0)
            mean = (c[1:] - c[lo]) / (np.arange(1, len(y) + 1) - lo)
            self.c_mean.setData(x, mean, skipFiniteCheck=True)
            top = max(4.0, float(y.max()) + 0.5, float(self.proposed.view().max()) + 0.5)
            if top != self._ytop:  # ranges change rarely: re-laying out an axis is not free
                self._ytop = top
                self.p_tokens.setYRange(0, top, padding=0.05)
        else:
            self.c_mean.setData([], [])
        pct = self.acceptance_percent()
        positions = np.arange(1, len(pct) + 1)
        self.bars.setOpts(x=positions, height=pct, width=0.7)
        if self.conf_n.any():
            conf = self.confidence_percent()
            ok = ~np.isnan(conf)
            self.c_conf.setData(np.arange(1, len(conf) + 1)[ok], conf[ok])
            if not self._has_conf:
                self._has_conf = True
                self.p_accept.setTitle(ACCEPT_CONF_TITLE, color="#111827", size="9pt")
        else:
            self.c_conf.setData([], [])
        span = max(7, len(pct))
        if span != self._span:
            self._span = span
            self.p_accept.setXRange(0.5, span + 0.5, padding=0)
            self.no_draft_text.setPos((span + 1) / 2.0, 50.0)
        if len(y) and not len(pct):
            hint = "No draft: nothing to accept"
        elif len(pct) and not any(self.metrics.position_accepted):
            hint = "No draft token accepted yet (0% at every position)"
        else:
            hint = ""
        if hint != self._hint:
            self._hint = hint
            self.no_draft_text.setText(hint)
        self.c_draft.setData(x, self.draft_ms.view(), skipFiniteCheck=True)
        self.c_target.setData(x, self.target_ms.view(), skipFiniteCheck=True)
        xmax = float(max(50, int(np.ceil(len(y) / 50.0)) * 50))
        if xmax != self._xmax:
            self._xmax = xmax
            for p in (self.p_tokens, self.p_time):
                p.setXRange(0, xmax, padding=0.02)
        if len(y):
            ms_top = self._nice_ceiling(float(max(self.draft_ms.view().max(), self.target_ms.view().max())))
        else:
            ms_top = 1.0
        if ms_top != self._ms_top:
            self._ms_top = ms_top
            self.p_time.setYRange(0, ms_top, padding=0.02)
        if len(y):
            m = self.metrics
            drafted = m.windows > 0
            verify = (f" · verified {m.mean_verified:.1f} of {m.drafted_total / m.windows:.1f} drafted per window"
                      if drafted else "")
            self.summary.setText(
                f"{m.target_steps} verification steps · {m.tokens_per_step:.2f} tokens per step{verify} · "
                f"draft {self.draft_ms.view().mean():.1f} ms, target {self.target_ms.view().mean():.1f} ms "
                f"per step (mean)" + ("" if drafted else " · no draft: one token per step")
            )
        else:
            self.summary.setText("No steps yet. Send a message to see the decoder at work.")
        return True
