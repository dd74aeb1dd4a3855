"""The reliability plot: the SVG with its data beside it, and several runs' counts merged into one."""
from __future__ import annotations

import json

from engine.bench.reliability import main, merge, summary, write_plot
from fixtures.reliability import overconfident_reliability as _rel


def test_the_plot_as_svg_with_its_data_beside_it(tmp_path) -> None:
    out = tmp_path / "rel.svg"
    write_plot([("a draft [greedy]", _rel(0))], out, "bench ...")
    assert out.read_text().startswith("<svg")
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["command"] == "bench ..." and data["entries"]["a draft [greedy]"]["summary"]["ece_raw"] > 0.1


def test_runs_merge_by_summing_their_counts(tmp_path) -> None:
    a, b = _rel(1), _rel(2)
    m = merge([a, b])
    assert summary(m)["reached"] == summary(a)["reached"] + summary(b)["reached"]
    assert sum(m["predicted_reached"]) == sum(a["predicted_reached"]) + sum(b["predicted_reached"])
    for i, rel in enumerate((a, b)):
        write_plot([("x [greedy]", rel), ("y [greedy]", rel)], tmp_path / f"r{i}.svg")
    main([str(tmp_path / "both.svg"), str(tmp_path / "r0.json"), str(tmp_path / "r1.json"), "--only", "x"])
    both = json.loads((tmp_path / "both.json").read_text())["entries"]
    assert list(both) == ["x [greedy] (2 runs)"]
    assert both["x [greedy] (2 runs)"]["summary"]["reached"] == summary(m)["reached"]


def test_a_png_name_is_refused_before_the_run_with_the_way_to_render_one(tmp_path) -> None:
    import pytest

    from engine.bench.reliability import check_reliability_path

    with pytest.raises(ValueError, match="app.plots.svg_png"):
        check_reliability_path(tmp_path / "rel.png")
