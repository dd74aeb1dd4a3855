"""SmolLM2 (the embedded default, int8 weights): a target row's logits do not depend on what else
shares its inference, at the shipped precisions.

The same positions (two prompts' last rows and the target's greedy continuations) are scored one
row per call, in k-row windows, beside other requests (a one-row decode, a 3-row verify and a
48-row prefill chunk in every call; a 160-row prefill chunk) and after prefills in 7- and 32-row
chunks; every row must be bit-identical to the one-row decode's (engine/row_invariance.py,
docs/engine.md "Row invariance").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from engine.models.paged_target import PagedTarget, SeqChunk, all_weights_compressed
from engine.models.properties import PRECISIONS, compile_properties, row_mode
from engine.models.tokenizer import TextTokenizer
from engine.row_invariance import PROMPTS, Setting, measure


def _score(target: Path, setting: Setting):
    (result,) = measure(target, [setting], list(PROMPTS), tokens=12, rows=(2, 8), chunks=(7, 32))
    return result


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rows_are_bit_identical_in_windows_batches_and_chunked_prefills(smollm2_target: Path,
                                                                        precision: str) -> None:
    result = _score(smollm2_target, Setting(precision, compile_properties("CPU", precision), row_mode("CPU")))
    layouts = {r.layout for r in result.layouts}
    assert {"window-2", "window-8", "batch-1", "batch-8", "prefill-8", "chunked-7", "chunked-32", "recompute-7",
            "recompute-32"} <= layouts
    for r in result.layouts:
        assert r.rows == 2 * 12
        assert r.max_abs_diff == 0.0 and r.equal_rows == r.rows, r


def test_calls_of_any_size_would_change_rows_where_the_target_caps_them(smollm2_target: Path) -> None:
    """Why the target keeps its calls small: told of no large call, it lets a window share one inference with a
    160-row prefill; on a CPU whose matmuls take another kernel past some number of rows (an AVX2 core: over
    80) the window's rows then differ from the decode's."""
    result = _score(smollm2_target, Setting("calls of any size", compile_properties("CPU", "default"),
                                            row_mode("CPU"), max_call_rows=0))
    (prefill,) = [r for r in result.layouts if r.layout == "prefill-8"]
    if prefill.max_abs_diff == 0.0:
        pytest.skip("this CPU computes a row alike in calls of up to 169 rows: nothing to show here")
    assert prefill.equal_rows < prefill.rows


def test_one_row_calls_take_another_kernel_in_plain_rows(smollm2_target: Path) -> None:
    """Why the rows are laid out: sent as they are, a one-row decode's logits differ from a window's."""
    result = _score(smollm2_target, Setting("plain rows", compile_properties("CPU", "default"), "plain"))
    windows = [r for r in result.layouts if r.layout.startswith("window-")]
    assert all(r.max_abs_diff > 0.0 and r.equal_rows < r.rows for r in windows), windows


def test_an_empty_sequence_picks_the_one_row_kernel_of_a_split_window(smollm2_target: Path) -> None:
    """A lone one-row sequence takes the context-split kernel; the same row beside a sequence with no
    rows takes the per-head one, which is also what a verify window's rows scored one by one take."""
    core = ov.Core()
    target = PagedTarget(smollm2_target, core, "CPU", compile_properties("CPU", "default"), num_blocks=16,
                         rows="plain")
    assert all_weights_compressed(core.read_model(smollm2_target / "openvino_model.xml"))
    assert not target.pad_matmul_rows  # plain rows: as they come, no dummy row
    ids = TextTokenizer(smollm2_target).encode(PROMPTS[0])
    p = len(ids)
    target.blocks.grow(0, p + 3)
    target.infer([SeqChunk(0, ids, 0, 0)])
    window = [ids[-1], 11, 12]

    def first_row(chunks: list[SeqChunk]) -> np.ndarray:
        return np.array(target.infer(chunks, want_logits=True).logits[0][0])

    lone = first_row([SeqChunk(0, window[:1], p, 1)])
    beside_empty = first_row([SeqChunk(0, window[:1], p, 1), SeqChunk(1, [], 0, 0)])
    split = first_row([SeqChunk(0, [t], p + j, 1) for j, t in enumerate(window)] + [SeqChunk(1, [], 0, 0)])
    multi = first_row([SeqChunk(0, window, p, 3)])
    if not target.one_row_matmul_differs:  # where one matmul row is not two's (AVX2), the rows differ there first
        assert np.array_equal(beside_empty, split)
    assert not np.array_equal(multi, beside_empty)
    if int(target.compiled.get_property("INFERENCE_NUM_THREADS")) > 1:  # one thread: one_bh for a lone row too
        assert not np.array_equal(lone, beside_empty)


def test_one_row_through_matmuls_without_dynamic_quantization_differs(smollm2_target: Path) -> None:
    """Why the f32 reference gets a dummy row: one row through its f32 matmuls is not a two-row call's row."""
    target = PagedTarget(smollm2_target, ov.Core(), "CPU", compile_properties("CPU", "f32"), num_blocks=8)
    assert target.pad_matmul_rows
    ids = TextTokenizer(smollm2_target).encode(PROMPTS[0])
    p = len(ids)
    target.blocks.grow(0, p + 2)
    target.infer([SeqChunk(0, ids, 0, 0)])

    def first_row(chunk: SeqChunk) -> np.ndarray:
        return np.array(target.infer([chunk], want_logits=True).logits[0][0])

    window = first_row(SeqChunk(0, [ids[-1], 7], p, 2, prompt_rows=0))
    assert np.array_equal(first_row(SeqChunk(0, ids[-1:], p, 1, prompt_rows=0)), window)
    target.pad_matmul_rows = False
    assert not np.array_equal(first_row(SeqChunk(0, ids[-1:], p, 1, prompt_rows=0)), window)
