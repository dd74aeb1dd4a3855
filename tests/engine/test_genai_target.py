"""The target alone through openvino_genai (the NPU path), exercised on CPU: same tokens, streamed, cancellable."""
from __future__ import annotations

import pytest

from engine.config import GenerationConfig
from engine.errors import DeviceError
from engine.genai_target import GenAITargetPipeline
from engine.pipeline import SpeculativePipeline

PROMPT = "import os\nclass Walker:\n"


def test_streams_the_same_greedy_tokens_as_the_engine(tiny_qwen3_target) -> None:
    genai = GenAITargetPipeline(tiny_qwen3_target, "CPU", "f32")
    ours = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")
    cfg = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    events = []
    got = genai.generate(PROMPT, cfg, chat=False, on_event=events.append)
    want = ours.generate(PROMPT, cfg, chat=False)
    assert got.token_ids == want.token_ids and got.text == want.text
    assert got.finish_reason == "length" and sum(len(e.tokens) for e in events) == 30
    assert got.metrics.tokens_per_step == 1.0 and got.metrics.ttft_ms > 0


def test_cancel_and_refusals(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    genai = GenAITargetPipeline(tiny_qwen3_target, "CPU")
    seen = []
    res = genai.generate(PROMPT, GenerationConfig(max_new_tokens=200, ignore_eos=True), chat=False,
                         on_event=lambda e: seen.append(e) or len(seen) == 3)
    assert res.finish_reason == "cancelled" and len(res.token_ids) == 3
    assert not genai.has_unfinished()
    with pytest.raises(ValueError, match="min_p"):
        genai.add_request(PROMPT, GenerationConfig(do_sample=True, min_p=0.1))
    with pytest.raises(DeviceError, match="continuous batching"):
        SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b4_random"], device="NPU")


def test_a_device_that_cannot_load_is_a_device_error(tiny_qwen3_target) -> None:
    with pytest.raises(DeviceError, match="could not load .* on NOSUCHDEVICE.*choose CPU"):
        GenAITargetPipeline(tiny_qwen3_target, "NOSUCHDEVICE")


def test_a_queued_request_cancelled_ends_with_an_event_like_the_engine(tiny_qwen3_target) -> None:
    """Cancelling a request still in the queue ends it at the next step() with a "cancelled" event."""
    genai = GenAITargetPipeline(tiny_qwen3_target, "CPU")
    cfg = GenerationConfig(max_new_tokens=4, ignore_eos=True)
    first, queued = genai.add_request(PROMPT, cfg, chat=False), genai.add_request(PROMPT, cfg, chat=False)
    genai.step()  # starts the first request
    assert genai.last_step.requests == [first]
    genai.cancel(queued)
    events = genai.step()
    assert [(e.request_id, e.finish_reason) for e in events] == [(queued, "cancelled")]
    ends = []
    while genai.has_unfinished():
        ends += [e for e in genai.step() if e.finished]
    assert [(e.request_id, e.finish_reason) for e in ends] == [(first, "length")]
