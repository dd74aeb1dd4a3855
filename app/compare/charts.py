"""Bar charts of a comparison run: tok/s, tokens per step and speedup per configuration.

Horizontal bars (the configuration names sit on the left axis, where long names stay readable),
one chart under the other, the same row order as the run. Speedup bars below 1 are red and a line
marks 1x (the target alone). Items are made once per result; nothing here runs a timer.
"""
from __future__ import annotations

from typing import Callable, Sequence

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

BAR_COLOR = "#3b6fd8"
BASE_COLOR = "#98a2b3"  # the target alone's bars
FAST_COLOR = "#2e9d4a"
SLOW_COLOR = "#d92d20"  # speedup below 1
LABEL_CHARS = 34


def elide(text: str, n: int = LABEL_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


class BarChart(pg.PlotWidget):
    """One horizontal bar chart with value labels at the bar ends."""

    def __init__(self, title: str, unit_fmt: str = "{:.1f}", reference: float | None = None) -> None:
        super().__init__(background="w")
        self.setObjectName("barChart")
        self.title = title
        self.unit_fmt = unit_fmt
        self.reference = reference
        self.setTitle(title, color="#111827", size="9pt")
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.showGrid(x=True, y=False, alpha=0.2)
        self.getPlotItem().invertY(True)
        self.getAxis("left").setStyle(tickLength=0)
        self.setMinimumHeight(80)
        self.bars: pg.BarGraphItem | None = None
        self.brushes: list[str] = []
        self.values: list[float] = []
        self._texts: list[pg.TextItem] = []
        self._line: pg.InfiniteLine | None = None
        if reference is not None:
            self._line = pg.InfiniteLine(pos=reference, angle=90,
                                         pen=pg.mkPen("#475467", width=1, style=Qt.PenStyle.DashLine))
            self.addItem(self._line)

    def set_data(self, labels: Sequence[str], values: Sequence[float], colors: Sequence[str]) -> None:
        if self.bars is not None:
            self.removeItem(self.bars)
        for t in self._texts:
            self.removeItem(t)
        self._texts = []
        self.values = [float(v) for v in values]
        self.brushes = list(colors)
        n = len(values)
        if n:
            self.bars = pg.BarGraphItem(x0=[0.0] * n, y=list(range(n)), width=self.values, height=0.62,
                                        brushes=[pg.mkBrush(c) for c in colors], pen=None)
            self.addItem(self.bars)
        else:
            self.bars = None
        self.getAxis("left").setTicks([[(i, elide(s)) for i, s in enumerate(labels)], []])
        top = max(self.values + [self.reference or 0.0, 1e-9])
        for i, v in enumerate(self.values):
            t = pg.TextItem(self.unit_fmt.format(v), color="#101828", anchor=(0, 0.5))
            t.setPos(v + top * 0.01, i)
            self.addItem(t)
            self._texts.append(t)
        self.setXRange(0, top * 1.18, padding=0)
        self.setYRange(-0.6, max(n, 1) - 0.4, padding=0)


class BenchCharts(QWidget):
    """tok/s, tokens per step, speedup: one bar per result row."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("benchCharts")
        pg.setConfigOptions(antialias=True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.tok_s = BarChart("Decode tokens per second (higher is faster)", "{:.1f}")
        self.tokens_per_step = BarChart("Tokens per target step", "{:.2f}")
        self.speedup = BarChart("Speedup vs the target alone (same decoding; red: slower)", "{:.2f}x",
                                reference=1.0)
        self.empty = QLabel("Results appear here after a run: bar charts of decode tok/s, tokens per target "
                            "step and speedup over the target alone, one bar per configuration.")
        self.empty.setObjectName("chartsEmpty")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setStyleSheet("color:#667085; background:#ffffff; border:1px dashed #d0d5dd; padding:24px;")
        lay.addWidget(self.empty, 1)
        for c in (self.tok_s, self.tokens_per_step, self.speedup):
            lay.addWidget(c, 1)
            c.hide()

    def charts(self) -> list[BarChart]:
        return [self.tok_s, self.tokens_per_step, self.speedup]

    def set_rows(self, rows: Sequence[dict], label: Callable[[dict], str]) -> None:
        labels = [label(r) for r in rows]
        base = [r.get("draft") is None for r in rows]
        plain = [BASE_COLOR if b else BAR_COLOR for b in base]
        self.tok_s.set_data(labels, [float(r["tok_s"]) for r in rows], plain)
        self.tokens_per_step.set_data(labels, [float(r["tokens_per_step"]) for r in rows], plain)
        speed = [float(r["speedup"]) for r in rows]
        colors = [SLOW_COLOR if s < 1.0 else (BASE_COLOR if b and abs(s - 1.0) < 1e-9 else FAST_COLOR)
                  for s, b in zip(speed, base)]
        self.speedup.set_data(labels, speed, colors)
        h = max(80, 40 + 13 * len(rows))
        for c in self.charts():
            c.setMinimumHeight(h)
            c.setVisible(bool(rows))
        self.empty.setVisible(not rows)

    def clear(self) -> None:
        for c in self.charts():
            c.set_data([], [], [])
            c.hide()
        self.empty.show()
