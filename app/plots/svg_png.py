"""An SVG (the bench's reliability plot) rendered to PNG with Qt's SVG renderer, for documents that show
images but not SVG: `python -m app.plots.svg_png FILE.svg [OUT.png] [--scale 2]`. It lives on the app side
because the engine never imports Qt."""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def render_png(svg_path: Path, png_path: Path, scale: float = 2.0) -> None:
    """Render `svg_path` to `png_path` at `scale` (an offscreen Qt where no display is set)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QByteArray
    from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])  # text needs the font database  # noqa: F841
    renderer = QSvgRenderer(QByteArray(Path(svg_path).read_bytes()))
    if not renderer.isValid():
        raise ValueError(f"{svg_path} is not an SVG Qt can read")
    size = renderer.defaultSize()
    image = QImage(int(size.width() * scale), int(size.height() * scale), QImage.Format.Format_RGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    if not image.save(str(png_path), "PNG"):
        raise OSError(f"could not write {png_path}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m app.plots.svg_png", description=__doc__)
    p.add_argument("svg", type=Path)
    p.add_argument("png", type=Path, nargs="?", default=None, help="default: the SVG's name with .png")
    p.add_argument("--scale", type=float, default=2.0)
    args = p.parse_args(argv)
    render_png(args.svg, args.png or args.svg.with_suffix(".png"), args.scale)


if __name__ == "__main__":
    main()
