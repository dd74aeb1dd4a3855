"""Row invariance on a model whose weights dynamic quantization does not apply to (the tiny fp32
target), at the default precision: the paged target never lets such a call have one row (a dummy
row), and every row stays bit-identical to the one-row decode's (engine/models/paged_target.py; why
the dummy row is needed, and the int8 SmolLM2, are in tests/smollm2/test_row_invariance_smollm2.py)."""
from __future__ import annotations

from pathlib import Path

import openvino as ov
import pytest

from engine.models.paged_target import all_weights_compressed
from engine.models.properties import compile_properties
from engine.row_invariance import PROMPTS, Setting, _parse_setting, measure


def test_fp32_weights_get_a_dummy_row_and_stay_bit_identical(tiny_qwen3_target: Path) -> None:
    core = ov.Core()
    assert not all_weights_compressed(core.read_model(tiny_qwen3_target / "openvino_model.xml"))
    setting = Setting("default", compile_properties("CPU", "default"), "split")
    (res,) = measure(tiny_qwen3_target, [setting], [PROMPTS[0]], tokens=10, rows=(2, 5), chunks=(3,))
    assert {r.layout for r in res.layouts} >= {"window-2", "window-5", "batch-1", "batch-5", "chunked-3", "recompute-3"}
    for r in res.layouts:
        assert r.max_abs_diff == 0.0 and r.equal_rows == r.rows == 10, r


def test_setting_text_names_what_is_wrong() -> None:
    assert _parse_setting("x:KV_CACHE_PRECISION=f16,rows=plain", "CPU").rows == "plain"
    with pytest.raises(ValueError, match="rows='sideways'"):
        _parse_setting("x:rows=sideways", "CPU")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _parse_setting("x:f16", "CPU")


def test_prefill_chunks_put_prompt_rows_first_and_end_before_prompt_rows_follow_generated() -> None:
    from engine.pipeline import _Request

    req = _Request(0, list(range(10)), None, 0, 0, None, None, 0.0, spans=[(3, 6)])  # type: ignore[arg-type]
    assert [req.generated_at(p) for p in range(12)] == [False] * 3 + [True] * 3 + [False] * 4 + [True] * 2
    assert req.prefill_rows(8) == (6, 3)  # 0-2 prompt rows, 3-5 generated, then a prompt row: it ends at 6
    assert req.prefill_rows(2) == (2, 2)
    req.fed = 3
    assert req.prefill_rows(8) == (3, 0)
    req.fed = 6
    assert req.prefill_rows(8) == (8, 4)  # a recompute: 6-9 prompt rows, then the generated 10-13
