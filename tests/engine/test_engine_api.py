"""engine/api.py: every engine has the Engine shape, describe() says what is loaded, load_engine picks the path."""
from __future__ import annotations

import pytest

from app.fake_engine import FakePipeline
from engine.api import Engine, load_engine
from engine.config import GenerationConfig
from engine.errors import DeviceError
from engine.models.draft import read_draft_info
from engine.pipeline import SpeculativePipeline


def test_the_paged_engine_describes_its_target_and_draft(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    draft = tiny_qwen3_drafts["b8_trained"]
    engine = load_engine(tiny_qwen3_target, draft, precision="f32")
    assert isinstance(engine, SpeculativePipeline) and isinstance(engine, Engine)
    d = engine.describe()
    info = read_draft_info(draft)
    assert (d.target, d.device, d.precision, d.backend) == (tiny_qwen3_target.name, "CPU", "f32", "paged")
    assert d.draft is not None and d.draft.name == draft.name and d.draft.variant == info.variant
    assert d.draft.max_candidates == info.max_candidates and d.default_num_candidates == info.default_candidates
    assert d.kv_cache_tokens == engine.kv_stats()["total_blocks"] * engine.kv_stats()["block_size"]
    # The API end to end: a request added, stepped to its end, its result and metrics read back.
    rid = engine.add_request("def add(a, b):", GenerationConfig(max_new_tokens=6, ignore_eos=True), chat=False)
    while engine.has_unfinished():
        engine.step()
    res = engine.result(rid)
    assert len(res.token_ids) == 6 and res.finish_reason == "length" and engine.metrics(rid) is res.metrics
    alone = load_engine(tiny_qwen3_target, None, precision="f32").describe()
    assert alone.draft is None and alone.default_num_candidates == 0


def test_npu_goes_to_the_openvino_genai_path_and_refuses_a_draft(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    with pytest.raises(DeviceError, match="continuous batching"):
        load_engine(tiny_qwen3_target, tiny_qwen3_drafts["b4_random"], device="NPU")
    # Without a draft it is openvino_genai's LLMPipeline that tries the device (none here, so it says so).
    with pytest.raises(DeviceError, match="openvino_genai could not load"):
        load_engine(tiny_qwen3_target, None, device="NPU.99")


def test_the_fake_engine_has_the_same_shape(tmp_path) -> None:
    fake = FakePipeline.load(tmp_path, tmp_path / "d8", draft_head_top_k=4, draft_variant="dspark")
    assert isinstance(fake, Engine)
    d = fake.describe()
    assert d.backend == "fake" and d.draft.variant == "dspark" and d.draft.has_head and d.draft.default_top_k == 4
    rid = fake.add_request("a b c", GenerationConfig(max_new_tokens=5))
    while fake.has_unfinished():
        fake.step()
    assert len(fake.result(rid).token_ids) == 5 and fake.result(rid).finish_reason == "length"
