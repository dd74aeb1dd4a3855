"""The paged target keeps each inference within `call_rows` rows: a step's chunks that would make a larger
call are spread over several, a long chunk split in order, with the same outputs as one call where the
kernels agree (the tiny fp32 target: close, not bit-identical, as its one-row matmuls take another kernel)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from engine.models.paged_target import PagedTarget, SeqChunk
from engine.models.properties import compile_properties

PROMPT = list(range(40, 63))  # 23 prompt rows
WINDOW = [70, 71, 72]


@pytest.fixture(scope="module")
def target(tiny_qwen3_target: Path) -> PagedTarget:
    return PagedTarget(tiny_qwen3_target, ov.Core(), "CPU", compile_properties("CPU", "f32"), tap_layers=[1, 2],
                       num_blocks=32)


def _step(target: PagedTarget, call_rows: int | None) -> tuple[object, int]:
    """Sequence 0 verifies a 3-row window after its prompt, sequence 1 prefills its prompt, in one step."""
    target.call_rows = call_rows
    for seq in (0, 1):
        target.blocks.release(seq)
        target.blocks.grow(seq, len(PROMPT) + len(WINDOW))
    target.call_rows = None
    target.infer([SeqChunk(0, PROMPT, 0, 0)])
    target.call_rows = call_rows
    before = target.inferences
    out = target.infer([SeqChunk(0, WINDOW, len(PROMPT), len(WINDOW), prompt_rows=0), SeqChunk(1, PROMPT, 0, 1)],
                       want_logits=True)
    copies = [[None if x is None else np.array(x) for x in part] for part in (out.next_ids, out.logits, out.hidden)]
    return copies, target.inferences - before


def _assert_same(whole, split) -> None:
    for a, b in zip(whole, split):
        for x, y in zip(a, b):
            assert x.shape == y.shape
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)
    assert [list(x) for x in whole[0]] == [list(x) for x in split[0]]  # the same next ids per row


def test_a_step_over_call_rows_is_split_in_order_with_the_same_outputs(target: PagedTarget) -> None:
    whole, calls = _step(target, None)
    assert calls == 1
    split, calls = _step(target, 8)  # 26 rows: the prompt in 7-row parts (room for a padding row), after the
    assert calls == 5  # window, which a 7-row part would take past 8 rows
    _assert_same(whole, split)
    split, calls = _step(target, 24)  # the prompt fits one call, the window beside it would not
    assert calls == 2
    _assert_same(whole, split)


def test_a_chunk_with_prompt_and_generated_rows_runs_its_prompt_rows_first(target: PagedTarget) -> None:
    target.call_rows = None
    target.blocks.release(2)
    target.blocks.grow(2, len(PROMPT) + len(WINDOW))
    before = target.inferences
    out = target.infer([SeqChunk(2, PROMPT + WINDOW, 0, len(WINDOW) + 1, prompt_rows=len(PROMPT))])
    assert target.inferences - before == 2
    assert out.next_ids[0].shape == (len(WINDOW) + 1,) and out.hidden[0].shape[0] == len(PROMPT) + len(WINDOW)


@pytest.mark.parametrize(("switch", "expected", "expected_48"),
                         [(None, None, None), (200, 64, None), (80, 64, None), (40, 32, 24), (3, 2, 3)])
def test_the_call_limit_is_the_largest_call_whose_rows_agree(target: PagedTarget, monkeypatch, switch, expected,
                                                             expected_48) -> None:
    """The load-time probe: no limit where a row beside the caller's largest call is the same as alone (an
    AVX-512 VNNI core), else CALL_ROWS (64) or the largest halving of it that agrees (an AVX2 core switches
    kernels past 80 rows). A fake probe row stands in for a CPU whose kernels switch past `switch` rows."""
    seen: list[int] = []

    def probe(beside: list[SeqChunk]) -> np.ndarray:
        rows = 1 + sum(len(c.ids) for c in beside)
        seen.append(rows)
        return np.array([1.0 if switch is not None and rows > switch else 0.0])

    monkeypatch.setattr(target, "_probe_row", probe)
    assert target._call_row_limit(264) == expected
    assert seen[:2] == [1, 264]  # alone, then the largest call first
    assert target._call_row_limit(48) == expected_48  # a caller whose largest call is under CALL_ROWS
    assert target.blocks.blocks(-2) == [] and target.blocks.blocks(-3) == []  # the probe's blocks are given back
