"""The adaptive draft policy in the pipeline (engine/draft_policy.py, docs/batching.md): the draft proposes its
block, the target verifies only what pays. Greedy output never changes, a seeded sampled request gives the
same text in any batch, unseeded sampled output follows the target's distribution, and the windows the policy
cuts are counted as drafted, verified and accepted.

Tiny fixtures at f32; costs are frozen where a test is about the choice (this machine's timings are not)."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.config import GenerationConfig
from engine.draft_policy import ADAPTIVE, ALWAYS, CostTable, DraftPolicy
from engine.pipeline import SpeculativePipeline
from engine.scheduler import SchedulerConfig
from fixtures.distribution_check import PROMPT, assert_fits, exact_joint
from fixtures.tiny_drafts import TRAIN_PROMPTS

PROMPTS = list(TRAIN_PROMPTS[:4])
GREEDY = GenerationConfig(max_new_tokens=24, ignore_eos=True, draft_policy=ADAPTIVE)  # the policy under test


@pytest.fixture(scope="module")
def dspark_trained(tiny_qwen3_hf: Path) -> Path:
    """The trained DSpark fixture: a Markov head and a confidence head that reads it."""
    from fixtures.tiny_variant_drafts import VARIANT_SPECS, build_variant_drafts

    spec = next(s for s in VARIANT_SPECS if s.name == "dspark_trained")
    return build_variant_drafts(tiny_qwen3_hf, tiny_qwen3_hf.parent / "verify-dspark", (spec,))[spec.name]


@pytest.fixture(scope="module")
def alone(tiny_qwen3_target: Path) -> SpeculativePipeline:
    return SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")


class FrozenCost(CostTable):
    """A cost table that prices rows by a function and ignores what the steps measure."""

    def __init__(self, price) -> None:
        super().__init__()
        self.price = price

    def observe(self, size: int, ms: float, kept: bool = True) -> None:
        pass

    def estimate(self, size: int) -> float:
        return self.price(size) if size > 0 else 0.0

    @property
    def seen(self) -> bool:
        return True


class FrozenPolicy(DraftPolicy):
    """The real choice on frozen costs: the step's draft and host time fixed too, no exploration."""

    def __init__(self, price, fixed_ms: float = 0.0) -> None:
        super().__init__(explore_every=0, target=FrozenCost(price))
        self.fixed = fixed_ms

    def choose(self, offers, fixed_rows, fixed_tokens, fixed_ms):
        return super().choose(offers, fixed_rows, fixed_tokens, self.fixed)

    def observe_step(self, rows, target_ms, host_ms, draft_ms=0.0, plain=False, drafted=0):
        pass  # costs frozen: nor does a change of row count cost anything here

    def observe_window(self, sampled, verified, accepted, peak, predicted=None):
        super().observe_window(sampled, verified, accepted, peak)  # the chances as given: no survival scale learned


def _draft(request, name: str) -> tuple[Path, int | None]:
    if name == "dspark_trained":
        return request.getfixturevalue("dspark_trained"), 8
    return request.getfixturevalue("tiny_qwen3_drafts")[name], None


def _batch(pipe: SpeculativePipeline, cfgs: list[GenerationConfig], together: bool = False
           ) -> tuple[list[int], dict[int, list]]:
    """The first two requests before the first step, the rest one step later each (`together`: all before it)."""
    rids, events = [], {}
    pending = list(zip(PROMPTS, cfgs))
    step = 0
    while pending or pipe.has_unfinished():
        while pending and (together or len(rids) < 2 or step >= len(rids) - 1):
            prompt, cfg = pending.pop(0)
            rids.append(pipe.add_request(prompt, cfg, chat=False))
            events[rids[-1]] = []
        for e in pipe.step():
            events[e.request_id].append(e)
        step += 1
    return rids, events


def _sharp(price, cut: float, seen: list[list[float]]) -> FrozenPolicy:
    """Frozen costs and a sharp calibration: a candidate whose peak is at least `cut` gets 0.95, any other 0.05;
    each window's peaks are appended to `seen`."""

    class Sharp(FrozenPolicy):
        def chances(self, n, sampled, peak, history, reproducible=False, reach=None):
            seen.append(list(peak[:n]))
            return [0.95 if c >= cut else 0.05 for c in peak[:n]]

    return Sharp(price)


def _peaks(probe: SpeculativePipeline, cfg: GenerationConfig) -> list[float]:
    """The draft's peak probabilities over PROMPTS under `always` (where a sharp calibration splits them)."""
    values: list[float] = []
    for p in PROMPTS:
        probe.generate(p, cfg.copy(draft_policy=ALWAYS), chat=False, on_event=lambda e: values.extend(e.peak or []))
    return values


def _windows(events) -> list[tuple[int, int, int]]:
    """(proposed, verified, accepted) of each closed window."""
    return [(e.window_proposed, len(e.window_drafted), e.window_accepted) for e in events
            if e.window_drafted is not None]


@pytest.mark.parametrize("name", ["b8_trained", "dspark_trained"])
def test_greedy_output_is_the_targets_whatever_the_policy_verifies(request, alone, tiny_qwen3_target, name) -> None:
    """This machine's own timings decide; every request equals the target alone, every window is counted as
    what the draft proposed, what the target verified and what it accepted."""
    draft, k = _draft(request, name)
    cfg = GREEDY.copy(markov_head_top_k=k)
    ref = [alone.generate(p, cfg, chat=False).token_ids for p in PROMPTS]
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32",
                                    scheduler=SchedulerConfig(draft_policy=ADAPTIVE))
    rids, events = _batch(pipe, [cfg] * len(PROMPTS))
    for rid, want in zip(rids, ref):
        assert pipe.result(rid).token_ids == want, f"{name}: request {rid} diverged from the target alone"
        m = pipe.metrics(rid)
        wins = _windows(events[rid])
        assert m.drafted_total == sum(p for p, _, _ in wins) >= m.verified_total == sum(v for _, v, _ in wins)
        assert m.accepted_total == sum(a for _, _, a in wins) and all(a <= v <= p for p, v, a in wins)
        assert sum(m.position_verified) == m.verified_total and sum(m.position_accepted) == m.accepted_total
        assert m.mean_verified == pytest.approx(m.verified_total / m.windows)
    assert pipe.policy.target.seen and pipe.policy.pooled[False].verified  # it measured steps and counted windows
    if name == "dspark_trained":  # a confidence head: its calibration learned from the closed windows
        assert sum(map(sum, pipe.policy.calibration[False].reached)) > 0


@pytest.mark.parametrize("name", ["b8_trained", "dspark_trained"])
def test_frozen_costs_cheap_rows_verify_all_dear_rows_verify_none(request, alone, tiny_qwen3_target, name) -> None:
    draft, k = _draft(request, name)
    cfg = GREEDY.copy(markov_head_top_k=k, num_assistant_tokens=6)
    ref = [alone.generate(p, cfg, chat=False).token_ids for p in PROMPTS]
    runs = {}
    for label, price in (("flat", lambda r: 10.0), ("dear", lambda r: 5.0 * r)):
        pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
        pipe.policy = FrozenPolicy(price)
        rids, events = _batch(pipe, [cfg] * len(PROMPTS), together=True)
        assert [pipe.result(r).token_ids for r in rids] == ref
        assert pipe.last_step.prefill_tokens == 0
        runs[label] = [_windows(events[r]) for r in rids]
        opened = [e for r in rids for e in events[r] if e.window_proposed]
        assert opened and all(e.window_proposed > 0 for e in opened)
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32",
                                    scheduler=SchedulerConfig(draft_policy=ALWAYS))
    rids, events = _batch(pipe, [cfg.copy(draft_policy=None)] * len(PROMPTS), together=True)
    assert [pipe.result(r).token_ids for r in rids] == ref
    always = [_windows(events[r]) for r in rids]
    assert runs["flat"] == always  # rows free: every drafted candidate verified, as `always` does
    # Rows priced in proportion and every prompt prefilled in the first step: a candidate would have to bring
    # more than a token per row (its survival is below 1), so at most the first candidate, which rides on the
    # padding row a one-row chunk gets anyway (row invariance, CPU), is verified (if it has any chance at all).
    dear = [w for ws in runs["dear"] for w in ws]
    assert dear and max(p for p, _, _ in dear) == 6
    if pipe._target_rows(1) == 2:  # the padded layout: the first candidate's row is paid for anyway
        assert all(v <= 1 for _, v, _ in dear) and sum(v for _, v, _ in dear) > len(dear) / 2
    else:  # the split layout scores every generated row on its own: no candidate brings a token per row
        assert all(v == 0 for _, v, _ in dear)


def test_each_window_is_cut_before_its_first_doubtful_candidate(dspark_trained, alone, tiny_qwen3_target) -> None:
    """The cut follows each window's own peak probabilities: with the calibration replaced by a sharp one
    (confident candidates 0.95, doubtful ones 0.05) and costs where only the confident pay, every window is
    verified up to its first doubtful candidate."""
    cfg = GREEDY.copy(markov_head_top_k=8, max_new_tokens=40)
    seen: list[list[float]] = []
    values = _peaks(SpeculativePipeline.load(tiny_qwen3_target, dspark_trained, precision="f32"), cfg)
    CUT = float(np.median(values))  # half the candidates are doubtful
    pipe = SpeculativePipeline.load(tiny_qwen3_target, dspark_trained, precision="f32")
    pipe.policy = _sharp(lambda r: 10.0 + 2.0 * r, CUT, seen)
    padded = pipe._target_rows(1) == 2 or pipe.target.pad_matmul_rows  # a one-row call is two rows anyway
    for p in PROMPTS:
        seen.clear()
        events = []
        res = pipe.generate(p, cfg, chat=False, on_event=events.append)
        assert res.token_ids == alone.generate(p, cfg, chat=False).token_ids
        opened = [e for e in events if e.window_proposed]  # one step per window: no budget splits here
        assert len(opened) == len(seen)
        for e, conf in zip(opened, seen):
            first_doubtful = next((j for j, c in enumerate(conf) if c < CUT), len(conf))
            # where a one-row call gets a padding or dummy row, the first candidate rides on it
            assert len(e.drafted) == max(first_doubtful, int(padded)), (conf, len(e.drafted))
    assert len({len(e.drafted) for e in opened}) >= 2


@pytest.fixture(scope="module")
def tuned_dspark(dspark_trained: Path, tmp_path_factory) -> Path:
    """The trained DSpark fixture with a tuned count of 2 (config.json "num_assistant_tokens") below its block."""
    folder = tmp_path_factory.mktemp("tuned") / "dspark-tuned"
    shutil.copytree(dspark_trained, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_assistant_tokens=2)))
    return folder


def test_one_greedy_request_verifies_the_tuned_count_or_the_whole_block_on_window_models(
        tuned_dspark, alone, tiny_qwen3_target) -> None:
    """The cut: alone in its steps, a greedy `adaptive` request that does not say drafts the whole block after a
    window that accepted at least the tuned count (its gate), the tuned count after one rejected earlier, and the
    target verifies the tuned count or all of the block. With sharp chances (confident 0.95, doubtful 0.05) on
    frozen costs, a window confident all the way is verified whole and one whose first candidate is doubtful only
    to the tuned count; every window ran on the compiled copy made for its size, and every request equals the
    target alone (which has none)."""
    cfg = GREEDY.copy(markov_head_top_k=8, max_new_tokens=40)
    seen: list[list[float]] = []
    probe = SpeculativePipeline.load(tiny_qwen3_target, tuned_dspark, precision="f32",
                                     scheduler=SchedulerConfig(window_models_mb=0))
    assert probe.target.window_sizes == () and probe.describe().draft.candidates_for(ADAPTIVE) == 2  # no copy: no cut
    CUT = float(np.quantile(_peaks(probe, cfg.copy(num_assistant_tokens=7)), 0.25))  # a quarter are doubtful
    pipe = SpeculativePipeline.load(tiny_qwen3_target, tuned_dspark, precision="f32")
    block, short = pipe.draft.info.max_candidates, pipe.draft.info.default_candidates
    assert short == 2 < block and pipe.target.window_sizes == (short + 1, block + 1)  # a tiny target: both fit
    assert pipe.describe().draft.candidates_for(ADAPTIVE) == block
    pipe.policy = _sharp(lambda r: 10.0 + 2.0 * r, CUT, seen)
    verified = []
    for p in PROMPTS:
        seen.clear()
        events = []
        res = pipe.generate(p, cfg, chat=False, on_event=events.append)
        assert res.token_ids == alone.generate(p, cfg, chat=False).token_ids
        opened = [e for e in events if e.window_proposed]
        assert len(opened) == len(seen)
        closed = [e.window_accepted for e in events if e.window_drafted is not None]
        for i, (e, conf) in enumerate(zip(opened, seen)):
            if i and closed[i - 1] < short:  # the gate: rejected before the tuned count, the next drafts only that
                assert e.window_proposed <= short and len(e.drafted) == e.window_proposed, (closed[i - 1], conf)
                continue
            if len(conf) < block:  # the last window, cut short by max_new_tokens
                continue
            assert e.window_proposed == block and len(e.drafted) in (short, block)
            if min(conf) >= CUT:
                assert len(e.drafted) == block, conf
            if conf[0] < CUT:
                assert len(e.drafted) == short, conf
            verified.append(len(e.drafted))
    assert set(verified) == {short, block}
    calls = pipe.target.window_model_calls()
    assert calls[short + 1] >= verified.count(short) and calls[block + 1] >= verified.count(block)


def test_a_seeded_sampled_request_gives_the_same_text_in_any_batch(request, tiny_qwen3_target) -> None:
    """The cut of a seeded request depends on its own tokens only (fixed costs, the raw confidence)."""
    draft, k = _draft(request, "dspark_trained")
    seeded = GREEDY.copy(markov_head_top_k=k, do_sample=True, temperature=0.8, rng_seed=11, max_new_tokens=32)
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    solo = pipe.generate(PROMPTS[0], seeded, chat=False)
    pipe.policy = FrozenPolicy(lambda r: 10.0 + 3.0 * r)  # the batch's costs: other requests are cut otherwise
    cfgs = [seeded, GREEDY.copy(markov_head_top_k=k), GREEDY.copy(markov_head_top_k=k, do_sample=True), seeded]
    rids, events = _batch(pipe, cfgs)
    assert pipe.result(rids[0]).token_ids == solo.token_ids
    assert pipe.result(rids[3]).token_ids == pipe.generate(PROMPTS[3], seeded, chat=False).token_ids
    assert any(v < p for p, v, _ in _windows(events[rids[0]]))  # and its windows were cut


def test_unseeded_sampled_output_follows_the_target_distribution(dspark_trained, alone, tiny_qwen3_target,
                                                                 monkeypatch) -> None:
    """Goodness of fit of (t2, t3) given the most frequent t1 against the exact target distribution, with windows
    of 2 sampled candidates cut to 0, 1 or 2 by the policy from the candidates' peak probabilities: the second
    one's proposal is scored after the first candidate (the Markov head's edges), so whether the first is verified
    alone depends on what was drafted before the second, never on the second itself. A sharp calibration cuts
    after the first candidate when the second's peak is not its usual one (this draft mostly proposes one first
    candidate after the usual t1, so that is the rarer cut). 1,500 runs; categories with
    expected count < 5 pooled; chi-square at a false-alarm rate of 1e-3. The requests carry no seed (a seeded
    one is cut by its own rule); the entropy they draw is made repeatable here."""
    cfg = GenerationConfig(max_new_tokens=4, num_assistant_tokens=2, do_sample=True, temperature=1.0,
                           ignore_eos=True, markov_head_top_k=8, draft_policy=ADAPTIVE)
    prompt = alone.encode_prompt(PROMPT, chat=False)
    spec = SpeculativePipeline.load(tiny_qwen3_target, dspark_trained, precision="f32")
    probe: list[tuple[int, list[float]]] = []  # (t1, the first window's peak probabilities)
    for seed in range(200):
        events = []
        res = spec.generate(prompt, cfg.copy(rng_seed=seed, draft_policy=ALWAYS), on_event=events.append)
        probe.append((res.token_ids[0], next(e for e in events if e.window_proposed).peak))
    usual, _ = Counter(t for t, _ in probe).most_common(1)[0]
    second = Counter(c[1] for t, c in probe if t == usual)  # few distinct values: the first candidate has few
    usual_second = second.most_common(1)[0][0]
    first_cut = float(np.quantile([c[0] for _, c in probe], 0.1))

    class Sharp(FrozenPolicy):
        def chances(self, n, sampled, peak, history, reproducible=False, reach=None):
            keep = [peak[0] >= first_cut] + [abs(c - usual_second) < 1e-9 for c in peak[1:n]]
            return [0.9 if k else 0.1 for k in keep]

    spec.policy = Sharp(lambda r: 10.0 + 3.0 * r)  # a 0.9 survival pays its row, a 0.1 one does not
    entropy = iter(range(10_000, 20_000))
    monkeypatch.setattr(np.random, "SeedSequence", lambda *a: type("S", (), {"entropy": next(entropy)})())
    samples, cut_of = [], []
    for _ in range(1500):
        events = []
        res = spec.generate(prompt, cfg, on_event=events.append)
        samples.append(tuple(res.token_ids))
        cut_of.append(len(next(e for e in events if e.window_proposed).drafted))  # the window that makes t2
    first, _ = Counter(s[0] for s in samples).most_common(1)[0]
    cuts = Counter(c for s, c in zip(samples, cut_of) if s[0] == first)
    assert cuts[1] >= 20 and cuts[2] >= 100, cuts  # both cuts among the runs tested: each path is
    pairs = Counter(s[1:3] for s in samples if s[0] == first)
    n = sum(pairs.values())
    assert n >= 300
    assert_fits(pairs, exact_joint(alone, prompt, cfg, first))


@pytest.mark.parametrize("name", ["b8_trained", "dspark_trained"])
def test_steps_that_skip_the_draft_call_keep_greedy_output_the_targets(request, alone, tiny_qwen3_target, name) -> None:
    """A draft call dearer than what it saves (frozen: 50 ms against rows of 5 ms): after the regime's history fills,
    steps of decodes only run without drafting for a spell, then draft again to measure. Every request still equals
    the target alone, steps of both kinds ran, and the draft's context caught up after each spell."""
    draft, k = _draft(request, name)
    cfg = GREEDY.copy(markov_head_top_k=k, max_new_tokens=48)
    ref = [alone.generate(p, cfg, chat=False).token_ids for p in PROMPTS]
    pipe = SpeculativePipeline.load(tiny_qwen3_target, draft, precision="f32")
    pipe.policy = FrozenPolicy(lambda r: 5.0 * r)
    pipe.policy.drafting.extend([50.0] * 8)
    pipe.policy.skip_spell, pipe.policy.skip_probe = 3, 1
    rids, events = _batch(pipe, [cfg] * len(PROMPTS), together=True)
    assert [pipe.result(r).token_ids for r in rids] == ref
    decodes = [e for r in rids for e in events[r] if e.step > 0]
    assert pipe.policy.skipped_steps > 0
    assert any(e.window_proposed == 0 and len(e.tokens) == 1 for e in decodes)  # the target alone's steps
    skipped = [e.step for e in decodes if e.window_proposed == 0]
    assert any(e.window_proposed > 0 and e.step > min(skipped) for e in decodes)  # drafting again after a spell
