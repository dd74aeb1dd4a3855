"""SmolLM2 (the embedded default, int8 weights): a target row's logits do not depend on what else
shares its inference, at the shipped precisions.

The same positions (two prompts' last rows and the target's greedy continuations) are scored one
row per call, in k-row windows, beside other requests (a one-row decode, a 3-row verify and a
48-row prefill chunk in every call) and after prefills in 7- and 32-row chunks; every row must be
bit-identical to the one-row decode's (engine/row_invariance.py, docs/engine.md "Row invariance").
"""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.models.properties import PRECISIONS, compile_properties
from engine.row_invariance import PROMPTS, Setting, measure


def _score(target: Path, setting: Setting):
    (result,) = measure(target, [setting], list(PROMPTS), tokens=12, rows=(2, 8), chunks=(7, 32))
    return result


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rows_are_bit_identical_in_windows_batches_and_chunked_prefills(smollm2_target: Path,
                                                                        precision: str) -> None:
    result = _score(smollm2_target, Setting(precision, compile_properties("CPU", precision), True))
    layouts = {r.layout for r in result.layouts}
    assert {"window-2", "window-8", "batch-1", "batch-8", "chunked-7", "chunked-32"} <= layouts
    for r in result.layouts:
        assert r.rows == 2 * 12
        assert r.max_abs_diff == 0.0 and r.equal_rows == r.rows, r


def test_one_row_calls_take_another_kernel_without_the_padding_row(smollm2_target: Path) -> None:
    """Why the padding row exists: without it the one-row decode's logits differ from a window's."""
    result = _score(smollm2_target, Setting("no padding", compile_properties("CPU", "default"), False))
    windows = [r for r in result.layouts if r.layout.startswith("window-")]
    assert all(r.max_abs_diff > 0.0 and r.equal_rows < r.rows for r in windows), windows
