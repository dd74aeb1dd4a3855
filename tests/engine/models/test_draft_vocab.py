"""A draft's sub-vocabulary (engine/models/draft_vocab.py): the lm_head scores only its tokens.

What must hold: the sliced lm_head gives exactly the full logits' columns, no candidate is ever
outside the set, greedy output still equals the target alone's (f32, tests/engine/test_pipeline.py), a bad
file is refused naming the fix, and the file travels from a checkpoint through the export.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from engine.cli import main as cli_main
from engine.config import GenerationConfig
from engine.errors import ModelFolderError
from engine.models.draft import check_draft_fits
from engine.models.draft_vocab import VOCAB_FILE, read_draft_vocabulary, slice_rows
from engine.models.target import _lm_head
from engine.pipeline import SpeculativePipeline
from fixtures.tiny_drafts import TRAIN_PROMPTS

PROMPTS = list(TRAIN_PROMPTS[:3])
CFG = GenerationConfig(max_new_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(tiny_qwen3_target: Path) -> SpeculativePipeline:
    return SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")


@pytest.fixture(scope="module")
def vocab_size(tiny_qwen3_target: Path) -> int:
    model = ov.Core().read_model(tiny_qwen3_target / "openvino_model.xml")
    return int(model.output("logits").get_partial_shape()[2].get_length())


@pytest.fixture(scope="module")
def answer_ids(alone: SpeculativePipeline) -> list[list[int]]:
    """The target's own greedy answers: what a sub-vocabulary is counted from."""
    return [alone.generate(p, CFG, chat=False).token_ids for p in PROMPTS]


def _with_vocabulary(src: Path, dst: Path, ids) -> Path:
    shutil.copytree(src, dst)
    (dst / VOCAB_FILE).write_text(json.dumps({"ids": [int(i) for i in ids]}), encoding="utf-8")
    return dst


def _u8_head(vocab: int, hidden: int) -> ov.Output:
    """An lm_head weight in the form optimum-intel's int8 export gives it: u8 rows, zero points, f16 scales."""
    rng = np.random.default_rng(2)
    w = ops.convert(ops.constant(rng.integers(0, 255, (vocab, hidden)).astype(np.uint8)), ov.Type.f16)
    zp = ops.convert(ops.constant(rng.integers(100, 150, (vocab, 1)).astype(np.uint8)), ov.Type.f16)
    scale = ops.constant((rng.random((vocab, 1)) * 0.01).astype(np.float16))
    return ops.convert(ops.multiply(ops.subtract(w, zp), scale), ov.Type.f32).output(0)


@pytest.mark.parametrize("form", ["tiny target", "u8 compressed"])
def test_sliced_lm_head_gives_exactly_the_full_columns(tiny_qwen3_target: Path, vocab_size: int, form: str) -> None:
    core = ov.Core()
    head = _lm_head(core.read_model(tiny_qwen3_target / "openvino_model.xml"))
    hidden = head.input_value(0).get_partial_shape()[2].get_length()
    weight, tb = ((head.input_value(1), head.get_attributes()["transpose_b"]) if form == "tiny target"
                  else (_u8_head(vocab_size, hidden), True))
    ids = np.sort(np.random.default_rng(0).choice(vocab_size, vocab_size // 3, replace=False))
    x = ops.parameter([2, hidden], ov.Type.f32, name="x")
    sliced = slice_rows(weight, ids, vocab_size)
    assert sliced is not None
    model = ov.Model([ops.result(ops.matmul(x, weight, False, tb)), ops.result(ops.matmul(x, sliced, False, tb))], [x])
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    out = compiled(np.random.default_rng(1).standard_normal((2, hidden)).astype(np.float32))
    np.testing.assert_allclose(out[0][:, ids], out[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("head_bits", [8, 4])
def test_greedy_output_unchanged_and_candidates_stay_inside(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts,
                                                            alone, answer_ids, vocab_size, head_bits) -> None:
    """Also with the rows stored as int4 (config.json "lm_head_bits": 4, engine/models/int4_head.py)."""
    counts = np.bincount(np.concatenate(answer_ids), minlength=vocab_size)
    ids = np.flatnonzero(counts)[:-3]  # leave out a few answer tokens: they can no longer be drafted
    draft = _with_vocabulary(tiny_qwen3_drafts["b8_trained"], tmp_path / "with-vocab", ids)
    if head_bits == 4:
        config = json.loads((draft / "config.json").read_text(encoding="utf-8"))
        (draft / "config.json").write_text(json.dumps({**config, "lm_head_bits": 4}), encoding="utf-8")
    assert check_draft_fits(tiny_qwen3_target, draft) == []
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    assert pipe.draft.info.head_bits == head_bits
    np.testing.assert_array_equal(pipe.draft.vocabulary, np.sort(ids))
    allowed = set(int(i) for i in ids)
    accepted = 0
    for prompt, want in zip(PROMPTS, answer_ids):
        rid = pipe.add_request(prompt, CFG, chat=False)
        while pipe.has_unfinished():
            for ev in pipe.step():
                assert set(ev.drafted) <= allowed, ev.drafted
                accepted += ev.accepted
        assert pipe.result(rid).token_ids == want
    assert accepted > len(PROMPTS)  # the trained draft still gets accepted


def test_sampled_drafts_stay_inside_the_vocabulary(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts, vocab_size) -> None:
    ids = np.arange(0, vocab_size, 2)
    draft = _with_vocabulary(tiny_qwen3_drafts["b8_trained"], tmp_path / "even", ids)
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    cfg = CFG.copy(do_sample=True, temperature=1.0, rng_seed=3)
    rid = pipe.add_request(PROMPTS[0], cfg, chat=False)
    drafted = []
    while pipe.has_unfinished():
        for ev in pipe.step():
            drafted += ev.drafted
    assert drafted and all(t % 2 == 0 for t in drafted)
    assert len(pipe.result(rid).token_ids) == CFG.max_new_tokens


@pytest.mark.parametrize("content,why", [
    ("not json", "is not a draft vocabulary"),
    (json.dumps({"ids": [1, 1, 2]}), "distinct token ids"),
    (json.dumps({"ids": [10 ** 6]}), "below the target's vocabulary size"),
])
def test_a_bad_vocabulary_file_is_refused_with_the_fix(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts, content,
                                                       why) -> None:
    draft = tmp_path / "bad"
    shutil.copytree(tiny_qwen3_drafts["b8_trained"], draft)
    (draft / VOCAB_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(ModelFolderError, match=why):
        read_draft_vocabulary(draft, 768)
    reasons = check_draft_fits(tiny_qwen3_target, draft)
    assert len(reasons) == 1 and why in reasons[0] and "dflash-studio draft-vocab" in reasons[0]


def test_cli_writes_the_most_frequent_tokens_and_export_carries_them(tmp_path, tiny_qwen3_drafts, answer_ids,
                                                                     vocab_size) -> None:
    from engine.export.draft import export_draft

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_qwen3_drafts["b8_trained"].with_name("b8_trained-ckpt"), ckpt)
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"answer": a}) + "\n" for a in answer_ids), encoding="utf-8")
    assert cli_main(["draft-vocab", "--draft", str(ckpt), "--answers", str(answers), "--size", "5",
                     "--vocab-size", str(vocab_size)]) == 0
    record = json.loads((ckpt / VOCAB_FILE).read_text())
    ids = read_draft_vocabulary(ckpt, vocab_size)
    counts = np.bincount(np.concatenate(answer_ids), minlength=vocab_size)
    assert len(ids) == 5 and min(counts[ids]) >= np.sort(counts)[-5]
    assert record["coverage"] == pytest.approx(counts[ids].sum() / counts.sum())
    with pytest.raises(ModelFolderError, match="another tokenizer"):
        read_draft_vocabulary(ckpt, vocab_size + 1)  # the bitmap form knows its vocabulary size
    out = export_draft(ckpt, tmp_path / "ir")
    np.testing.assert_array_equal(read_draft_vocabulary(out, vocab_size), ids)
    assert cli_main(["draft-vocab", "--draft", str(ckpt), "--answers", str(answers), "--size", "0",
                     "--vocab-size", str(vocab_size)]) == 2  # a size of 0 is refused with a message
