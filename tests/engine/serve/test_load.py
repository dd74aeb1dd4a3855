"""8 client threads x 4 requests with mixed settings on one loopback server, some disconnecting
mid-stream: every other request completes (greedy ones exactly as the target alone writes them),
none is lost or left in the engine, and what the server keeps stays bounded."""
from __future__ import annotations

import gc
import os
import weakref

import psutil
import pytest

from engine.config import GenerationConfig
from engine.serve.bridge import KEEP_RECENT
from engine.serve.jobs import Job
from load import run_load

ROUNDS = 10  # 320 requests: past the 256 finished requests the engine keeps (pipeline._KEEP_FINISHED)


def _metric_values(served) -> dict[str, float]:
    values = {}
    for line in served.bridge.metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def _jobs() -> list[Job]:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, Job)]


def _jobs_alive(earlier: dict[int, weakref.ref]) -> int:
    """Jobs alive now that were not alive before the test (other tests' servers, e.g. the app's server
    panel of a window pytest-qt has closed but not yet deleted, keep their own recent lists)."""
    return sum(1 for o in _jobs() if not (id(o) in earlier and earlier[id(o)]() is o))


def test_load_8_threads_x_4_requests(served, reference, capsys):
    earlier = {id(o): weakref.ref(o) for o in _jobs()}
    rounds, rss = [], []
    for _ in range(ROUNDS):
        res = run_load(served.client, served.model_id, threads=8, per_thread=4)
        served.wait_idle()
        rounds.append(res)
        gc.collect()
        rss.append(psutil.Process(os.getpid()).memory_info().rss)
    res = rounds[0]
    assert len(res.outcomes) == 32
    errors = [(o.spec.index, o.error) for o in res.outcomes if o.error]
    assert not errors
    cut = [o for o in res.outcomes if o.spec.disconnect]
    done = [o for o in res.outcomes if not o.spec.disconnect]
    assert len(cut) == 4 and all(o.finish_reason == "disconnected" for o in cut)
    for o in done:
        assert o.finish_reason in ("stop", "length"), o
        assert 1 <= o.completion_tokens <= o.spec.max_tokens
        if not o.spec.sampled:  # continuous batching must not change a greedy answer
            prompt = [{"role": "user", "content": o.spec.prompt}] if o.spec.chat else o.spec.prompt
            solo = reference.generate(prompt, GenerationConfig(max_new_tokens=o.spec.max_tokens,
                                                               stop_strings=o.spec.stop or []), chat=o.spec.chat)
            assert o.text == solo.text, o.spec
    # the same sampled request (same seed) gives the same answer in every round, whatever ran beside it
    for a, b in zip(rounds[0].outcomes, rounds[1].outcomes):
        if a.spec.sampled and not a.spec.disconnect:
            assert a.text == b.text
    # nothing lost, nothing left behind
    m = _metric_values(served)
    ended = sum(v for k, v in m.items() if k.startswith("dflash_requests_total"))
    assert m['dflash_requests_total{outcome="cancelled"}'] >= 12  # 4 per round (earlier tests add none here)
    assert ended >= 96 and served.bridge.outstanding == 0 and not served.loop.live.jobs
    assert m["dflash_requests_running"] == 0 and m["dflash_requests_waiting"] == 0
    assert not served.pipe.has_unfinished()
    kv = served.pipe.kv_stats()
    assert kv["free_blocks"] == kv["total_blocks"]
    assert _jobs_alive(earlier) <= KEEP_RECENT  # the panel's recent list, nothing more
    # memory settles: once the engine's table of finished requests is full, rounds add little
    early, late = rss[3] - rss[0], rss[-1] - rss[-4]
    assert late < 24 * 2**20 and late < early, [round(r / 2**20) for r in rss]
    with capsys.disabled():
        print(f"\n[serve load] 8 threads x 4 requests: {res.tokens} tokens in {res.seconds:.2f} s = "
              f"{res.tok_s:.1f} tok/s aggregate (rounds: {[round(r.tok_s, 1) for r in rounds]}); "
              f"RSS MB {[round(r / 2**20) for r in rss]}")


@pytest.mark.smollm2
def test_load_on_the_embedded_model(capsys, smollm2_home):
    """The same load on SmolLM2 with its best shipped draft: the aggregate tok/s in docs/serving.md."""
    from engine.paths import best_draft_dir, default_target_dir
    from serve_helpers import start_server

    assert best_draft_dir() is not None, "prepare exports the shipped drafts beside the target"
    s = start_server(default_target_dir(), best_draft_dir())
    try:
        prompts = ("Write a Python function that reverses a string.", "Explain what a hash map is.",
                   "List three uses of a queue.", "What does the `with` statement do in Python?")
        res = run_load(s.client, s.model_id, threads=8, per_thread=4, prompts=prompts, base_tokens=64)
        s.wait_idle()
        assert not [o.error for o in res.outcomes if o.error]
        with capsys.disabled():
            print(f"\n[serve load smollm2] {res.tokens} tokens in {res.seconds:.2f} s = {res.tok_s:.1f} tok/s")
    finally:
        s.stop()
