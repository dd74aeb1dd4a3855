"""`dflash-studio bench --concurrency N ...` (engine/bench/runner.py): N requests in flight per level.

Fast tests drive the runner with the app's fake engine (which already advances every request in
each step); slow ones run the real engine and openvino_genai.ContinuousBatchingPipeline on the tiny
Qwen3 fixture and tie every table figure to the engine's own per-request results and metrics.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from app.fake_engine import fake_loader
from dataclasses import replace

from engine.bench import spec as cc
from engine.bench.runner import BenchSpec, run_bench
from engine.errors import DFlashError

MACHINE = {"machine": "test machine", "device": "CPU (test)"}
ROW_FIELDS = ("config", "concurrency", "prompts", "tokens", "wall_ms", "tok_s", "speedup", "vs_genai_cb",
              "tpot_ms", "tpot_p50_ms", "tpot_p90_ms", "ttft_ms", "ttft_p50_ms", "ttft_p90_ms",
              "tokens_per_step", "tokens_per_pipeline_step", "requests_per_step", "step_ms", "target_ms",
              "draft_step_ms", "matches_target", "preemptions")


def _prompt_file(tmp_path: Path, prompts: list[str]) -> Path:
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "chat": False}) + "\n"
                         for i, p in enumerate(prompts)))
    return f


class _Recording:
    """Wraps a pipeline: keeps every request it was given, its result, and how many were in flight per step."""

    def __init__(self, pipe, log: dict):
        self._pipe = pipe
        self._log = log
        self._live: set = set()

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def add_request(self, prompt, config=None, chat=None):
        rid = self._pipe.add_request(prompt, config, chat)
        self._live.add(rid)
        self._log.setdefault("added", []).append((self._pipe.draft_name, config, list(prompt), rid))
        return rid

    def step(self):
        self._log.setdefault("in_flight", []).append((self._pipe.draft_name, len(self._live)))
        events = self._pipe.step()
        for ev in events:
            if ev.finished:
                self._live.discard(ev.request_id)
                self._log.setdefault("finished", {})[(self._pipe.draft_name, ev.request_id)] = ev
        return events


def _spec(tmp_path, prompts=5, levels=(1, 2, 4), **kw) -> BenchSpec:
    base = dict(target=tmp_path, drafts=[tmp_path / "d8"], dataset=str(_prompt_file(tmp_path, [
        f"prompt number {i} " * (i + 1) for i in range(prompts)])), prompts=None, max_new_tokens=20,
        genai_target=False, genai_dflash=False)
    base.update(kw)
    return BenchSpec(**base, concurrency=list(levels))


# ---- the runner over the fake engine (fast) ---------------------------------------------------
def test_fake_rows_per_level_aggregate_and_tables(tmp_path):
    log: dict = {}
    fake = fake_loader(step_delay_s=0.002)

    def loader(target, draft, device="CPU", precision="default"):
        return _Recording(fake(target, draft, device=device, precision=precision), log)

    events = []
    res = run_bench(_spec(tmp_path), progress=lambda m, f=None: events.append((m, f)), loader=loader,
                          machine=MACHINE)
    assert not res.cancelled
    assert [(r.config, r.concurrency) for r in res.rows] == [
        (c, n) for n in (1, 2, 4) for c in ("target alone (this engine)", "d8 (dflash_v1) n=7 (this engine)")]
    for r in res.rows:
        assert r.prompts == 5 and [q.prompt_id for q in r.requests] == [f"p{i}" for i in range(5)]
        # Aggregate tok/s = every generated token of the batch / the batch's wall time.
        assert r.tokens == sum(len(q.token_ids) for q in r.requests) == 5 * 20
        assert r.tok_s == pytest.approx(1e3 * r.tokens / r.wall_ms)
        assert r.matches_target == 5  # the fake's words do not depend on the draft or the batch
        d = r.as_dict()
        assert d["requests_per_step"] <= r.concurrency + 1e-9
        assert d["tpot_p50_ms"] <= d["tpot_p90_ms"] and d["ttft_p50_ms"] <= d["ttft_p90_ms"]
        # A level's TPOT is its requests' mean; the dict rounds it to 3 places (so it may sit just off the range).
        assert r.tpot_ms == pytest.approx(sum(r.tpots) / len(r.tpots))
        assert min(r.tpots) <= r.tpot_ms <= max(r.tpots) and d["tpot_ms"] == round(r.tpot_ms, 3)
        alone = next(x for x in res.rows if x.concurrency == r.concurrency and x.draft is None)
        assert r.speedup == pytest.approx(r.tok_s / alone.tok_s)
    # The fake's steps cost the same whatever they carry: more requests in flight = more tokens per second.
    alone = {r.concurrency: r for r in res.rows if r.draft is None}
    assert alone[4].tok_s > alone[2].tok_s > alone[1].tok_s
    assert alone[4].as_dict()["tokens_per_pipeline_step"] > 2 * alone[1].as_dict()["tokens_per_pipeline_step"]
    # N requests in flight at every step while prompts remain (the driver refills as soon as one finishes).
    timed = [(d, n) for d, n in log["in_flight"]]
    assert max(n for _d, n in timed) == 4 and min(n for _d, n in timed) >= 1
    rows = json.loads(json.dumps([r.as_dict() for r in res.rows]))
    for f in ROW_FIELDS:
        assert all(f in r for r in rows), f
    assert [r["concurrency"] for r in rows] == [1, 1, 2, 2, 4, 4]
    md = res.markdown()
    assert "| config | concurrency |" in md and "| d8 (dflash_v1) n=7 (this engine) | 4 |" in md
    assert "--concurrency 1 2 4" in md and "machine: test machine" in md
    parsed = list(csv.DictReader(io.StringIO(res.csv())))
    assert [int(p["concurrency"]) for p in parsed] == [1, 1, 2, 2, 4, 4]
    assert float(parsed[5]["tok_s"]) == rows[5]["tok_s"]
    fractions = [f for _m, f in events if f is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_fake_keeps_n_in_flight_and_refills(tmp_path):
    log: dict = {}
    fake = fake_loader()

    def loader(target, draft, device="CPU", precision="default"):
        return _Recording(fake(target, draft, device=device, precision=precision), log)

    spec = _spec(tmp_path, prompts=7, levels=[3], drafts=[])
    res = run_bench(spec, loader=loader, machine=MACHINE)
    (row,) = res.rows
    added = [a for a in log["added"] if a[1].max_new_tokens == 20]  # not the warm-up
    assert len(added) == 7 and row.prompts == 7
    steps = log["in_flight"][-row.pipeline_steps:]
    # Every request the fake holds is the same length, so they finish together and 3 join at once.
    assert [n for _d, n in steps[:5]] == [3] * 5
    assert max(n for _d, n in steps) == 3 and steps[-1][1] == 1  # the last wave holds the 7th alone


def test_concurrency_and_scheduler_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="concurrency=0"):
        run_bench(_spec(tmp_path, levels=[0]), loader=fake_loader(), machine=MACHINE)
    with pytest.raises(ValueError, match="max_num_batched_tokens=0"):
        replace(_spec(tmp_path), scheduler={"max_num_batched_tokens": 0}).validate()
    assert cc.make_scheduler({k: None for k in cc.SCHEDULER_FIELDS}) is None
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        cc.make_scheduler({"max_num_seqs": 0})
    assert cc.effective_scheduler({"max_num_seqs": 4})["max_num_seqs"] == 4


def test_scheduler_options_reach_the_engine():
    from engine.scheduler import SchedulerConfig as cls

    sc = cc.make_scheduler({"max_num_batched_tokens": 64, "max_num_seqs": 4, "num_kv_blocks": 40,
                            "cache_size_mb": None})
    assert isinstance(sc, cls) and (sc.max_num_batched_tokens, sc.max_num_seqs, sc.num_kv_blocks) == (64, 4, 40)


def test_fake_cancel_keeps_finished_levels(tmp_path):
    said = []
    res = run_bench(_spec(tmp_path, levels=[1, 2]), progress=lambda m, f=None: said.append(m),
                          cancel=lambda: any(m.startswith("N=2") for m in said), loader=fake_loader(), machine=MACHINE)
    assert res.cancelled and {r.concurrency for r in res.rows} == {1} and len(res.rows) == 2
    assert "(cancelled)" in res.markdown()


# ---- the real engine and openvino_genai CB on the tiny fixtures (slow) ------------------------
@pytest.mark.slow
def test_real_engine_and_genai_cb_rows_tie_to_engine_results(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts):
    from engine.bench.runner import default_loader
    from fixtures.tiny_drafts import TRAIN_PROMPTS

    log: dict = {}

    def loader(target, draft, device="CPU", precision="default"):
        return _Recording(default_loader(target, draft, device, precision), log)

    prompts = _prompt_file(tmp_path, list(TRAIN_PROMPTS[:4]))
    draft = tiny_qwen3_drafts["b8_trained"]
    spec = BenchSpec(tiny_qwen3_target, [draft], str(prompts), None, 24, precision="f32", genai_target=True,
                     genai_dflash=False, concurrency=[1, 2, 4])
    pipes: dict = {}

    def keep(target, draft, device="CPU", precision="default"):
        p = loader(target, draft, device, precision)
        pipes[p.draft_name] = p
        return p

    res = run_bench(spec, loader=keep)
    names = ["target alone (this engine)", "target alone (openvino_genai CB)",
             "b8_trained (dflash_v1) n=7 (this engine)"]
    assert [(r.config, r.concurrency) for r in res.rows] == [(c, n) for n in (1, 2, 4) for c in names]
    assert "max_num_batched_tokens" in res.settings["genai_scheduler"]
    timed = [(d, rid) for d, c, _ids, rid in log["added"] if c.max_new_tokens == 24]
    by_draft: dict = {}
    for d, rid in timed:
        by_draft.setdefault(d, []).append(rid)
    for r in res.rows:
        assert r.prompts == 4
        # f32 inference: every request at every N writes exactly what the target alone writes alone,
        # openvino_genai's ContinuousBatchingPipeline included.
        assert r.matches_target == 4, (r.config, r.concurrency, r.first_differences)
        d = r.as_dict()
        assert d["requests_per_step"] <= r.concurrency + 1e-9
        if r.engine != "engine":
            assert r.tokens_per_step == pytest.approx(1.0) and r.vs_genai_cb == pytest.approx(1.0)
            continue
        # This batch's requests, in the order the driver added them (4 per level, levels in order).
        level = [1, 2, 4].index(r.concurrency)
        rids = by_draft[r.draft][4 * level: 4 * level + 4]
        pipe = pipes[r.draft]
        results = [pipe.result(rid) for rid in rids]
        # Aggregate tokens = the engine's own results, summed; steps and acceptance = its metrics, summed.
        assert r.tokens == sum(len(x.token_ids) for x in results)
        assert sorted(tuple(q.token_ids) for q in r.requests) == sorted(tuple(x.token_ids) for x in results)
        ms = [x.metrics for x in results]
        assert r.target_steps == sum(m.target_steps for m in ms)
        assert r.tokens_per_step == pytest.approx(sum(m.decode_produced for m in ms) / sum(m.target_steps for m in ms))
        assert r.drafted == sum(m.drafted_total for m in ms) and r.accepted == sum(m.accepted_total for m in ms)
        steps = sum(m.target_steps for m in ms)
        assert d["target_ms"] == pytest.approx(sum(sum(m.target_ms) for m in ms) / steps, abs=1e-3)
        assert d["draft_model_ms"] == pytest.approx(sum(sum(m.draft_model_ms) for m in ms) / steps, abs=1e-3)
        assert d["step_ms"] == pytest.approx(r.wall_ms / r.pipeline_steps, abs=1e-3)
        # TTFT is measured around the step that gave the first token: never below the engine's own.
        ttft_engine = sorted(m.ttft_ms for m in ms)
        assert all(a >= b - 0.05 for a, b in zip(sorted(r.ttfts), ttft_engine))
        assert r.tok_s == pytest.approx(1e3 * r.tokens / r.wall_ms)
        if r.draft:
            assert r.tokens_per_step > 1.2 and r.accepted > 0  # trained on these prompts
    # The driver kept N requests in flight: at N=4 (4 prompts) every first step saw all 4 added.
    assert max(n for d, n in log["in_flight"] if d is None) == 4


def test_draft_policies_run_side_by_side_and_stay_exact(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts):
    """--draft-policy always adaptive: every draft configuration once per policy, in one run, on one pipeline
    whose policy state is swapped per configuration (and kept across levels)."""
    from engine.bench.runner import default_loader
    from engine.draft_policy import DraftPolicy
    from fixtures.tiny_drafts import TRAIN_PROMPTS

    pipes: dict = {}

    def keep(target, draft, device="CPU", precision="default"):
        p = default_loader(target, draft, device, precision)
        pipes[p.draft_name] = p
        return p

    prompts = _prompt_file(tmp_path, list(TRAIN_PROMPTS[:4]))
    draft = tiny_qwen3_drafts["b8_trained"]
    spec = BenchSpec(tiny_qwen3_target, [draft], str(prompts), None, 16, precision="f32", genai_target=False,
                     genai_dflash=False, concurrency=[1, 4], draft_policies=["always", "adaptive"])
    res = run_bench(spec, loader=keep)
    names = ["target alone (this engine)", "b8_trained (dflash_v1) n=7, always (this engine)",
             "b8_trained (dflash_v1) n=7 (this engine)"]  # the default policy (adaptive) carries no suffix
    assert [(r.config, r.concurrency) for r in res.rows] == [(c, n) for n in (1, 4) for c in names]
    assert all(r.matches_target == 4 for r in res.rows), [(r.config, r.first_differences) for r in res.rows]
    assert res.settings["command"].endswith("--draft-policy always adaptive")
    policy = pipes["b8_trained"].policy  # the adaptive configuration ran last
    assert isinstance(policy, DraftPolicy) and policy.target.seen and sum(policy.pooled[False].accepted) > 0
    adaptive = [r for r in res.rows if r.config == names[2]]
    assert all(r.mean_verified is not None and r.mean_verified <= 7 for r in adaptive)
    with pytest.raises(ValueError, match="draft policy 'never'"):
        replace(spec, concurrency=[1], draft_policies=["never"]).validate()


@pytest.mark.slow
def test_cli_bench_concurrency_json_and_out(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts, capsys):
    from engine.cli import main

    out = tmp_path / "results"
    rc = main(["bench", "--target", str(tiny_qwen3_target), "--draft", str(tiny_qwen3_drafts["b8_trained"]),
               "--prompts", "2", "--max-new-tokens", "8", "--precision", "f32", "--concurrency", "1", "2",
               "--json", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    rows = json.loads(cap.out)
    assert [(r["engine"], r["concurrency"]) for r in rows] == [
        (e, n) for n in (1, 2) for e in ("engine", "openvino_genai CB", "engine")]
    for f in ROW_FIELDS:
        assert all(f in r for r in rows), f
    assert all(r["matches_target"] == 2 for r in rows)
    assert "scheduler (this engine):" in cap.err and "openvino_genai CB" in cap.err
    saved = json.loads((out / "results.json").read_text())
    assert "--concurrency 1 2" in saved["settings"]["command"]
    assert "| config | concurrency |" in (out / "results.md").read_text()
    assert (out / "results.csv").read_text().startswith("config,")


@pytest.mark.slow
def test_cli_scheduler_flags_reach_the_engine_and_the_peer(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts, capsys,
                                                           monkeypatch):
    from engine.cli import main
    from engine.pipeline import SpeculativePipeline

    seen = []
    real_load = SpeculativePipeline.load.__func__

    def load(cls, target_dir, draft_dir=None, device="CPU", precision="default", core=None, scheduler=None):
        seen.append(scheduler)
        return real_load(cls, target_dir, draft_dir, device=device, precision=precision, core=core,
                         scheduler=scheduler)

    monkeypatch.setattr(SpeculativePipeline, "load", classmethod(load))
    out = tmp_path / "results"
    # A budget of 16 rows chunks the prompts and splits validation windows; f32 keeps every output exact.
    rc = main(["bench", "--target", str(tiny_qwen3_target), "--draft", str(tiny_qwen3_drafts["b8_trained"]),
               "--prompts", "3", "--max-new-tokens", "12", "--precision", "f32", "--concurrency", "3",
               "--max-num-batched-tokens", "16", "--max-num-seqs", "2", "--json", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert len(seen) == 2 and all(s is not None and (s.max_num_batched_tokens, s.max_num_seqs) == (16, 2)
                                  for s in seen)
    rows = json.loads(cap.out)
    assert [r["engine"] for r in rows] == ["engine", "openvino_genai CB", "engine"]
    assert all(r["matches_target"] == 3 and r["concurrency"] == 3 for r in rows)
    assert all(r["requests_per_step"] <= 2 + 1e-9 for r in rows if r["engine"] == "engine")
    saved = json.loads((out / "results.json").read_text())
    assert "max_num_batched_tokens=16, max_num_seqs=2" in saved["settings"]["genai_scheduler"]
    assert "--max-num-batched-tokens 16 --max-num-seqs 2" in saved["settings"]["command"]
    assert any("max_num_seqs=2" in n for n in saved["notes"])
