"""Continuous batching (issue 5): many requests per step, a token budget, split validation windows,
preemption and cancellation, and acceptance metrics that count each window once.

The reference for every request is its own output when run alone, through a pipeline of the same
kind (same draft) with the default scheduler. The pipelines pin precision="f32", where greedy
output is exact (tests/engine/test_pipeline.py), except the default-precision runs of the all-at-once
scenario (row-invariant too: docs/engine.md "Row invariance"). Each scenario also asserts that it really exercised what
it is about (several requests in one step, split windows, preemptions), so a scheduler that quietly
serialises requests or never splits cannot pass by accident.
"""
from __future__ import annotations

import copy
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import openvino as ov
import pytest

from engine.config import GenerationConfig
from engine.draft_policy import ALWAYS
from engine.pipeline import SpeculativePipeline
from engine.scheduler import SchedulerConfig
from fixtures.tiny_drafts import TRAIN_PROMPTS

PROMPTS = list(TRAIN_PROMPTS[:5])  # the trained drafts are accepted often on these
NEW = 24
GREEDY = GenerationConfig(max_new_tokens=NEW, ignore_eos=True)
VARIANTS = ["none", "b8_trained", "b8_random", "dspark_topk", "dspark_dense"]
DRAFTED = [v for v in VARIANTS if v != "none"]
# Sampled requests with a fixed rng_seed are compared with their solo output too: docs/batching.md says each
# request draws from its own RNG streams in the same order with or without a split window or a preemption,
# and that its draft rows do not depend on the batch around it.


# ---- pipelines ----------------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    target: Path
    draft: Path | None
    top_k: int | None  # markov_head_top_k for DSpark drafts
    precision: str = "f32"
    solo_pipe: SpeculativePipeline | None = None
    solo_cache: dict = field(default_factory=dict)

    def cfg(self, base: GenerationConfig = GREEDY, **changes) -> GenerationConfig:
        if self.top_k is not None:
            changes.setdefault("markov_head_top_k", self.top_k)
        return base.copy(**changes)

    def load(self, scheduler: SchedulerConfig | None = None) -> SpeculativePipeline:
        pipe = SpeculativePipeline.load(self.target, self.draft, precision=self.precision, scheduler=scheduler)
        if pipe.policy is not None:  # these tests count every step's window: no step may skip its draft call (the
            pipe.policy.skip_spell = 0  # tiny fixtures' target step costs less than any draft call; test_verify_windows)
        return pipe

    def solo(self, prompt: str, cfg: GenerationConfig):
        """The request's result when it runs alone (default scheduler, nothing else in the pipeline)."""
        key = (prompt, repr(cfg))
        if key not in self.solo_cache:
            if self.solo_pipe is None:
                self.solo_pipe = self.load()
            self.solo_cache[key] = self.solo_pipe.generate(prompt, cfg, chat=False)
        return self.solo_cache[key]


@pytest.fixture(scope="module")
def dspark_trained(tiny_qwen3_hf: Path) -> Path:
    """Only the trained DSpark fixture (tests/engine/variants builds all of them; this module needs one)."""
    from fixtures.tiny_variant_drafts import VARIANT_SPECS, build_variant_drafts

    spec = next(s for s in VARIANT_SPECS if s.name == "dspark_trained")
    return build_variant_drafts(tiny_qwen3_hf, tiny_qwen3_hf.parent / "batching-dspark", (spec,))[spec.name]


_VARIANTS: dict[str, Variant] = {}


def _variant(request, name: str) -> Variant:
    if name not in _VARIANTS:
        target = request.getfixturevalue("tiny_qwen3_target")
        if name == "none":
            v = Variant(name, target, None, None)
        elif name.startswith("b8_"):
            v = Variant(name, target, request.getfixturevalue("tiny_qwen3_drafts")[name], None)
        else:
            v = Variant(name, target, request.getfixturevalue("dspark_trained"), 8 if name == "dspark_topk" else 0)
        _VARIANTS[name] = v
    return _VARIANTS[name]


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> Variant:
    return _variant(request, request.param)


@pytest.fixture(scope="module", params=DRAFTED)
def drafted(request) -> Variant:
    return _variant(request, request.param)


@pytest.fixture(scope="module")
def vocab_size(tiny_qwen3_target: Path) -> int:
    return int(json.loads((tiny_qwen3_target / "config.json").read_text())["vocab_size"])


# ---- running a batch ----------------------------------------------------------------------------


@dataclass
class Run:
    pipe: SpeculativePipeline
    rids: list[int]  # in the order the requests were added
    added_at: dict[int, int]  # rid -> index of the first step that could schedule it
    events: dict[int, list]  # rid -> its StepEvents in order
    steps: list  # a copy of pipe.last_step after every step
    step_events: list  # the events of every step
    kv: list  # kv_stats() after every step

    def result(self, rid: int):
        return self.pipe.result(rid)

    def tokens(self, rid: int) -> list[int]:
        return self.pipe.result(rid).token_ids


def run_batch(pipe: SpeculativePipeline, arrivals, on_step=None, max_steps: int = 5000) -> Run:
    """arrivals: (step index, prompt, config). Requests are added before that step runs; `on_step(i, run)`
    runs after step i (it may cancel requests)."""
    pending = sorted(arrivals, key=lambda a: a[0])
    run = Run(pipe, [], {}, defaultdict(list), [], [], [])
    i = 0
    while pending or pipe.has_unfinished():
        while pending and pending[0][0] <= i:
            _, prompt, cfg = pending.pop(0)
            rid = pipe.add_request(prompt, cfg, chat=False)
            run.rids.append(rid)
            run.added_at[rid] = i
        if pipe.has_unfinished():
            events = pipe.step()
            run.steps.append(copy.deepcopy(pipe.last_step))
            run.step_events.append(events)
            for e in events:
                run.events[e.request_id].append(e)
            kv = dict(pipe.kv_stats())
            run.kv.append(kv)
            assert kv["used_blocks"] + kv["free_blocks"] == kv["total_blocks"], kv
        else:  # idle until the next arrival
            run.steps.append(None)
            run.step_events.append([])
            run.kv.append(dict(pipe.kv_stats()))
        if on_step is not None:
            on_step(i, run)
        i += 1
        assert i < max_steps, "the batch did not finish"
    return run


def check_common(run: Run, sched: SchedulerConfig) -> None:
    """What holds after every batch: budgets respected, every request finished once, KV all free."""
    for s in run.steps:
        if s is None:
            continue
        assert s.tokens <= sched.max_num_batched_tokens, s
        assert len(s.requests) <= sched.max_num_seqs, s
        assert len(set(s.requests)) == len(s.requests), s
        assert s.prefill_tokens <= s.tokens, s
        assert set(s.split) <= set(s.requests), s
    for rid in run.rids:
        evs = run.events[rid]
        assert evs and evs[-1].finished, f"request {rid} never finished"
        assert sum(e.finished for e in evs) == 1, f"request {rid} finished more than once"
        assert [t for e in evs for t in e.tokens] == run.tokens(rid), f"events of {rid} do not add up to its result"
    kv = run.pipe.kv_stats()
    assert kv["used_blocks"] == 0 and kv["free_blocks"] == kv["total_blocks"], kv
    assert not run.pipe.has_unfinished()


def max_batch(run: Run) -> int:
    return max(len(s.requests) for s in run.steps if s is not None)


# ---- 1. every greedy request equals its solo output -----------------------------------------------


def test_staggered_arrivals_equal_solo(variant: Variant) -> None:
    """Requests join while others decode (max_num_seqs=2 holds the third back for a while)."""
    sched = SchedulerConfig(max_num_seqs=2)
    cfgs = [variant.cfg(), variant.cfg(max_new_tokens=NEW + 8), variant.cfg(), variant.cfg(max_new_tokens=NEW - 8)]
    arrivals = [(0, PROMPTS[0], cfgs[0]), (2, PROMPTS[1], cfgs[1]), (3, PROMPTS[2], cfgs[2]),
                (7, PROMPTS[3], cfgs[3])]
    ref = [variant.solo(p, c).token_ids for _, p, c in arrivals]
    run = run_batch(variant.load(sched), arrivals)
    check_common(run, sched)
    for rid, want in zip(run.rids, ref):
        assert run.tokens(rid) == want, f"{variant.name}: request {rid} diverged from its solo output"
        assert run.result(rid).finish_reason == "length"
    # it really was staggered: request 1 arrived after request 0 had emitted tokens and before it finished
    first = run.rids[0]
    emitted_before = sum(len(e.tokens) for evs in run.step_events[: run.added_at[run.rids[1]]]
                         for e in evs if e.request_id == first)
    assert 0 < emitted_before < len(ref[0])
    assert max_batch(run) == 2  # several requests per step, never more than max_num_seqs


@pytest.mark.parametrize("budget", [1, 5])
def test_small_budget_splits_windows_and_stays_exact(variant: Variant, budget: int) -> None:
    """A budget below the window (N + 1 rows): prompts are chunked and windows split over steps."""
    sched = SchedulerConfig(max_num_batched_tokens=budget)
    arrivals = [(0, PROMPTS[i], variant.cfg(draft_policy=ALWAYS)) for i in range(3)]  # full windows: they split
    ref = [variant.solo(p, c).token_ids for _, p, c in arrivals]
    pipe = variant.load(sched)
    run = run_batch(pipe, arrivals)
    check_common(run, sched)
    for rid, want in zip(run.rids, ref):
        assert run.tokens(rid) == want, f"{variant.name}, budget {budget}: request {rid} diverged"
    for rid, (_, prompt, _) in zip(run.rids, arrivals):
        n = len(pipe.encode_prompt(prompt, chat=False))
        assert n > budget
        # the first token cannot come before ceil(n / budget) steps have scheduled this request's prompt
        first_step = next(i for i, evs in enumerate(run.step_events) if any(e.request_id == rid for e in evs))
        scheduled = sum(1 for s in run.steps[: first_step + 1] if rid in s.requests)
        assert scheduled >= math.ceil(n / budget)
    if variant.draft is not None:
        assert any(s.split for s in run.steps), "no window was split: the test did not exercise splits"
        if budget > 1:
            assert max_batch(run) > 1


def _preempting_scheduler(pipe: SpeculativePipeline, prompts, cfg: GenerationConfig, rows: int) -> SchedulerConfig:
    """A cache that holds the longest request alone (plus a block), never all of them at once."""
    bs = pipe.kv_stats()["block_size"]
    need = [math.ceil((len(pipe.encode_prompt(p, chat=False)) + cfg.max_new_tokens + rows) / bs) for p in prompts]
    blocks = max(need) + 1
    assert blocks < sum(need), "the requests fit together: choose longer ones"
    return SchedulerConfig(num_kv_blocks=blocks)


def test_tiny_kv_cache_preempts_and_stays_exact(variant: Variant) -> None:
    """Recomputed requests continue exactly, the sampled one too."""
    cfg = variant.cfg(max_new_tokens=64, draft_policy=ALWAYS)  # full windows: the budget splits them
    prompts = PROMPTS[:3]
    cfgs = [cfg, cfg.copy(do_sample=True, temperature=0.9, rng_seed=5), cfg]
    ref = [variant.solo(p, c).token_ids for p, c in zip(prompts, cfgs)]
    probe = variant.solo_pipe
    rows = (probe.default_num_candidates or 0) + 1
    sched = _preempting_scheduler(probe, prompts, cfg, rows)
    run = run_batch(variant.load(sched), [(0, p, c) for p, c in zip(prompts, cfgs)])
    check_common(run, sched)
    for rid, want in zip(run.rids, ref):
        assert run.tokens(rid) == want, f"{variant.name}: request {rid} diverged after preemption"
    preemptions = {rid: run.pipe.metrics(rid).preemptions for rid in run.rids}
    assert sum(preemptions.values()) > 0, f"nothing was preempted with {sched}"
    logged = defaultdict(int)
    for s in run.steps:
        for rid in s.preempted:
            logged[rid] += 1
    assert dict(logged) == {r: n for r, n in preemptions.items() if n}
    assert all(kv["used_blocks"] <= sched.num_kv_blocks for kv in run.kv)


def test_mixed_greedy_and_sampled_requests(variant: Variant, vocab_size: int) -> None:
    """Greedy requests (one through the logits path, two ending early) and sampled ones (fixed seeds) each
    equal their solo output."""
    sched = SchedulerConfig(max_num_batched_tokens=6)
    sampled = variant.cfg(do_sample=True, temperature=0.8, top_p=0.95, rng_seed=7)
    # two greedy requests that end early, like their solo runs: on a stop token and on a stop string
    full = variant.solo(PROMPTS[4], variant.cfg())
    stop_token = variant.cfg(stop_token_ids={full.token_ids[9]})
    stop_text = variant.cfg(stop_strings=[full.text[12:15]])
    arrivals = [(0, PROMPTS[0], variant.cfg()), (0, PROMPTS[1], sampled),
                (1, PROMPTS[2], variant.cfg(repetition_penalty=1.3)), (3, PROMPTS[3], sampled.copy(rng_seed=11, top_k=50)),
                (4, PROMPTS[4], stop_token), (5, PROMPTS[4], stop_text)]
    run = run_batch(variant.load(sched), arrivals)
    check_common(run, sched)
    for rid, (_, prompt, cfg) in zip(run.rids, arrivals):
        res, alone = run.result(rid), variant.solo(prompt, cfg)
        assert res.finish_reason == alone.finish_reason
        if cfg.do_sample:
            assert res.finish_reason == "length" and len(res.token_ids) == cfg.max_new_tokens
            assert all(0 <= t < vocab_size for t in res.token_ids)
            assert res.token_ids == alone.token_ids, f"{variant.name}: sampled request {rid} changed by batching"
        elif cfg.stop_strings:
            # the text is cut at the stop string; the tokens of the step that completed it are all kept, so
            # how many follow the cut depends on the step's size (as target alone vs speculative already did)
            assert res.text == alone.text, f"{variant.name}: stop-string request {rid} diverged"
            assert res.token_ids == full.token_ids[: len(res.token_ids)]
        else:
            assert res.token_ids == alone.token_ids, f"{variant.name}: greedy request {rid} diverged"
            assert res.text == alone.text
    assert [run.result(r).finish_reason for r in run.rids[4:]] == ["eos", "stop"]
    assert max_batch(run) > 1


@pytest.mark.parametrize("name", ["none", "b8_trained"])
def test_stop_string_cut_does_not_depend_on_the_step_size(request, name: str) -> None:
    """A stop string ends the text before its first occurrence, alone or in a batch with a budget of one row
    (where every window is split into one-row steps, as the target alone always runs).

    Fails as of 2010089: text streamed in an earlier step is never taken back (_stop_string_end returns
    max(end, shown)), so a stop string whose first characters came out a step before its last ones stays
    partly in the text. Solo target-alone runs show it too; batching makes a request's text depend on the
    budget and on the other requests (they decide where its windows split)."""
    variant = _variant(request, name)
    full = variant.solo(PROMPTS[4], variant.cfg())
    stop = full.text[12:15]
    want = full.text[: full.text.find(stop)]
    cfg = variant.cfg(stop_strings=[stop])
    assert variant.solo(PROMPTS[4], cfg).text == want
    sched = SchedulerConfig(max_num_batched_tokens=1)
    run = run_batch(variant.load(sched), [(0, PROMPTS[4], cfg), (0, PROMPTS[0], variant.cfg())])
    check_common(run, sched)
    res = run.result(run.rids[0])
    assert (res.finish_reason, res.text) == ("stop", want)


def test_cancel_one_request_mid_generation(variant: Variant) -> None:
    sched = SchedulerConfig(max_num_batched_tokens=12)
    arrivals = [(0, PROMPTS[i], variant.cfg()) for i in range(3)]
    ref = [variant.solo(p, c).token_ids for _, p, c in arrivals]
    state = {"cancelled_at": None}

    def on_step(i: int, run: Run) -> None:
        victim = run.rids[1]
        emitted = sum(len(e.tokens) for e in run.events[victim])
        if state["cancelled_at"] is None and emitted >= 3:
            run.pipe.cancel(victim)
            state["cancelled_at"] = i
        if i == 4:  # a request cancelled before any step could schedule it
            rid = run.pipe.add_request(PROMPTS[3], variant.cfg(), chat=False)
            run.rids.append(rid)
            run.added_at[rid] = i + 1
            run.pipe.cancel(rid)

    run = run_batch(variant.load(sched), arrivals, on_step=on_step)
    check_common(run, sched)
    victim, late = run.rids[1], run.rids[3]
    assert state["cancelled_at"] is not None
    res = run.result(victim)
    assert res.finish_reason == "cancelled"
    assert 3 <= len(res.token_ids) < NEW and res.token_ids == ref[1][: len(res.token_ids)]
    for s in run.steps[state["cancelled_at"] + 2:]:
        assert s is None or victim not in s.requests
    assert run.result(late).finish_reason == "cancelled" and run.result(late).token_ids == []
    assert not any(late in s.requests for s in run.steps if s is not None)
    for rid in (run.rids[0], run.rids[2]):
        assert run.tokens(rid) == ref[run.rids.index(rid)], f"{variant.name}: request {rid} changed by the cancel"


def test_everything_at_once(variant: Variant) -> None:
    """Small budget, few sequences, a tiny cache, staggered greedy and sampled requests (one with fewer
    candidates per window): every request still equals its solo output. No spare block: with one, the
    DSpark fixture's requests finished without ever meeting a full cache."""
    _everything_at_once(variant, spare_blocks=0)


@pytest.mark.parametrize("name", ["b8_trained", "dspark_topk"])
def test_everything_at_once_at_the_default_precision(request, name: str) -> None:
    v = _variant(request, name)
    # no spare block: the default precision's tokens (not f32's) must still meet a full cache
    _everything_at_once(Variant(f"{name} (default precision)", v.target, v.draft, v.top_k, "default"), spare_blocks=0)


def _everything_at_once(variant: Variant, spare_blocks: int) -> None:
    cfg = variant.cfg(max_new_tokens=40, draft_policy=ALWAYS)  # full windows (the adaptive count follows timings)
    cfgs = [cfg, cfg.copy(do_sample=True, temperature=0.9, rng_seed=3), cfg, cfg.copy(num_assistant_tokens=3)
            if variant.draft is not None else cfg, cfg.copy(do_sample=True, rng_seed=4, top_k=40), cfg]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(cfgs))]
    ref = [variant.solo(p, c).token_ids for p, c in zip(prompts, cfgs)]
    probe = variant.solo_pipe
    bs = probe.kv_stats()["block_size"]
    need = max(math.ceil((len(probe.encode_prompt(p, chat=False)) + cfg.max_new_tokens + 9) / bs) for p in prompts)
    sched = SchedulerConfig(max_num_batched_tokens=5, max_num_seqs=4, num_kv_blocks=need + spare_blocks)
    run = run_batch(variant.load(sched), [(2 * i, p, c) for i, (p, c) in enumerate(zip(prompts, cfgs))])
    check_common(run, sched)
    for rid, want in zip(run.rids, ref):
        assert run.tokens(rid) == want, f"{variant.name}: request {rid} diverged"
    assert sum(run.pipe.metrics(r).preemptions for r in run.rids) > 0
    if variant.draft is not None:
        assert any(s.split for s in run.steps if s is not None)


def _preempted_mid_window(run: Run) -> int:
    """Preemptions of a request whose last event validated only the first part of a split window."""
    count = 0
    for i, s in enumerate(run.steps):
        for rid in (s.preempted if s is not None else []):
            before = [e for evs in run.step_events[:i] for e in evs if e.request_id == rid]
            count += bool(len(before) > 1 and before[-1].window_drafted is None and not before[-1].finished)
    return count


def test_preemption_in_the_middle_of_a_split_window(request) -> None:
    """The window a preempted request was validating is kept; after the recompute its rest is validated.
    (The trained draft's first parts are often accepted, so windows stay open across steps.)"""
    v = _variant(request, "b8_trained")
    mid = 0
    for n_req, budget, new in [(2, 10, 40), (3, 11, 40), (4, 12, 64)]:
        cfg = v.cfg(max_new_tokens=new, draft_policy=ALWAYS)  # full windows: the budget splits them
        prompts = PROMPTS[:n_req]
        ref = [v.solo(p, cfg).token_ids for p in prompts]
        bs = v.solo_pipe.kv_stats()["block_size"]
        need = max(math.ceil((len(v.solo_pipe.encode_prompt(p, chat=False)) + new + 8) / bs) for p in prompts)
        sched = SchedulerConfig(max_num_batched_tokens=budget, num_kv_blocks=need + 1)
        run = run_batch(v.load(sched), [(0, p, cfg) for p in prompts])
        check_common(run, sched)
        assert [run.tokens(r) for r in run.rids] == ref
        mid += _preempted_mid_window(run)
    assert mid > 0, "no request was preempted with a split window open"


def test_short_requests_and_generate_while_others_run(variant: Variant) -> None:
    """Requests of 1-3 new tokens (no room for a whole window) next to long ones, and generate() called while
    other requests are in flight: each equals its solo output."""
    sched = SchedulerConfig(max_num_batched_tokens=3)
    pipe = variant.load(sched)
    cfgs = [variant.cfg(max_new_tokens=k) for k in (1, 2, 3)] + [variant.cfg()]
    rids = [pipe.add_request(PROMPTS[i], c, chat=False) for i, c in enumerate(cfgs)]
    for _ in range(4):
        pipe.step()
    out = pipe.generate(PROMPTS[4], variant.cfg(), chat=False)
    assert out.token_ids == variant.solo(PROMPTS[4], variant.cfg()).token_ids
    while pipe.has_unfinished():
        pipe.step()
    for i, (rid, c) in enumerate(zip(rids, cfgs)):
        assert pipe.result(rid).token_ids == variant.solo(PROMPTS[i], c).token_ids
        assert len(pipe.result(rid).token_ids) == c.max_new_tokens
    assert pipe.kv_stats()["used_blocks"] == 0


# ---- 2. one target inference per step for all scheduled requests ---------------------------------


class InferenceCounter:
    """Counts infer() calls of every OpenVINO infer request, by the model it runs (from its input names)."""

    def __init__(self, monkeypatch) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self._kinds: dict[int, str] = {}
        counter = self
        for name in ("infer", "start_async"):
            original = getattr(ov.InferRequest, name)

            def wrapped(req, *args, _original=original, **kwargs):
                counter.counts[counter.kind(req)] += 1
                return _original(req, *args, **kwargs)

            monkeypatch.setattr(ov.InferRequest, name, wrapped)

    def kind(self, req) -> str:
        key = id(req)
        if key not in self._kinds:
            names = {n for port in req.model_inputs for n in port.get_names()}
            if "candidate_ids" in names:
                kind = "scorer"
            elif "predecessor_ids" in names:
                kind = "dense_head"
            elif "hidden_states" in names or "target_hidden" in names:
                kind = "draft"
            elif "input_ids" in names:
                kind = "target"
            else:
                kind = "other:" + ",".join(sorted(names))
            self._kinds[key] = kind
        return self._kinds[key]

    def take(self) -> dict[str, int]:
        out = dict(self.counts)
        self.counts.clear()
        return out


@pytest.mark.parametrize("name", ["none", "b8_trained", "dspark_topk", "dspark_dense"])
def test_one_target_inference_per_step_serves_every_scheduled_request(request, monkeypatch, name: str) -> None:
    v = _variant(request, name)
    arrivals = [(0, PROMPTS[0], v.cfg()), (0, PROMPTS[1], v.cfg()), (2, PROMPTS[2], v.cfg())]
    ref = [v.solo(p, c).token_ids for _, p, c in arrivals]
    pipe = v.load(SchedulerConfig())
    counter = InferenceCounter(monkeypatch)
    per_step = []
    run = run_batch(pipe, arrivals, on_step=lambda i, r: per_step.append(counter.take()))
    check_common(run, SchedulerConfig())
    assert [run.tokens(r) for r in run.rids] == ref
    multi = 0
    for s, counts, events in zip(run.steps, per_step, run.step_events):
        if s is None:
            assert counts.get("target", 0) == 0
            continue
        assert counts.get("target", 0) == 1, (s, counts)
        assert counts.get("draft", 0) <= 1, (s, counts)
        assert counts.get("scorer", 0) <= 1, (s, counts)  # one Top-K scorer inference for all requests
        assert counts.get("dense_head", 0) <= v.solo_pipe.default_num_candidates, (s, counts)  # one per position
        assert not any(k.startswith("other") for k in counts), counts
        if len({e.request_id for e in events if e.tokens}) > 1:
            multi += 1
    assert multi > 0, "no step emitted tokens for more than one request"
    if v.draft is not None:
        assert sum(c.get("draft", 0) for c in per_step) > 0
    if name == "dspark_topk":
        assert sum(c.get("scorer", 0) for c in per_step) > 0
    steps = sum(1 for s in run.steps if s is not None)
    assert sum(c.get("target", 0) for c in per_step) == steps
    if name == "dspark_dense":
        assert sum(c.get("dense_head", 0) for c in per_step) > 0


# ---- 3. acceptance metrics count each window once -------------------------------------------------


def _windows(events) -> list[list]:
    """The request's events after its first token, grouped by the validation window they belong to."""
    groups, cur = [], []
    for e in events[1:]:
        cur.append(e)
        if e.window_drafted is not None:
            groups.append(cur)
            cur = []
    assert not cur or cur[-1].finished, "events after the last completed window"
    return groups


def check_window_accounting(run: Run, rid: int) -> None:
    events = run.events[rid]
    m = run.pipe.metrics(rid)
    assert events[0].window_drafted is None and len(events[0].tokens) == 1
    windows = _windows(events)
    # the window's candidates the target validated, and those the draft proposed (the policy may verify fewer)
    assert m.verified_total == sum(len(g[-1].window_drafted) for g in windows)
    assert m.drafted_total == sum(g[-1].window_proposed for g in windows) >= m.verified_total
    assert m.accepted_total == sum(g[-1].window_accepted for g in windows)
    assert m.accepted_total == sum(e.accepted for e in events)  # every accepted candidate once, in one step
    assert sum(len(e.drafted) for e in events) <= m.verified_total  # a rejection drops the rest of a window
    assert sum(m.position_verified) == m.verified_total and sum(m.position_accepted) == m.accepted_total
    for i in range(len(m.position_verified)):
        assert m.position_verified[i] == sum(len(g[-1].window_drafted) > i for g in windows)
        assert m.position_accepted[i] == sum(g[-1].window_accepted > i for g in windows)
    for k, g in enumerate(windows):
        wd, wa = g[-1].window_drafted, g[-1].window_accepted
        validated = [t for e in g for t in e.drafted]
        tokens = [t for e in g for t in e.tokens]
        assert validated == wd[: len(validated)], "a step validated candidates of another window"
        assert sum(e.accepted for e in g) == wa <= len(wd)
        assert tokens[:wa] == wd[:wa]
        if k < len(windows) - 1:
            assert len(tokens) == wa + 1, "a window emits its accepted candidates and one target token"
        for e in g[:-1]:  # a part that does not complete its window accepted everything it validated
            assert e.accepted == len(e.drafted) and e.tokens == e.drafted
    # split_windows: windows validated over more than one step (a split whose first part is rejected ends there)
    assert m.split_windows == sum(len(g) > 1 for g in windows) <= m.windows
    assert m.windows == sum(1 for g in windows if g[-1].window_drafted is not None)
    if m.split_windows:
        assert any(rid in s.split for s in run.steps if s is not None)


@pytest.mark.parametrize("budget", [3, 6])
def test_split_windows_are_counted_once(drafted: Variant, budget: int) -> None:
    sched = SchedulerConfig(max_num_batched_tokens=budget)
    arrivals = [(0, PROMPTS[i], drafted.cfg(draft_policy=ALWAYS)) for i in range(3)]  # the same windows as solo
    solo = [drafted.solo(p, c) for _, p, c in arrivals]
    run = run_batch(drafted.load(sched), arrivals)
    check_common(run, sched)
    assert any(s.split for s in run.steps if s is not None)
    for rid, alone in zip(run.rids, solo):
        assert run.tokens(rid) == alone.token_ids
        check_window_accounting(run, rid)
        m, ms = run.pipe.metrics(rid), alone.metrics
        # greedy draft and target: the same windows with or without splits, so the same acceptance
        assert (m.drafted_total, m.verified_total, m.accepted_total) == (ms.drafted_total, ms.verified_total,
                                                                         ms.accepted_total)
        assert (m.position_verified, m.position_accepted) == (ms.position_verified, ms.position_accepted)
        assert m.windows == ms.windows and ms.split_windows == 0
        assert m.acceptance_by_position == ms.acceptance_by_position
    if drafted.name != "b8_random":  # trained drafts: some split window was accepted past its first part
        assert sum(run.pipe.metrics(r).split_windows for r in run.rids) > 0


def test_solo_window_accounting_without_splits(drafted: Variant) -> None:
    """The unsplit path keeps the same bookkeeping (and a request's last, shortened window counts once)."""
    sched = SchedulerConfig()
    arrivals = [(0, PROMPTS[i], drafted.cfg(max_new_tokens=NEW - 3 + i)) for i in range(3)]
    run = run_batch(drafted.load(sched), arrivals)
    check_common(run, sched)
    assert not any(s.split for s in run.steps if s is not None)
    for rid in run.rids:
        check_window_accounting(run, rid)
        assert run.pipe.metrics(rid).split_windows == 0


# ---- 4. SchedulerConfig validation ----------------------------------------------------------------


@pytest.mark.parametrize("name,value", [
    ("max_num_batched_tokens", 0), ("max_num_batched_tokens", -4), ("max_num_batched_tokens", 2.5),
    ("max_num_seqs", 0), ("max_num_seqs", -1),
    ("num_kv_blocks", 0), ("num_kv_blocks", -2), ("num_kv_blocks", 1.5),
    ("cache_size_mb", 0), ("cache_size_mb", -1),
])
def test_scheduler_config_refuses_bad_values_naming_the_field(name: str, value) -> None:
    with pytest.raises(ValueError, match=name):
        SchedulerConfig(**{name: value}).validate()


def test_scheduler_config_accepts_the_edges_and_load_validates(tiny_qwen3_target) -> None:
    SchedulerConfig(max_num_batched_tokens=1, max_num_seqs=1, num_kv_blocks=1).validate()
    SchedulerConfig().validate()
    with pytest.raises(ValueError, match="max_num_seqs"):
        SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32", scheduler=SchedulerConfig(max_num_seqs=0))


def test_request_that_can_never_fit_the_cache_is_refused(tiny_qwen3_target) -> None:
    pipe = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32", scheduler=SchedulerConfig(num_kv_blocks=2))
    bs = pipe.kv_stats()["block_size"]
    assert pipe.kv_stats()["total_blocks"] == 2
    with pytest.raises(ValueError, match="num_kv_blocks"):
        pipe.add_request(PROMPTS[0], GenerationConfig(max_new_tokens=3 * bs, ignore_eos=True), chat=False)
    assert not pipe.has_unfinished() and pipe.kv_stats()["used_blocks"] == 0
    by_size = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32", scheduler=SchedulerConfig(cache_size_mb=1))
    kv = by_size.kv_stats()
    assert 0 < kv["total_blocks"] < 1000
    with pytest.raises(ValueError, match="cache_size_mb"):
        by_size.add_request(PROMPTS[0], GenerationConfig(max_new_tokens=kv["total_blocks"] * kv["block_size"]), chat=False)
    # one that fits still runs, alone in the cache
    out = pipe.generate(PROMPTS[0], GenerationConfig(max_new_tokens=8, ignore_eos=True), chat=False)
    assert len(out.token_ids) == 8 and pipe.kv_stats()["used_blocks"] == 0
