"""The engine's core promise: greedy speculative output equals the target's own, token for token.

The exactness tests run at the f32 reference (f32 inference, f32 KV cache, no dynamic
quantization); the main ones also at the default precision, which is row-invariant on CPU too
(docs/engine.md "Row invariance").
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from engine.config import GenerationConfig
from engine.errors import DraftMismatchError, ModelFolderError
from engine.pipeline import SpeculativePipeline

PROMPTS = ["def parse(text):\n    ", "import os\nclass Walker:\n", "The quick brown fox", "for i in range(10):"]
CHAT = [{"role": "user", "content": "Write a loop over a list."}]


def _alone(target: Path, precision: str = "f32") -> SpeculativePipeline:
    return SpeculativePipeline.load(target, None, precision=precision)


@pytest.fixture(scope="module")
def qwen_alone(tiny_qwen3_target: Path) -> SpeculativePipeline:
    return _alone(tiny_qwen3_target)


@pytest.mark.parametrize("precision", ["default", "f32"])
@pytest.mark.parametrize("target_name", ["qwen3", "llama"])
def test_greedy_speculative_equals_target_alone_for_every_draft(request, target_name: str, precision: str) -> None:
    target = request.getfixturevalue(f"tiny_{target_name}_target")
    drafts = request.getfixturevalue(f"tiny_{target_name}_drafts")
    alone = _alone(target, precision)
    cfg = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    reference = [alone.generate(p, cfg, chat=False).token_ids for p in PROMPTS]
    assert all(len(r) == 48 for r in reference)
    for name, draft in drafts.items():
        spec = SpeculativePipeline.load(target, draft, precision=precision)
        for prompt, ref in zip(PROMPTS, reference):  # requests one after another in one pipeline
            out = spec.generate(prompt, cfg, chat=False)
            assert out.token_ids == ref, f"draft {name} diverged on {prompt!r}"
            assert out.metrics.target_steps + 1 <= len(ref)


@pytest.mark.parametrize("precision", ["default", "f32"])
def test_num_assistant_tokens_below_block_stays_exact(tiny_qwen3_target, tiny_qwen3_drafts, precision: str) -> None:
    qwen_alone = _alone(tiny_qwen3_target, precision)
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision=precision)
    for k in (1, 3, 7):
        cfg = GenerationConfig(max_new_tokens=40, num_assistant_tokens=k, ignore_eos=True)
        ref = qwen_alone.generate(PROMPTS[0], cfg.copy(num_assistant_tokens=None), chat=False).token_ids
        out = spec.generate(PROMPTS[0], cfg, chat=False)
        assert out.token_ids == ref
        assert len(out.metrics.position_verified) <= k and out.metrics.drafted_total <= k * out.metrics.windows


def test_trained_draft_is_accepted_and_random_is_not(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    cfg = GenerationConfig(max_new_tokens=64, ignore_eos=True)
    trained = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32")
    random = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_random"], precision="f32")
    mt = trained.generate(PROMPTS[1], cfg, chat=False).metrics
    mr = random.generate(PROMPTS[1], cfg, chat=False).metrics
    assert mt.tokens_per_step > 1.3, mt.as_dict()
    assert mt.tokens_per_step > mr.tokens_per_step
    # tokens per step is exactly accepted drafts + one target token per verification step
    assert mt.decode_tokens <= mt.accepted_total + mt.target_steps
    # acceptance by position never rises with depth (a position is only checked after all before it passed)
    by_pos = mt.acceptance_by_position
    assert all(a >= b - 1e-9 for a, b in zip(by_pos, by_pos[1:]))


def test_events_stream_the_whole_text_and_mark_drafted_tokens(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32")
    events = []
    res = spec.generate(PROMPTS[1], GenerationConfig(max_new_tokens=64, ignore_eos=True), chat=False,
                        on_event=events.append)
    assert "".join(e.text for e in events) == res.text
    assert [t for e in events for t in e.tokens] == res.token_ids
    assert events[0].step == 0 and events[0].accepted == 0 and len(events[0].tokens) == 1
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert any(p.from_draft for e in events for p in e.pieces)
    for e in events[1:]:
        assert len(e.tokens) == min(e.accepted + 1, len(e.tokens)) and e.tokens[: e.accepted] == e.drafted[: e.accepted]
        assert e.timings.target_ms > 0
        # the draft ran for every window with candidates (one step from max_new_tokens there is room for none)
        assert e.timings.draft_model_ms > 0 or not e.drafted


def test_target_alone_equals_openvino_genai(tiny_qwen3_target, qwen_alone) -> None:
    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(str(tiny_qwen3_target), "CPU", INFERENCE_PRECISION_HINT="f32",
                                KV_CACHE_PRECISION="f32")
    for prompt in PROMPTS[:2]:
        ids = qwen_alone.encode_prompt(prompt, chat=False)
        cfg = ov_genai.GenerationConfig(max_new_tokens=40)
        cfg.ignore_eos = True
        theirs = [int(t) for t in pipe.generate(ov.Tensor(np.array([ids], np.int64)), cfg).tokens[0]]
        ours = qwen_alone.generate(ids, GenerationConfig(max_new_tokens=40, ignore_eos=True)).token_ids
        assert ours == theirs


def test_draft_runs_in_openvino_genai_dflash_with_same_text_and_steps(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    """Interop: our exported draft in openvino_genai's own DFlash gives our text and our step count."""
    import openvino_genai as ov_genai

    draft = tiny_qwen3_drafts["b8_trained"]
    props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    sc = ov_genai.SchedulerConfig()
    sc.enable_prefix_caching = False
    pipe = ov_genai.LLMPipeline(str(tiny_qwen3_target), "CPU", scheduler_config=sc,
                                draft_model=ov_genai.draft_model(str(draft), "CPU", **props), **props)
    ours = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    ids = ours.encode_prompt(PROMPTS[1], chat=False)
    cfg = ov_genai.GenerationConfig(max_new_tokens=48)
    cfg.num_assistant_tokens = 7
    cfg.ignore_eos = True
    res = pipe.generate(ov.Tensor(np.array([ids], np.int64)), cfg)
    theirs = [int(t) for t in res.tokens[0]]
    their_steps = len(res.extended_perf_metrics.main_model_metrics.raw_metrics.m_durations)
    out = ours.generate(ids, GenerationConfig(max_new_tokens=48, num_assistant_tokens=7, ignore_eos=True,
                                              draft_policy="always"))  # theirs verifies every candidate
    assert out.token_ids == theirs
    assert out.metrics.target_steps + 1 == their_steps  # + 1: their count includes the prefill


def test_stop_string_and_eos_and_cancel(tiny_qwen3_target, tiny_qwen3_drafts, qwen_alone) -> None:
    full = qwen_alone.generate(PROMPTS[1], GenerationConfig(max_new_tokens=48, ignore_eos=True), chat=False).text
    stop = full[20:24]
    assert stop and full.find(stop) >= 20 - 4
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32")
    cut = spec.generate(PROMPTS[1], GenerationConfig(max_new_tokens=48, ignore_eos=True, stop_strings=[stop]),
                        chat=False)
    assert cut.finish_reason == "stop" and cut.text == full[: full.find(stop)]
    keep = spec.generate(PROMPTS[1], GenerationConfig(max_new_tokens=48, ignore_eos=True, stop_strings=[stop],
                                                      include_stop_str_in_output=True), chat=False)
    assert keep.text == full[: full.find(stop) + len(stop)]
    # cancel after the second event: the request ends at once, "cancelled", and the pipeline serves the next
    seen = []
    res = spec.generate(PROMPTS[1], GenerationConfig(max_new_tokens=48), chat=False,
                        on_event=lambda e: seen.append(e) or len(seen) == 2)
    assert res.finish_reason == "cancelled" and len(seen) == 3
    assert res.metrics.target_steps == 1  # the prefill is not a step; the cancellation ran none
    again = spec.generate(PROMPTS[1], GenerationConfig(max_new_tokens=48, ignore_eos=True), chat=False)
    assert again.text == full


def test_eos_ends_generation_without_emitting_it(tiny_qwen3_target, qwen_alone) -> None:
    ids = qwen_alone.generate(PROMPTS[2], GenerationConfig(max_new_tokens=30, ignore_eos=True), chat=False).token_ids
    stop_at = ids[5]
    out = qwen_alone.generate(PROMPTS[2], GenerationConfig(max_new_tokens=30, stop_token_ids={stop_at}), chat=False)
    assert out.finish_reason == "eos" and out.token_ids == ids[: ids.index(stop_at)]
    assert out.metrics.tokens_per_step == 1.0  # the step that produced the stop token counts it
    assert out.metrics.target_steps == len(out.token_ids)  # prefill excluded, the stop step included


def test_chat_messages_use_the_template(qwen_alone) -> None:
    ids = qwen_alone.encode_prompt(CHAT)
    text = qwen_alone.tokenizer.decode(ids)
    assert "Write a loop" in text
    assert ids == qwen_alone.encode_prompt(CHAT[0]["content"], chat=True)
    assert ids != qwen_alone.encode_prompt(CHAT[0]["content"], chat=False)


def test_draft_that_does_not_fit_is_refused_with_reasons(tmp_path, tiny_qwen3_target, tiny_qwen3_hf) -> None:
    from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint
    from engine.export.draft import export_draft

    cfg = json.loads((tiny_qwen3_hf / "config.json").read_text())
    deep = random_draft_config(dict(cfg, num_hidden_layers=12), 1, 4, [1, 9], 3)  # taps layer 9 of a 4-layer target
    narrow = random_draft_config(dict(cfg, hidden_size=32, head_dim=8, intermediate_size=64), 1, 4, [1, 2], 3)
    narrow["vocab_size"] = cfg["vocab_size"] + 5
    folders = {}
    for name, dcfg in {"deep": deep, "narrow": narrow}.items():
        ckpt = save_checkpoint(DFlashV1Draft(dcfg), dcfg, tmp_path / f"{name}-hf")
        folders[name] = export_draft(ckpt, tmp_path / f"{name}-ov")
    with pytest.raises(DraftMismatchError, match=r"Layer ids.*\[9\]"):
        SpeculativePipeline.load(tiny_qwen3_target, folders["deep"], precision="f32")
    with pytest.raises(DraftMismatchError) as err:
        SpeculativePipeline.load(tiny_qwen3_target, folders["narrow"], precision="f32")
    assert "Hidden size" in str(err.value) and "Vocabulary" in str(err.value)
    with pytest.raises(ModelFolderError, match="lacks openvino_model.bin"):
        (folders["deep"] / "openvino_model.bin").unlink()
        SpeculativePipeline.load(tiny_qwen3_target, folders["deep"], precision="f32")
    with pytest.raises(ModelFolderError, match="not a DFlash draft"):
        SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_target, precision="f32")


def test_bad_settings_are_refused_naming_the_field(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b4_random"], precision="f32")
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        spec.add_request("x", GenerationConfig(num_assistant_tokens=4))  # block 4 proposes 3
    with pytest.raises(ValueError, match="max_new_tokens"):
        spec.add_request("x", GenerationConfig(max_new_tokens=0))
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        GenerationConfig(num_assistant_tokens=101).validate()
    with pytest.raises(ValueError, match="precision"):
        SpeculativePipeline.load(tiny_qwen3_target, None, precision="bf8")


def test_draft_state_compaction_keeps_output_exact(monkeypatch, tiny_qwen3_target, tiny_qwen3_drafts,
                                                  qwen_alone) -> None:
    """Padding slots of the batched draft state are masked, then compacted away; neither may change a token."""
    from engine.drafting.draft_batch import DraftBatch
    from engine.models.draft import DraftModel

    monkeypatch.setattr(DraftModel, "KV_ON_HOST", False)  # the stateful path is the one that compacts
    monkeypatch.setattr(DraftBatch, "COMPACT_MIN_SLOTS", 4)
    monkeypatch.setattr(DraftBatch, "COMPACT_RATIO", 0.0)
    cfg = GenerationConfig(max_new_tokens=64, ignore_eos=True)
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32")
    rids = [spec.add_request(PROMPTS[0], cfg, chat=False)]
    for _ in range(6):
        spec.step()
    rids.append(spec.add_request(PROMPTS[1], cfg, chat=False))  # joins later: the first row gets its padding
    while spec.has_unfinished():
        spec.step()
    for prompt, rid in zip(PROMPTS[:2], rids):
        assert spec.result(rid).token_ids == qwen_alone.generate(prompt, cfg, chat=False).token_ids
    assert spec.drafts.compactions > 0 and not spec.drafts.serial


def test_draft_config_sets_the_default_candidates(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts, qwen_alone) -> None:
    """A draft's config.json "num_assistant_tokens" is its tuned default: what `always` drafts, and what
    `adaptive` drafts beside other requests or for a sampled one; one greedy request alone under `adaptive` drafts
    the whole block (the cut). A request may still ask for more."""
    import shutil

    folder = tmp_path / "tuned"
    shutil.copytree(tiny_qwen3_drafts["b8_trained"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_assistant_tokens=2)))
    spec = SpeculativePipeline.load(tiny_qwen3_target, folder, precision="f32")
    assert spec.default_num_candidates == 2 and spec.draft.info.max_candidates == 7
    always = GenerationConfig(max_new_tokens=24, ignore_eos=True, draft_policy="always")
    out = spec.generate(PROMPTS[1], always, chat=False)
    assert len(out.metrics.position_verified) == 2
    out = spec.generate(PROMPTS[1], always.copy(num_assistant_tokens=5), chat=False)
    assert len(out.metrics.position_verified) == 5
    adaptive = always.copy(draft_policy="adaptive")
    events = []
    spec.generate(PROMPTS[1], adaptive, chat=False, on_event=events.append)
    proposed = [e.window_proposed for e in events if e.window_proposed]
    assert proposed[0] == 7 and set(proposed[:-1]) == {7}  # the last window stops at max_new_tokens
    events = []
    spec.generate(PROMPTS[1], adaptive.copy(do_sample=True, temperature=0.8), chat=False, on_event=events.append)
    assert max(e.window_proposed for e in events) == 2  # at most: the policy's draft cap may ask for fewer
    rids = [spec.add_request(p, adaptive, chat=False) for p in PROMPTS[:2]]
    together = []
    while spec.has_unfinished():
        events = spec.step()
        if len(spec.last_step.requests) == 2:
            together += [e.window_proposed for e in events if e.window_proposed]
    assert together and max(together) == 2
    assert [spec.result(r).token_ids for r in rids] == [qwen_alone.generate(p, adaptive, chat=False).token_ids
                                                          for p in PROMPTS[:2]]
