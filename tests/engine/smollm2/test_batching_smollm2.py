"""SmolLM2 (the embedded default) with its shipped default draft under continuous batching: real
prompts arriving at different steps, a small token budget that splits validation windows, and a
KV cache small enough to preempt; each request's greedy output equals its output alone, at both
shipped precisions (rows do not depend on their neighbours: docs/engine.md "Row invariance")."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from engine.config import GenerationConfig
from engine.models.draft import read_draft_info
from engine.models.properties import PRECISIONS
from engine.pipeline import SpeculativePipeline
from engine.scheduler import SchedulerConfig

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain recursion in one sentence.",
    "Give me three tips for writing clear emails.",
    "What does a compiler do?",
]
CONFIG = GenerationConfig(max_new_tokens=32)


@pytest.fixture(scope="module")
def default_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped default draft (resources/drafts/DEFAULT), exported as `prepare` exports it."""
    from engine.export.draft import export_draft
    from engine.prepare import DRAFT_WEIGHT_FORMAT, SHIPPED_DRAFTS, shipped_drafts

    default = SHIPPED_DRAFTS / "DEFAULT"
    if not default.is_file():
        pytest.skip("no default draft is shipped in resources/drafts")
    src = next((p for p in shipped_drafts() if p.name == default.read_text().strip()), None)
    assert src is not None, f"resources/drafts/DEFAULT names a draft that is not shipped: {default.read_text()!r}"
    return export_draft(src, tmp_path_factory.mktemp("smollm2-default-draft") / src.name,
                        weight_format=DRAFT_WEIGHT_FORMAT)


@pytest.fixture(scope="module", params=PRECISIONS)
def precision(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def solo(smollm2_target: Path, default_draft: Path, precision: str) -> list[list[int]]:
    alone = SpeculativePipeline.load(smollm2_target, default_draft, precision=precision)
    return [alone.generate(p, CONFIG).token_ids for p in PROMPTS]


def _run(pipe: SpeculativePipeline, arrivals: list[int]):
    """Add PROMPTS[k] before step arrivals[k]; step until all finish. Returns rids, StepStats, events."""
    rids, steps, events, emitted_at_arrival = [], [], {}, []
    i = 0
    while len(rids) < len(PROMPTS) or pipe.has_unfinished():
        while len(rids) < len(PROMPTS) and arrivals[len(rids)] <= i:
            emitted_at_arrival.append(sum(len(e.tokens) for evs in events.values() for e in evs))
            rid = pipe.add_request(PROMPTS[len(rids)], CONFIG)
            rids.append(rid)
            events[rid] = []
        if pipe.has_unfinished():
            for e in pipe.step():
                events[e.request_id].append(e)
            steps.append(copy.deepcopy(pipe.last_step))
        i += 1
        assert i < 2000
    return rids, steps, events, emitted_at_arrival


def test_staggered_requests_with_small_budget_equal_solo(smollm2_target: Path, default_draft: Path, solo,
                                                        precision: str) -> None:
    # One row short of a full validation window (1 + the draft's default candidates): every full window is
    # split, whatever the draft accepts. (A budget of 6, less than two windows, split only while two requests
    # decoded at once, which depends on how fast the draft finishes each request.)
    window = 1 + read_draft_info(default_draft).default_candidates  # what the pipeline drafts when unset
    budget = window - 1
    assert budget >= 2
    pipe = SpeculativePipeline.load(smollm2_target, default_draft, precision=precision,
                                    scheduler=SchedulerConfig(max_num_batched_tokens=budget))
    rids, steps, events, emitted = _run(pipe, [0, 3, 12, 20])
    for rid, want, prompt in zip(rids, solo, PROMPTS):
        assert pipe.result(rid).token_ids == want, f"{prompt!r} diverged from its solo output"
        assert [t for e in events[rid] for t in e.tokens] == want
    assert all(s.tokens <= budget for s in steps)
    assert emitted[-1] > 0, "the last request did not arrive while others were decoding"
    assert max(len(s.requests) for s in steps) > 1, "no step served more than one request"
    assert any(s.split for s in steps), "no window was split"
    assert sum(pipe.metrics(r).accepted_total for r in rids) > 0  # the shipped draft is accepted in the batch
    assert pipe.kv_stats()["used_blocks"] == 0


def test_small_kv_cache_preempts_and_equals_solo(smollm2_target: Path, default_draft: Path, solo,
                                                 precision: str) -> None:
    probe = SpeculativePipeline.load(smollm2_target, default_draft, precision=precision)
    bs = probe.kv_stats()["block_size"]
    need = [math.ceil((len(probe.encode_prompt(p)) + CONFIG.max_new_tokens + probe.default_num_candidates + 1) / bs)
            for p in PROMPTS]
    del probe
    sched = SchedulerConfig(num_kv_blocks=max(need) + 1)
    assert sched.num_kv_blocks < sum(need)
    pipe = SpeculativePipeline.load(smollm2_target, default_draft, precision=precision, scheduler=sched)
    rids, steps, _, _ = _run(pipe, [0, 0, 0, 0])
    for rid, want, prompt in zip(rids, solo, PROMPTS):
        assert pipe.result(rid).token_ids == want, f"{prompt!r} diverged from its solo output after preemption"
    assert sum(pipe.metrics(r).preemptions for r in rids) > 0, "nothing was preempted"
    assert max(len(s.requests) for s in steps) > 1
    assert pipe.kv_stats()["used_blocks"] == 0
