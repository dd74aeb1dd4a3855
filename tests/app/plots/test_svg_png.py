"""The app-side PNG of the bench's reliability SVG (Qt's SVG renderer)."""
from __future__ import annotations

import pytest

from app.plots.svg_png import main
from engine.bench.reliability import write_plot
from fixtures.reliability import overconfident_reliability


def test_the_reliability_svg_renders_to_a_png(tmp_path) -> None:
    write_plot([("a draft [greedy]", overconfident_reliability(0, 300))], tmp_path / "rel.svg")
    main([str(tmp_path / "rel.svg")])
    out = tmp_path / "rel.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_a_file_that_is_not_svg_is_refused(tmp_path) -> None:
    bad = tmp_path / "x.svg"
    bad.write_text("not svg at all")
    with pytest.raises(ValueError, match="not an SVG"):
        main([str(bad)])
