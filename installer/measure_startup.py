"""Start-up time of the bundle against the source checkout (`python -m app`'s code path), measured
with the self-test: `window_shown_s` is the time from process start to the main window being shown
(the self-test opens the window first, exactly as the app does), `wall_s` the whole self-test
process (window + engine imports + two tiny generations + a chat turn through the window).

    .venv/bin/python installer/measure_startup.py [--bundle DIR] [--runs 5]

Runs alternate between the two so both see the same machine load; prints a JSON summary with the
median and the minimum of each. Warm page cache (after one unmeasured run of each), or with
--cold: before every run the files each variant reads (the bundle folder; the interpreter, its
standard library, the venv's runtime packages and app/ + engine/) are dropped from the page cache
with posix_fadvise(DONTNEED), which approximates a first start after boot or install.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def evict(paths: list[Path]) -> None:
    """Ask the kernel to drop these files' clean pages from the page cache (no root needed)."""
    for root in paths:
        files = [root] if root.is_file() else (f for f in root.rglob("*") if f.is_file() and not f.is_symlink())
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def source_files() -> list[Path]:
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    pkgs = ["PySide6", "shiboken6", "openvino", "openvino_genai", "openvino_tokenizers", "numpy", "numpy.libs",
            "pyqtgraph", "platformdirs"]
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    return ([site / p for p in pkgs] + [Path(sysconfig.get_paths()["stdlib"]), Path(sys.executable).resolve(),
            ROOT / "app", ROOT / "engine"] + list(libdir.glob("libpython3*.so*")))


def run(cmd: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
        t0 = time.perf_counter()
        p = subprocess.run(cmd + ["--output", str(out)], capture_output=True, text=True, env=env, cwd=d)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"{cmd} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        r = json.loads(out.read_text())
    return {"window_shown_s": r["window_shown_s"], "wall_s": round(wall, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "dist" / "installer" / "dflash-studio")
    ap.add_argument("--testdata", type=Path, default=ROOT / "build" / "installer" / "testdata")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="drop each variant's files from the page cache first")
    a = ap.parse_args()
    cold = {"bundle": [a.bundle], "source": source_files()}
    variants = {
        "bundle": [str(a.bundle / "dflash-studio"), "--self-test"],
        "source": [sys.executable, "-m", "app.selftest", "--models", str(a.testdata.resolve())],
    }
    os.environ["PYTHONPATH"] = str(ROOT)
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for k, cmd in variants.items():  # warm-up
        run(cmd)
    for _ in range(a.runs):
        for k, cmd in variants.items():
            if a.cold:
                evict(cold[k])
            results[k].append(run(cmd))
    summary = {}
    for k, rows in results.items():
        summary[k] = {m: {"median": round(statistics.median(r[m] for r in rows), 3),
                          "min": round(min(r[m] for r in rows), 3)} for m in ("window_shown_s", "wall_s")}
    summary["runs"] = a.runs
    summary["page_cache"] = "cold" if a.cold else "warm"
    summary["cpu_count"] = os.cpu_count()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
