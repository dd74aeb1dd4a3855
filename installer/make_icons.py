"""Render the app icon (resources/icons/dflash.svg) to PNGs for Linux and an .ico for Windows.

    .venv/bin/python installer/make_icons.py OUT_DIR     -> OUT_DIR/dflash-studio-{16..256}.png
    .venv/bin/python installer/make_icons.py --ico FILE  -> a multi-size Windows icon (PNG-compressed)

Uses Qt's SVG renderer from the dev venv, offscreen; no other tools needed.
"""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
SVG = ROOT / "resources" / "icons" / "dflash.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256)


def render(size: int) -> bytes:
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])
    img = QImage(size, size, QImage.Format.Format_ARGB32)
    img.fill(Qt.GlobalColor.transparent)
    painter = QPainter(img)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    QSvgRenderer(str(SVG)).render(painter)
    painter.end()
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")
    return bytes(data)


def write_pngs(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for s in SIZES:
        f = out / f"dflash-studio-{s}.png"
        f.write_bytes(render(s))
        files.append(f)
    return files


def write_ico(path: Path) -> Path:
    """ICO with PNG-compressed entries (supported since Windows Vista)."""
    images = [(s, render(s)) for s in SIZES]
    header = struct.pack("<HHH", 0, 1, len(images))
    offset = 6 + 16 * len(images)
    entries, blobs = b"", b""
    for s, png in images:
        entries += struct.pack("<BBBBHHII", s % 256, s % 256, 0, 0, 1, 32, len(png), offset + len(blobs))
        blobs += png
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + entries + blobs)
    return path


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ico":
        print(write_ico(Path(sys.argv[2])))
    elif len(sys.argv) == 2:
        print("\n".join(map(str, write_pngs(Path(sys.argv[1])))))
    else:
        sys.exit(__doc__)
