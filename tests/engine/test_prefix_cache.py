"""Prefix caching (issue 23): block keys, reuse, partial tails, LRU eviction, reference counts under
preemption and cancellation, the draft's state after a hit, and greedy output equal to the run without
the cache token for token (f32), with and without a draft, over random add/cancel/finish sequences.

The block-table tests need no model. The pipeline tests run the tiny fixtures at precision="f32" and
compare every request with a pipeline of the same kind without prefix caching; each also asserts that
the cache really served tokens (and, where it matters, in which form the draft resumed), so a cache
that never hits cannot pass.
"""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.config import GenerationConfig
from engine.models.kv_blocks import BlockTable
from engine.pipeline import SpeculativePipeline
from engine.prefix_cache import DraftPart, PrefixCache, chain_hashes
from engine.scheduler import SchedulerConfig
from fixtures.tiny_drafts import TRAIN_PROMPTS

BS = 4  # block size of the model-free tests


# ---- keys ---------------------------------------------------------------------------------------------


def test_chain_hashes_name_the_whole_prefix() -> None:
    a = list(range(10))
    keys = chain_hashes(a, BS, [])
    assert len(keys) == 2  # the partial tail (2 tokens) has no key
    assert chain_hashes(a[:8] + [99, 98], BS, []) == keys  # only the tail differs
    assert chain_hashes(a + [5, 5], BS, list(keys)) == chain_hashes(a + [5, 5], BS, [])  # extending = from scratch
    b = [7] + a[1:]  # the first block differs: so does every key after it, though block 2 is the same
    kb = chain_hashes(b, BS, [])
    assert kb[0] != keys[0] and kb[1] != keys[1]
    assert len(set(keys)) == 2  # same block content at another place is another key
    assert chain_hashes([1, 2, 3, 4] * 2, BS, [])[0] != chain_hashes([1, 2, 3, 4] * 2, BS, [])[1]


# ---- the block table with a cache ---------------------------------------------------------------------


def _table(num_blocks: int, cap_blocks: int = 100, draft: bool = False) -> tuple[BlockTable, PrefixCache]:
    t = BlockTable(num_blocks, BS)
    return t, PrefixCache(t, block_bytes=1, cap_bytes=cap_blocks, with_draft=draft)


def _cache_seq(t: BlockTable, c: PrefixCache, seq: int, tokens: list[int]) -> list[bytes]:
    """`seq` computes `tokens` and caches its full blocks."""
    t.grow(seq, len(tokens))
    keys = chain_hashes(tokens, BS, [])
    for j, k in enumerate(keys):
        c.insert(k, t.blocks(seq)[j], None)
    return keys


def check_table(t: BlockTable, c: PrefixCache | None) -> None:
    """Every block is exactly one of: free, cached and idle, or held (with refs = its holders)."""
    holders = Counter(b for bl in t._owned.values() for b in bl)
    for seq, bl in t._owned.items():
        assert len(set(bl)) == len(bl), f"sequence {seq} holds a block twice"
    for b in range(t.num_blocks):
        assert t.refs(b) == holders[b], f"block {b}: {t.refs(b)} refs, {holders[b]} holders"
    free, held = set(t._free), set(holders)
    assert len(free) == len(t._free), "a block is free twice"
    idle = set(c._idle) if c is not None else set()
    assert not (free & idle) and not (free & held) and not (idle & held)
    assert len(free) + len(idle) + len(held) == t.num_blocks
    if c is not None:
        assert idle <= set(c._key) and not (free & set(c._key))
        assert all(c._block[k] == b for b, k in c._key.items())


def test_reuse_shares_blocks_and_counts_references() -> None:
    t, c = _table(8)
    keys = _cache_seq(t, c, 0, list(range(10)))  # 3 blocks, 2 full and cached
    hit = c.lookup(chain_hashes(list(range(8)) + [50, 51, 52, 53], BS, []))
    assert hit.blocks == t.blocks(0)[:2]
    t.adopt(1, hit.blocks)
    assert [t.refs(b) for b in hit.blocks] == [2, 2]
    t.grow(1, 12)  # its own third block, past the shared ones
    assert t.blocks(1)[2] not in t.blocks(0)
    check_table(t, c)
    t.release(0)
    assert [t.refs(b) for b in hit.blocks] == [1, 1] and c.idle_blocks == 0  # still held by 1: not evictable
    t.release(1)
    assert c.idle_blocks == 2 and t.free_blocks == 8
    assert c.lookup(keys).blocks == hit.blocks  # cached after both ended
    check_table(t, c)


def test_eviction_is_lru_from_the_prefix_end_and_never_held() -> None:
    t, c = _table(6)
    a = _cache_seq(t, c, 0, list(range(8)))  # A: blocks a0 a1
    b = _cache_seq(t, c, 1, list(range(100, 108)))  # B: blocks b0 b1
    a_blocks, b_blocks = list(t.blocks(0)), list(t.blocks(1))
    t.release(0)  # idle order: a1, a0 (a prefix's end goes first)
    t.release(1)  # then b1, b0
    t.adopt(2, c.lookup(b[:1]).blocks)  # a request holds b0 again: b0 leaves the idle list
    t.grow(3, 4 * BS)  # 2 free blocks, then evicts a1, a0 in that order
    assert t.blocks(3)[2:] == [a_blocks[1], a_blocks[0]]
    assert c.lookup(a).blocks == []
    t.grow(4, BS)  # next: b1 (b0 is held)
    assert t.blocks(4) == [b_blocks[1]]
    assert c.evictions == 3 and c.cached_blocks == 1 and c.lookup(b).blocks == [b_blocks[0]]
    assert not t.can_grow(5, BS)  # nothing idle left but the held b0
    check_table(t, c)


def test_memory_cap_trims_idle_blocks_oldest_first() -> None:
    t, c = _table(8, cap_blocks=3)
    first = _cache_seq(t, c, 0, list(range(12)))
    second = _cache_seq(t, c, 1, list(range(200, 208)))
    t.release(0)  # 3 idle: within the cap
    assert c.idle_blocks == 3
    t.release(1)  # 5 idle: the two oldest (the end of the first prefix) go
    assert c.idle_blocks == 3 and c.evictions == 2
    assert len(c.lookup(first).blocks) == 1 and len(c.lookup(second).blocks) == 2
    check_table(t, c)


def test_clear_frees_idle_and_leaves_held_blocks_to_their_sequence() -> None:
    t, c = _table(6)
    keys = _cache_seq(t, c, 0, list(range(8)))
    _cache_seq(t, c, 1, list(range(50, 58)))
    t.release(1)
    assert c.clear() == 4
    assert c.cached_blocks == 0 and c.lookup(keys).blocks == []
    assert t.free_blocks == 4  # seq 0 still holds its two
    t.release(0)
    assert t.free_blocks == 6
    check_table(t, c)


def test_lookup_takes_draft_kv_first_then_target_rows() -> None:
    t, c = _table(8, draft=True)
    tokens = list(range(16))
    t.grow(0, 16)
    keys = chain_hashes(tokens, BS, [])
    kv = [np.full((2, BS, 3), j, np.float32) for j in range(2)]
    rows = [np.full((BS, 5), j, np.float32) for j in range(4)]
    parts = [DraftPart(kv=[a + j for a in kv]) if j < 2 else DraftPart(hidden=rows[j]) for j in range(4)]
    for j, (k, p) in enumerate(zip(keys, parts)):
        c.insert(k, t.blocks(0)[j], p)
    hit = c.lookup(keys)
    assert hit.num_blocks == 4 and hit.kv_blocks == 2
    assert [a.shape for a in hit.draft_kv] == [(2, 2 * BS, 3)] * 2
    assert np.array_equal(hit.draft_kv[1][:, BS:], kv[1] + 1)
    assert np.array_equal(hit.draft_hidden, np.concatenate(rows[2:]))
    c.set_draft_kv(keys[3], [a + 3 for a in kv])  # KV after rows: the rows of block 3 are gone, stop before it
    hit = c.lookup(keys)
    assert hit.num_blocks == 3 and hit.kv_blocks == 2
    assert c.draft_bytes == 3 * kv[0].nbytes * 2 + rows[2].nbytes
    t.grow(1, BS)
    with pytest.raises(ValueError, match="draft"):
        c.insert(b"other", t.blocks(1)[0], None)


# ---- pipelines ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dspark_trained(tiny_qwen3_hf: Path) -> Path:
    from fixtures.tiny_variant_drafts import VARIANT_SPECS, build_variant_drafts

    spec = next(s for s in VARIANT_SPECS if s.name == "dspark_trained")
    return build_variant_drafts(tiny_qwen3_hf, tiny_qwen3_hf.parent / "prefix-dspark", (spec,))[spec.name]


@pytest.fixture(scope="module", params=["none", "b8_trained", "dspark_topk"])
def kind(request) -> tuple[Path, Path | None, GenerationConfig]:
    target = request.getfixturevalue("tiny_qwen3_target")
    # full windows (`always`): the draft's candidates are compared step by step with and without the cache
    cfg = GenerationConfig(max_new_tokens=24, ignore_eos=True, draft_policy="always")
    if request.param == "none":
        return target, None, cfg
    if request.param == "b8_trained":
        return target, request.getfixturevalue("tiny_qwen3_drafts")["b8_trained"], cfg
    return target, request.getfixturevalue("dspark_trained"), cfg.copy(markov_head_top_k=8)


def _load(kind, caching: bool, **sched) -> SpeculativePipeline:
    target, draft, _ = kind
    return SpeculativePipeline.load(target, draft, precision="f32",
                                    scheduler=SchedulerConfig(prefix_caching=caching, **sched))


def _run(pipe: SpeculativePipeline, prompt, cfg: GenerationConfig, chat: bool | None = False):
    drafted: list[list[int]] = []
    res = pipe.generate(prompt, cfg, chat=chat, on_event=lambda e: drafted.append(list(e.drafted)))
    return res, drafted


def _parts(pipe: SpeculativePipeline) -> Counter:
    return Counter("kv" if p.kv is not None else "rows" for p in pipe.cache._draft.values())


LONG = (TRAIN_PROMPTS[0] * 6)  # several blocks of the tiny tokenizer's ids


def test_chat_turns_equal_without_cache_and_prefill_only_the_new(kind) -> None:
    """Three chat turns: each reply (and, with a draft, every step's candidates) equals the uncached
    pipeline's; from turn 2 the prompt's cached part is the previous turns' ids, the generated ones."""
    _, draft, cfg = kind
    runs = {}
    for caching in (False, True):
        pipe = _load(kind, caching)
        msgs = [{"role": "user", "content": LONG}]
        turns = []
        for follow in ("Explain it.", "Shorter, please."):
            turns.append(_run(pipe, msgs, cfg, chat=None))
            msgs = msgs + [{"role": "assistant", "content": turns[-1][0].text}, {"role": "user", "content": follow}]
        turns.append(_run(pipe, msgs, cfg, chat=None))
        runs[caching] = (pipe, turns)
    pipe, cached = runs[True]
    _, plain = runs[False]
    for i, ((a, da), (b, db)) in enumerate(zip(plain, cached)):
        assert a.token_ids == b.token_ids, f"turn {i + 1} differs with the prefix cache"
        if draft is not None:
            assert da == db and any(da), f"turn {i + 1}: the draft's candidates differ after the hit"
    bs = pipe.target.blocks.block_size
    assert cached[0][0].metrics.cached_tokens == 0
    for i in (1, 2):
        prev, now = cached[i - 1][0], cached[i][0]
        history = prev.metrics.prompt_tokens + len(prev.token_ids) - 1  # what the previous turn left in the KV
        assert now.metrics.cached_tokens == history // bs * bs > 0, f"turn {i + 1} did not reuse the history"
        assert plain[i][0].metrics.cached_tokens == 0
    if draft is not None:
        assert _parts(pipe)["kv"] > 0  # the draft resumed from its own cached KV


def test_partial_block_tails_are_computed(kind) -> None:
    """Only full blocks are reused; a prompt that is all cached still computes its last token."""
    _, _, cfg = kind
    pipe, ref = _load(kind, True), _load(kind, False)
    bs = pipe.target.blocks.block_size
    base = pipe.encode_prompt(LONG * 2, chat=False)
    assert len(base) > 3 * bs
    first = base[: 2 * bs + 5]
    res, _ = _run(pipe, first, cfg.copy(max_new_tokens=4))
    assert res.metrics.cached_tokens == 0
    cases = [(base[: 2 * bs] + [3, 1, 4], 2 * bs),  # two full blocks, a new tail
             (base[: 2 * bs], bs),  # exactly two blocks: the second is recomputed for its last token
             (base[: bs + 7] + [9] * 20, bs),  # the second block differs inside
             (base[: 2 * bs + 5], 2 * bs)]  # the same prompt again: its partial third block is computed again
    for ids, want in cases:
        got, drafted = _run(pipe, ids, cfg)
        exp, exp_drafted = _run(ref, ids, cfg)
        assert got.metrics.cached_tokens == want, (len(ids), got.metrics.cached_tokens)
        assert got.token_ids == exp.token_ids and drafted == exp_drafted


def test_hit_on_blocks_the_draft_has_not_taken_in_resumes_from_target_rows(kind) -> None:
    """A prompt whose request never drafted (one new token) leaves blocks with target rows; a hit on
    them drafts exactly as without the cache, and the draft's KV then replaces the rows."""
    _, draft, cfg = kind
    if draft is None:
        pytest.skip("no draft")
    pipe, ref = _load(kind, True), _load(kind, False)
    ids = pipe.encode_prompt(LONG, chat=False)
    _run(pipe, ids, cfg.copy(max_new_tokens=1))
    assert _parts(pipe) == Counter({"rows": len(ids) // pipe.target.blocks.block_size})
    more = ids + [5, 6, 7]
    got, drafted = _run(pipe, more, cfg)
    exp, exp_drafted = _run(ref, more, cfg)
    assert got.metrics.cached_tokens > 0 and not _parts(pipe)["rows"]
    assert got.token_ids == exp.token_ids and drafted == exp_drafted


def test_shared_prefix_under_preemption_and_cancel(kind) -> None:
    """Requests sharing a prompt prefix in a cache too small for all: preempted ones are recomputed
    from what is still cached, a cancelled one lets go of its blocks, the others are unchanged; every
    block's reference count equals its holders at every step."""
    _, draft, cfg = kind
    cfg = cfg.copy(max_new_tokens=40)
    probe = _load(kind, False)
    bs = probe.target.blocks.block_size
    prefix = probe.encode_prompt(LONG, chat=False)
    prompts = [prefix + probe.encode_prompt(s, chat=False) for s in TRAIN_PROMPTS[1:5]]
    need = [-(-(len(p) + cfg.max_new_tokens + 9) // bs) for p in prompts]
    pipe = _load(kind, True, num_kv_blocks=max(need) + 2)
    want = {tuple(p): probe.generate(p, cfg).token_ids for p in prompts}
    rids = [pipe.add_request(p, cfg) for p in prompts[:2]]
    cancelled = None
    steps = 0
    while pipe.has_unfinished():
        pipe.step()
        steps += 1
        check_table(pipe.target.blocks, pipe.cache)
        if steps == 3:
            rids += [pipe.add_request(p, cfg) for p in prompts[2:]]
        if steps == 8:
            cancelled = rids[1]
            pipe.cancel(cancelled)
    for rid, p in zip(rids, prompts):
        res = pipe.result(rid)
        if rid == cancelled:
            assert res.finish_reason == "cancelled"
        else:
            assert res.token_ids == want[tuple(p)], f"request {rid} diverged"
    metrics = [pipe.metrics(r) for r in rids]
    assert sum(m.preemptions for m in metrics) > 0, "nothing was preempted"
    assert sum(m.cached_tokens > 0 for m in metrics) >= 2
    assert pipe.cache.stats()["hit_tokens"] > sum(m.cached_tokens for m in metrics)  # recomputes hit too
    assert all(pipe.target.blocks.refs(b) == 0 for b in range(pipe.target.blocks.num_blocks))
    assert pipe.kv_stats()["free_blocks"] == pipe.kv_stats()["total_blocks"]


def test_random_add_cancel_finish_stays_correct(kind) -> None:
    """200 random operations (new prompts, follow-ups of finished requests, cancels, steps) on a small
    cache: every finished request equals the uncached output of its prompt ids, block accounting holds
    after every step, and the run really hit, evicted and preempted."""
    _, draft, cfg = kind
    cfg = cfg.copy(max_new_tokens=12)
    rng = random.Random(23)
    ref = _load(kind, False)
    bs = ref.target.blocks.block_size
    pipe = _load(kind, True, num_kv_blocks=8, max_num_batched_tokens=48, max_num_seqs=6, prefix_cache_mb=1)
    stems = [LONG[: 40 * (i + 1)] for i in range(3)]
    tails = [s[:12] for s in TRAIN_PROMPTS]
    refs: dict[tuple[int, ...], list[int]] = {}
    live: dict[int, list[int]] = {}
    done_texts: list[str] = []
    texts: dict[int, str] = {}
    finished = cancels = 0
    for _ in range(200):
        op = rng.random()
        if op < 0.5 and len(live) < 8:
            if done_texts and rng.random() < 0.4:
                text = rng.choice(done_texts) + rng.choice(tails)  # a follow-up: the ids it generated
            else:
                text = rng.choice(stems) + rng.choice(tails)
            ids = pipe.encode_prompt(text, chat=False)
            if len(ids) + cfg.max_new_tokens + 9 > 5 * bs:  # keep follow-ups of follow-ups within the cache
                continue
            rid = pipe.add_request(text, cfg, chat=False)
            live[rid], texts[rid] = ids, text
        elif op < 0.58 and live:
            pipe.cancel(rng.choice(list(live)))
            cancels += 1
        else:
            for ev in pipe.step() if pipe.has_unfinished() else []:
                if ev.finished:
                    ids = live.pop(ev.request_id)
                    res = pipe.result(ev.request_id)
                    if res.finish_reason == "cancelled":
                        continue
                    key = tuple(ids)
                    if key not in refs:
                        refs[key] = ref.generate(ids, cfg).token_ids
                    assert res.token_ids == refs[key], f"request {ev.request_id} diverged"
                    finished += 1
                    done_texts.append(texts[ev.request_id] + res.text)
            check_table(pipe.target.blocks, pipe.cache)
    while pipe.has_unfinished():
        pipe.step()
        check_table(pipe.target.blocks, pipe.cache)
    s = pipe.cache.stats()
    assert finished >= 10 and cancels >= 5
    assert s["hit_tokens"] >= 5 * bs, s
    assert s["evictions"] > 0, s
    assert sum(pipe.metrics(r).preemptions for r in texts if r in pipe._finished) > 0
    assert pipe.kv_stats()["free_blocks"] == pipe.kv_stats()["total_blocks"]
    assert s["memory_bytes"] <= (1 << 20) + pipe.target.bytes_per_block * 8


def test_switch_and_figures(tiny_qwen3_target: Path) -> None:
    """Off by default in the library; on: figures, clear; the setting is checked."""
    off = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")
    assert not off.prefix_caching and off.prefix_cache_stats() is None and off.clear_prefix_cache() == 0
    pipe = SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32",
                                    scheduler=SchedulerConfig(prefix_caching=True))
    res = pipe.generate(LONG, GenerationConfig(max_new_tokens=4), chat=False)
    s = pipe.prefix_cache_stats()
    bs = pipe.target.blocks.block_size
    assert s["cached_blocks"] == (res.metrics.prompt_tokens + 3) // bs > 0
    assert s["memory_bytes"] == s["cached_blocks"] * pipe.target.bytes_per_block and s["draft_bytes"] == 0
    assert pipe.kv_stats()["cached_blocks"] == s["cached_blocks"]
    assert pipe.clear_prefix_cache() == s["memory_bytes"]
    assert pipe.prefix_cache_stats()["cached_blocks"] == 0
    assert res.metrics.as_dict()["cached_tokens"] == 0
    for bad in ({"prefix_caching": "yes"}, {"prefix_cache_mb": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SchedulerConfig(**bad).validate()


def test_bench_second_turn_rows_per_caching_setting(tiny_qwen3_target: Path, tiny_qwen3_drafts, tmp_path: Path) -> None:
    """`bench --turns 2 --prefix-caching on off`: one engine row per setting, both equal to the target's
    own greedy second turn, the TTFT of every turn in a note; a one-turn set is refused for --turns 2."""
    import json

    from engine.bench.runner import BenchSpec, run_bench
    from engine.errors import DFlashError

    data = tmp_path / "two.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"c{i}", "turns": [LONG[: 60 + 20 * i], "And then?"]})
                              for i in range(2)) + "\n")

    def loader(target, draft, device="CPU", precision="default"):
        return SpeculativePipeline.load(target, draft, device=device, precision="f32")

    spec = BenchSpec(tiny_qwen3_target, [tiny_qwen3_drafts["b8_trained"]], str(data), 2, 8, precision="f32",
                     genai_target=False, genai_dflash=False, turns=2, prefix_caching=[True, False])
    res = run_bench(spec, loader=loader, machine={"machine": "test"})
    names = [r.config for r in res.rows]
    assert len(names) == 4 and sum("[prefix cache on]" in n for n in names) == 2
    assert all(r.matches_target == 2 and r.prompts == 2 for r in res.rows)
    notes = [n for n in res.notes if "TTFT by turn" in n]
    assert len(notes) == 4 and all(n.count("/") == 1 for n in notes)
    assert "--turns 2 --prefix-caching on off" in res.settings["command"]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"id": "x", "prompt": "hi"}) + "\n")
    with pytest.raises(DFlashError, match="--turns 2"):
        run_bench(BenchSpec(tiny_qwen3_target, [], str(one), 1, 4, genai_target=False, genai_dflash=False, turns=2),
                  loader=loader, machine={"machine": "test"})
