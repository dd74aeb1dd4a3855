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
