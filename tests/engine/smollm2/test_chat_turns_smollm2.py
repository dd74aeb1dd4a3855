"""SmolLM2 at the default precision: a chat's next turn gives the same text with the prefix cache as
without it. The previous reply's ids come back in the next prompt; cached, their keys and values are
the ones its decode wrote (generated rows are scored one by one: engine/models/paged_target.py), so
uncached they are computed the same way, not as prompt rows (`_Request.spans`). Computed as prompt
rows, these two conversations' second turns differed from the cached ones (at tokens 2 and 7)."""
from __future__ import annotations

from pathlib import Path

from engine.bench.datasets import load_prompts
from engine.config import GenerationConfig
from engine.pipeline import SpeculativePipeline
from engine.scheduler import SchedulerConfig

CONFIG = GenerationConfig(max_new_tokens=64)


def _two_turns(pipe: SpeculativePipeline, question: str):
    msgs = [{"role": "user", "content": question}]
    first = pipe.generate(msgs, CONFIG)
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Now say it shorter."}]
    return first, pipe.generate(msgs, CONFIG)


def test_next_turn_equals_with_and_without_the_prefix_cache(smollm2_target: Path) -> None:
    prompts = load_prompts("mt-bench", 6)
    questions = [prompts[3].text, prompts[5].text]
    cached = SpeculativePipeline.load(smollm2_target, None, scheduler=SchedulerConfig(prefix_caching=True))
    plain = SpeculativePipeline.load(smollm2_target, None, scheduler=SchedulerConfig(prefix_caching=False))
    for q in questions:
        a1, a2 = _two_turns(cached, q)
        b1, b2 = _two_turns(plain, q)
        assert a1.token_ids == b1.token_ids
        assert a2.metrics.cached_tokens > 0 and b2.metrics.cached_tokens == 0
        assert a2.token_ids == b2.token_ids, f"{q[:40]!r}: the second turn differs with the prefix cache"
    reply = plain._finished[max(plain._finished)]
    start = len(reply.prompt_ids)
    assert reply.spans[-1] == (start, start + len(reply.token_ids))
    assert len(reply.spans) == 2  # the first reply, inside this prompt, and this reply
