"""How sure the draft was against what the target accepted: reliability data and its SVG plot.

A bench run's adaptive configurations each keep the calibration their policy learned
(engine.draft_policy.Calibration: per position and bin of the draft's peak probability, the candidates
the target reached and accepted; and the same outcomes by the calibrated value the policy used).
`--reliability FILE.svg` writes, per configuration and decoding, two panels: the raw peak probability
per position against the
observed acceptance (given every candidate before was accepted), and the calibrated values against
the same outcomes, each with its expected calibration error (ECE: the reached-weighted mean gap
between a bin's mean value and its observed rate). The SVG is written by hand (no plotting library);
a PNG for documents that show images but not SVG is the app's to render (`python -m app.plots.svg_png
FILE.svg`, Qt's SVG renderer), since the engine never imports Qt.
"""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from engine.paths import check_writable

MIN_COUNT = 10  # a bin with fewer reached candidates is not drawn (its rate is noise)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
W, H, PAD = 300, 260, 40


def position_curves(rel: dict[str, Any]) -> list[list[tuple[float, float, int]]]:
    """Per position: (mean raw confidence, observed acceptance, reached) per bin that has data."""
    out = []
    for reached, accepted, sums in zip(rel["reached"], rel["accepted"], rel["confidence_sum"]):
        out.append([(s / r, a / r, r) for r, a, s in zip(reached, accepted, sums) if r])
    while out and not out[-1]:
        out.pop()
    return out


def calibrated_curve(rel: dict[str, Any]) -> list[tuple[float, float, int]]:
    """(mean calibrated value, observed acceptance, reached) per bin of the value the policy used."""
    return [(s / r, a / r, r) for r, a, s in zip(rel["predicted_reached"], rel["predicted_accepted"],
                                                 rel["predicted_sum"]) if r]


def ece(points: list[tuple[float, float, int]]) -> float | None:
    total = sum(n for _, _, n in points)
    return sum(n * abs(x - y) for x, y, n in points) / total if total else None


def summary(rel: dict[str, Any]) -> dict[str, object]:
    """ECE of the raw confidence (all positions' bins) and of the calibrated values, and the counts."""
    raw = [p for curve in position_curves(rel) for p in curve]
    cal = calibrated_curve(rel)
    return {"ece_raw": ece(raw), "ece_calibrated": ece(cal), "reached": sum(n for _, _, n in raw),
            "reached_calibrated": sum(n for _, _, n in cal)}


def _panel(x0: float, title: str, series: list[tuple[str, str, list[tuple[float, float, int]]]]) -> list[str]:
    def px(v: float) -> float:
        return x0 + PAD + v * (W - 2 * PAD)

    def py(v: float) -> float:
        return H - PAD + 10 - v * (H - 2 * PAD)

    out = [f'<text x="{x0 + W / 2}" y="16" text-anchor="middle" font-size="12">{escape(title)}</text>',
           f'<rect x="{px(0)}" y="{py(1)}" width="{px(1) - px(0)}" height="{py(0) - py(1)}" fill="none" '
           'stroke="#999"/>',
           f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(1)}" y2="{py(1)}" stroke="#bbb" stroke-dasharray="4,3"/>']
    for t in (0.0, 0.5, 1.0):
        out.append(f'<text x="{px(t)}" y="{py(0) + 14}" text-anchor="middle" font-size="10">{t:g}</text>')
        out.append(f'<text x="{px(0) - 4}" y="{py(t) + 3}" text-anchor="end" font-size="10">{t:g}</text>')
    out.append(f'<text x="{x0 + W / 2}" y="{H - 2}" text-anchor="middle" font-size="10">'
               f'{"draft peak probability" if "raw" in title else "calibrated P(accept)"}</text>')
    out.append(f'<text x="{x0 + 10}" y="{py(0.5)}" font-size="10" transform="rotate(-90 {x0 + 10} {py(0.5)})" '
               'text-anchor="middle">observed acceptance</text>')
    for i, (label, color, pts) in enumerate(series):
        pts = [p for p in pts if p[2] >= MIN_COUNT]
        if not pts:
            continue
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>' for x, y, _ in pts]
        out.append(f'<text x="{px(0) + 6}" y="{py(1) + 12 + 11 * i}" font-size="9" fill="{color}">'
                   f'{escape(label)}</text>')
    return out


def svg(entries: list[tuple[str, dict[str, Any]]]) -> str:
    """Two panels (raw by position, calibrated) per (title, reliability data) entry, one entry per line."""
    rows = []
    for k, (title, rel) in enumerate(entries):
        s = summary(rel)
        curves = position_curves(rel)
        raw = [(f"position {j + 1}", COLORS[j % len(COLORS)], c) for j, c in enumerate(curves)]
        e_raw = "-" if s["ece_raw"] is None else f"{s['ece_raw']:.3f}"
        e_cal = "-" if s["ece_calibrated"] is None else f"{s['ece_calibrated']:.3f}"
        body = _panel(0, f"raw peak probability (ECE {e_raw}, {s['reached']} reached)", raw)
        body += _panel(W, f"calibrated (ECE {e_cal})", [("all positions", "#111", calibrated_curve(rel))])
        rows.append(f'<g transform="translate(0,{k * (H + 30) + 18})">'
                    f'<text x="6" y="-4" font-size="11" font-weight="bold">{escape(title)}</text>'
                    + "".join(body) + "</g>")
    height = len(entries) * (H + 30) + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{height}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>' + "".join(rows) + "</svg>\n")


def entries_of(reliability: dict[str, dict[str, dict]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{config} [{mode}]", rel) for config, modes in reliability.items() for mode, rel in modes.items()]


def check_reliability_path(path: Path) -> None:
    """Before the run: an .svg name in a folder that can be written."""
    if path.suffix.lower() != ".svg":
        raise ValueError(f"--reliability {path}: give a file name ending in .svg (its data goes beside it as .json; "
                         "`python -m app.plots.svg_png FILE.svg` renders a PNG of it).")
    check_writable(path.absolute().parent, "The --reliability file's folder")


def write_reliability(result: Any, path: Path) -> None:
    """`path` (an .svg) and its data as JSON beside it (empty panels when no configuration had confidences)."""
    check_reliability_path(path)
    entries = entries_of(result.reliability)
    write_plot(entries, path, result.settings.get("command"))


def write_plot(entries: list[tuple[str, dict[str, Any]]], path: Path, command: object = None) -> None:
    data = {title: dict(rel, summary=summary(rel)) for title, rel in entries}
    path.with_suffix(".json").write_text(json.dumps({"command": command, "entries": data}, indent=1))
    path.with_suffix(".svg").write_text(svg(entries))


_COUNTS = ("reached", "accepted", "confidence_sum", "predicted_reached", "predicted_accepted", "predicted_sum")


def merge(rels: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' reliability data of one configuration as one: their counts summed (the map is the last run's:
    the plot does not draw it)."""
    out = dict(rels[-1])
    for key in _COUNTS:
        rows = [r[key] for r in rels]
        if isinstance(rows[0][0], list):
            out[key] = [[sum(v) for v in zip(*cols)] for cols in zip(*rows)]
        else:
            out[key] = [sum(v) for v in zip(*rows)]
    return out


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.bench.reliability OUT.svg RUN.json...`: one plot of several runs' --reliability
    data (each title's counts summed over the runs that have it; titles name the run's --dataset)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m engine.bench.reliability", description=main.__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("runs", type=Path, nargs="+", help="the .json files that --reliability wrote")
    p.add_argument("--only", default=None, help="keep the titles that contain this text")
    args = p.parse_args(argv)
    check_reliability_path(args.out)
    by_title: dict[str, list[dict[str, Any]]] = {}
    for run in args.runs:
        data = json.loads(run.read_text())
        words = str(data.get("command") or "").split()
        dataset = words[words.index("--dataset") + 1] if "--dataset" in words[:-1] else None
        for title, rel in data["entries"].items():
            if args.only is None or args.only in title:
                by_title.setdefault(f"{dataset}: {title}" if dataset else title, []).append(rel)
    entries = [(f"{title} ({len(rels)} runs)" if len(rels) > 1 else title, merge(rels))
               for title, rels in by_title.items()]
    write_plot(entries, args.out, [str(r) for r in args.runs])


if __name__ == "__main__":
    main()
