"""Sampled speculative decoding: the emitted tokens follow the target's own processed distribution.

Statistical tests use fixed seeds (so they are deterministic) and bounds chosen for a false-alarm
rate stated at each test, computed from the sample counts.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from engine.config import GenerationConfig
from engine.pipeline import SpeculativePipeline
from engine.sampling.distribution import Dist
from engine.sampling.processors import LogitsProcessor
from engine.sampling.rejection import residual, verify, verify_window
from fixtures.distribution_check import assert_follows_target


def test_rejection_sampler_emits_p_even_against_a_long_tail_of_tiny_q() -> None:
    """q = (0.39, 0.6, then 400,000 weights of 2.5e-8) against p = (0.5, 0.5).

    N = 200,000 draws; each frequency has sd sqrt(0.25/N) = 0.00112; the bound 5.5 sd = 0.0062
    gives a two-sided false-alarm rate below 4e-8 per token. The tail tokens (total mass 0.01)
    must never be emitted: p is 0 there.
    """
    vocab = 400_002
    q_probs = np.full(vocab, 2.5e-8)
    q_probs[:2] = [0.39, 0.6]
    q = Dist(q_probs / q_probs.sum())
    p = Dist(np.array([0.5, 0.5]), np.array([0, 1]))
    rng = np.random.default_rng(11)
    n = 200_000
    drafts = rng.choice(vocab, size=n, p=q.probs)
    assert (drafts >= 2).sum() > 1000  # the tail is actually proposed
    emitted = Counter()
    for x in drafts:
        accepted, token = verify(lambda k: p, [int(x)], [q], rng, vocab)
        emitted[int(x) if accepted else token] += 1
    assert set(emitted) <= {0, 1}
    assert abs(emitted[0] / n - 0.5) < 0.0062


def test_residual_is_normalised_positive_part_and_falls_back_to_p() -> None:
    p = Dist(np.array([0.2, 0.5, 0.3]))
    q = Dist(np.array([0.5, 0.5]), np.array([0, 1]))
    r = residual(p, q, 3)
    assert r.prob(2) == pytest.approx(1.0) and r.prob(0) == 0.0
    same = residual(p, p, 3)
    assert same is p


def test_one_verification_entry_for_greedy_and_sampled_windows() -> None:
    """verify_window: greedy on argmax ids or on processed rows, split windows, and the sampled path."""
    drafted = [4, 7, 9]
    assert verify_window(drafted, True, argmax=[4, 7, 2, 8]) == (2, 2)  # rejected at the third: the target's own
    assert verify_window(drafted, True, argmax=[4, 7, 9, 8]) == (3, 8)  # all pass: the bonus row's token
    assert verify_window(drafted, False, argmax=[4, 7, 9]) == (3, None)  # part of a split window: nothing yet
    # With logit processors the target's choice is the argmax of the processed row, not the graph's ids.
    rows = [Dist(np.array([0.9, 0.1]), np.array([4, 5])), Dist(np.array([0.2, 0.8]), np.array([7, 3]))]
    assert verify_window(drafted[:1], True, argmax=[5, 5], p_row=lambda k: rows[k]) == (1, 3)
    # Sampled: the same as exact rejection sampling with the same draws.
    p = Dist(np.array([0.5, 0.5]), np.array([4, 5]))
    q = Dist(np.array([1.0]), np.array([4]))
    for seed in range(20):
        got = verify_window([4], True, p_row=lambda k: p, proposals=[q], rng=np.random.default_rng(seed), vocab=10)
        assert got == verify(lambda k: p, [4], [q], np.random.default_rng(seed), 10)


def _proc(**kw) -> LogitsProcessor:
    return LogitsProcessor(GenerationConfig(do_sample=True, **kw).validate(), 1000, [5, 6, 6], {999})


def test_top_p_matches_a_full_sort_and_min_p_and_top_k_keep_the_right_tokens() -> None:
    rng = np.random.default_rng(3)
    for top_p in (0.1, 0.5, 0.9, 0.99, 1.0):
        logits = rng.normal(size=1000).astype(np.float32) * 3
        d = _proc(top_p=top_p).distribution(logits)
        probs = np.exp(logits.astype(np.float64) - logits.max())
        probs /= probs.sum()
        order = np.argsort(-probs)
        k = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
        expected = set(order[: min(k, 1000)].tolist())
        got = set(range(1000)) if d.ids is None else set(d.ids.tolist())
        assert got == expected
        assert d.probs.sum() == pytest.approx(1.0)
    logits = rng.normal(size=1000).astype(np.float32)
    d = _proc(top_k=7).distribution(logits)
    assert set(d.ids.tolist()) == set(np.argsort(-logits)[:7].tolist())
    d = _proc(min_p=0.5).distribution(logits)
    full = np.exp(logits - logits.max())
    assert set(d.ids.tolist()) == set(np.flatnonzero(full >= 0.5 * full.max()).tolist())


def test_penalties_count_the_prefix_and_min_new_tokens_uses_the_position() -> None:
    logits = np.zeros(1000, np.float32)
    logits[[5, 7, 999]] = [2.0, 2.0, 5.0]
    proc = _proc(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25, min_new_tokens=2)
    proc.commit([7])
    d = proc.distribution(logits, prefix=[7])
    x5 = 2.0 / 2.0  # prompt token: repetition only
    x7 = 2.0 / 2.0 - 0.5 - 0.25 * 2  # generated once + once in the prefix
    assert math.log(d.prob(5) / d.prob(7)) == pytest.approx(x5 - x7)
    d1 = proc.distribution(logits, prefix=[])
    assert d1.prob(999) == 0.0  # 1 generated < 2: stop token masked
    d2 = proc.distribution(logits, prefix=[3])
    assert d2.prob(999) == pytest.approx(math.exp(5) * d2.prob(0))  # 2 generated: stop allowed again


SAMPLED = {
    "temperature": dict(temperature=1.0),
    "top-k + top-p": dict(temperature=0.8, top_k=20, top_p=0.9),
    "min-p + penalties": dict(temperature=1.2, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.5,
                              frequency_penalty=0.3),
}


@pytest.mark.parametrize("draft_name,setting", [("b8_trained", s) for s in SAMPLED] + [("b4_random", "temperature")])
def test_speculative_tokens_follow_the_target_distribution(tiny_qwen3_target, tiny_qwen3_drafts,
                                                           draft_name: str, setting: str) -> None:
    """Goodness of fit of (t2, t3) given the most frequent t1 against the exact target distribution.

    t2 and t3 come out of ONE verification of 2 sampled candidates (accept / residual / bonus paths).
    1,500 runs; categories with expected count < 5 are pooled; chi-square at false-alarm rate 1e-3.
    """
    cfg = GenerationConfig(max_new_tokens=3, num_assistant_tokens=2, do_sample=True, ignore_eos=True,
                           **SAMPLED[setting])
    assert_follows_target(tiny_qwen3_target, tiny_qwen3_drafts[draft_name], cfg)


def test_fixed_seed_reproduces_and_greedy_mixes_with_sampled(tiny_qwen3_target, tiny_qwen3_drafts) -> None:
    spec = SpeculativePipeline.load(tiny_qwen3_target, tiny_qwen3_drafts["b8_trained"], precision="f32")
    alone = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")
    sampled = GenerationConfig(max_new_tokens=40, do_sample=True, temperature=0.9, top_p=0.95, rng_seed=42,
                               ignore_eos=True)
    greedy = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    a = spec.generate("for i in range(10):", sampled, chat=False)
    g = spec.generate("for i in range(10):", greedy, chat=False)
    b = spec.generate("for i in range(10):", sampled, chat=False)
    assert a.token_ids == b.token_ids and a.cumulative_logprob == b.cumulative_logprob
    assert a.cumulative_logprob < 0
    assert g.token_ids == alone.generate("for i in range(10):", greedy, chat=False).token_ids
    c = spec.generate("for i in range(10):", sampled.copy(rng_seed=43), chat=False)
    assert c.token_ids != a.token_ids
