"""A finished request keeps its result and metrics, and nothing else of its arrays (issue 20).

The tiny target's rows are small, so the memory is counted with tracemalloc (numpy's buffers are
traced) rather than RSS: each finished request used to keep its hidden rows, draft proposals and
logits processor, tens of KB here; the RSS bound on a real model is tests/engine/smollm2/test_request_memory_smollm2.py.
"""
from __future__ import annotations

import gc
import random
import tracemalloc
from pathlib import Path

import pytest

from engine.config import GenerationConfig
from engine.pipeline import SpeculativePipeline

ROUNDS = 300


@pytest.fixture(scope="module")
def pipe(tiny_qwen3_target: Path, tiny_qwen3_drafts: dict[str, Path]) -> SpeculativePipeline:
    return SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_random"])


def _round(pipe: SpeculativePipeline, rng: random.Random) -> int:
    cfg = GenerationConfig(max_new_tokens=rng.randint(4, 40), do_sample=rng.random() < 0.6,
                           temperature=rng.uniform(0.5, 1.5), top_k=rng.choice([0, 20]),
                           repetition_penalty=rng.choice([1.0, 1.2]), rng_seed=rng.randrange(2 ** 31))
    rid = pipe.add_request([rng.randrange(10, pipe.target.vocab_size) for _ in range(rng.choice((8, 40, 120)))], cfg)
    for _ in range(rng.randint(1, 3)):
        pipe.step()
    pipe.cancel(rid)
    while pipe.has_unfinished():
        pipe.step()
    return rid


def test_finished_requests_keep_no_arrays(pipe: SpeculativePipeline) -> None:
    rng = random.Random(7)
    for _ in range(20):  # warm-up: the draft's host KV capacity and every shape reached
        _round(pipe, rng)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(ROUNDS):
            _round(pipe, rng)
        gc.collect()
        per_request = (tracemalloc.get_traced_memory()[0] - before) / ROUNDS
    finally:
        tracemalloc.stop()
    # Metrics (a few floats per step), token ids and text: well under 4 KB a request.
    assert per_request < 4096, f"{per_request:.0f} bytes kept per finished request"


def test_results_and_metrics_outlive_the_request(pipe: SpeculativePipeline) -> None:
    cfg = GenerationConfig(max_new_tokens=12, do_sample=True, rng_seed=3)
    rid = pipe.add_request("def parse(text):\n    ", cfg)
    text = ""
    while pipe.has_unfinished():
        text += "".join(p.text for e in pipe.step() for p in e.pieces)
    done = pipe.result(rid)
    assert done.text == text and done.finish_reason in ("length", "eos") and len(done.token_ids) <= 12
    assert done.cumulative_logprob is not None and done.cumulative_logprob <= 0.0
    assert pipe.metrics(rid).generated_tokens == len(done.token_ids) == done.metrics.generated_tokens
    assert pipe.generate("def parse(text):\n    ", cfg).token_ids == done.token_ids, "same seed, same tokens"
    greedy = pipe.generate("def parse(text):\n    ", GenerationConfig(max_new_tokens=6))
    assert greedy.cumulative_logprob is None, "greedy on in-graph argmax ids has no logprob"
