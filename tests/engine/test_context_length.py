"""A target's context length: known from its config.json, checked before any work, and a chat fitted into it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import GenerationConfig
from engine.context import check_fits_context, context_length, fit_chat
from engine.errors import ContextLengthError


@pytest.mark.parametrize("config,want", [
    ({"max_position_embeddings": 8192}, 8192),
    ({"n_positions": 1024, "vocab_size": 50257}, 1024),  # GPT-2
    ({"seq_length": 32768}, 32768),
    ({"text_config": {"max_position_embeddings": 131072}}, 131072),  # a multimodal wrapper
    ({"max_position_embeddings": True}, None),
    ({"max_position_embeddings": "8192"}, None),
    ({}, None),
])
def test_context_length_from_config(config, want) -> None:
    assert context_length(config) == want


def test_check_says_the_numbers_and_the_fix() -> None:
    check_fits_context(8000, 192, 8192, "M")  # exactly full: fine
    check_fits_context(10 ** 6, 10, None, "M")  # unknown context: nothing to check
    with pytest.raises(ContextLengthError) as e:
        check_fits_context(8000, 256, 8192, "M")
    msg = str(e.value)
    assert "8,000 tokens" in msg and "256" in msg and "8,256" in msg and "8,192" in msg
    assert "192 or less" in msg and "64 tokens" in msg  # lower max_new_tokens to 192, or shorten by 64
    with pytest.raises(ContextLengthError, match=r"The prompt is 20,000 tokens, longer than M's context of 8,192.*"
                                                 r"shorten it by at least 11,936 tokens \(to 8,064"):
        check_fits_context(20000, 128, 8192, "M")
    with pytest.raises(ContextLengthError, match=r"max_new_tokens=9,000 alone is more than"):
        check_fits_context(10, 9000, 8192, "M")
    assert issubclass(ContextLengthError, ValueError), "callers that refuse bad settings by ValueError refuse it too"


def _conversation(turns: int, words: int = 10) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "sys " * 5}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"q{i} " + "w " * words},
                 {"role": "assistant", "content": f"a{i} " + "w " * words}]
    return msgs + [{"role": "user", "content": "last question"}]


def _count(msgs) -> int:  # one token per word plus 3 per message (the template's role markers)
    return sum(len(m["content"].split()) + 3 for m in msgs)


def test_fit_chat_drops_the_fewest_oldest_turns() -> None:
    msgs = _conversation(6)
    full = _count(msgs)
    assert fit_chat(msgs, _count, full + 10, 10) == (msgs, 0)
    for context in range(full + 9, 0, -7):
        kept, dropped = fit_chat(msgs, _count, context, 10)
        assert kept[0] == msgs[0] and kept[-1] == msgs[-1], "the system prompt and the newest turn stay"
        assert kept[1]["role"] == "user"
        assert kept == msgs[:1] + msgs[1 + 2 * dropped:]
        if dropped < 6:
            assert _count(kept) + 10 <= context
        if dropped > 0:  # one turn fewer dropped would not fit
            assert _count(msgs[:1] + msgs[1 + 2 * (dropped - 1):]) + 10 > context
    assert fit_chat(msgs, _count, 5, 10)[1] == 6, "even the newest turn alone does not fit: all older ones go"
    assert fit_chat(msgs, _count, None, 10) == (msgs, 0), "no known context: nothing dropped"


def test_fit_chat_keeps_a_turn_whole() -> None:
    msgs = [{"role": "user", "content": "a " * 50}, {"role": "assistant", "content": "b " * 50},
            {"role": "assistant", "content": "c " * 50}, {"role": "user", "content": "next"}]
    kept, dropped = fit_chat(msgs, _count, 50, 8)
    assert dropped == 1 and kept == msgs[3:], "a user message and all the replies after it go together"


# ---- through the pipeline (the tiny Qwen3 target: max_position_embeddings 4096) --------------------
@pytest.fixture(scope="module")
def pipe(tiny_qwen3_target: Path):
    from engine.pipeline import SpeculativePipeline

    return SpeculativePipeline.load(tiny_qwen3_target)


def test_pipeline_knows_the_context_and_refuses_before_any_step(pipe, tiny_qwen3_target) -> None:
    assert pipe.context_length == json.loads((tiny_qwen3_target / "config.json").read_text())["max_position_embeddings"]
    ids = pipe.encode_prompt("hello there", chat=False)
    with pytest.raises(ContextLengthError, match="context of 4,096 tokens"):
        pipe.add_request(ids * (5000 // len(ids)), GenerationConfig(max_new_tokens=8))
    with pytest.raises(ContextLengthError, match=r"lower max_new_tokens \(--max-new-tokens\) to "):
        pipe.add_request(ids, GenerationConfig(max_new_tokens=4096 - len(ids) + 1))
    assert not pipe.has_unfinished(), "nothing was queued"
    rid = pipe.add_request(ids, GenerationConfig(max_new_tokens=4096 - len(ids)))  # exactly full: accepted
    pipe.cancel(rid)
    while pipe.has_unfinished():
        pipe.step()


def test_pipeline_fit_chat_with_the_real_template(pipe) -> None:
    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(40):
        msgs += [{"role": "user", "content": f"Question {i}: " + "tell me about lists " * 12},
                 {"role": "assistant", "content": f"Answer {i}: " + "lists hold items " * 12}]
    msgs.append({"role": "user", "content": "And tuples?"})
    max_new = 64
    assert len(pipe.encode_prompt(msgs)) + max_new > pipe.context_length, "the conversation outgrew the context"
    kept, dropped = pipe.fit_chat(msgs, max_new)
    assert 0 < dropped < 40 and kept[0] == msgs[0] and kept[-1] == msgs[-1]
    assert len(pipe.encode_prompt(kept)) + max_new <= pipe.context_length
    one_more = msgs[:1] + msgs[1 + 2 * (dropped - 1):]
    assert len(pipe.encode_prompt(one_more)) + max_new > pipe.context_length
    rid = pipe.add_request(kept, GenerationConfig(max_new_tokens=max_new))  # and it runs
    pipe.cancel(rid)
    while pipe.has_unfinished():
        pipe.step()


def test_kv_cache_too_small_says_the_option_that_fixes_it(tiny_qwen3_target) -> None:
    from engine.pipeline import SpeculativePipeline
    from engine.scheduler import SchedulerConfig

    small = SpeculativePipeline.load(tiny_qwen3_target, scheduler=SchedulerConfig(cache_size_mb=1))
    held = small.target.blocks.num_blocks * small.target.blocks.block_size
    ids = small.encode_prompt("hello", chat=False)
    assert held + 100 < small.context_length, "the cache, not the context, is what is too small here"
    with pytest.raises(ContextLengthError) as e:
        small.add_request(ids, GenerationConfig(max_new_tokens=held + 100))
    msg = str(e.value)
    assert f"the KV cache holds {held:,} tokens" in msg and "num_kv_blocks" not in msg
    mb = int(msg.split("--cache-size-mb ")[1].split()[0])
    assert mb > 1
    big = SpeculativePipeline.load(tiny_qwen3_target, scheduler=SchedulerConfig(cache_size_mb=mb))
    rid = big.add_request(ids, GenerationConfig(max_new_tokens=held + 100))  # the suggested size is enough
    big.cancel(rid)
    while big.has_unfinished():
        big.step()
    in_blocks = SpeculativePipeline.load(tiny_qwen3_target, scheduler=SchedulerConfig(num_kv_blocks=2))
    with pytest.raises(ContextLengthError, match=r"num_kv_blocks=\d+ \(bench --num-kv-blocks"):
        in_blocks.add_request(ids, GenerationConfig(max_new_tokens=100))
