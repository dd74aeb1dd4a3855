"""`dflash-studio train-draft` end to end on the tiny targets (CPU), its resume, its data stage, its refusals."""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine.cli import main as cli_main  # noqa: E402
from fixtures.tiny_drafts import TRAIN_PROMPTS  # noqa: E402

VARIANT_TARGET = {"dflash_v1": "llama", "dspark": "qwen2", "dflash_v2": "qwen3"}


def _prompts_file(path: Path) -> Path:
    """Chat prompts about the tiny tokenizer's own text (stdlib code), a chat log among them."""
    lines = [{"prompt": p} for p in TRAIN_PROMPTS]
    lines += [{"prompt": f"Explain this code:\n{p}x = {i}\n"} for i, p in enumerate(TRAIN_PROMPTS * 3)]
    lines.append({"messages": [{"role": "user", "content": "def walk(tree):"},
                               {"role": "assistant", "content": "for node in tree:"},
                               {"role": "user", "content": "and then?"}]})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def _recipe(path: Path, variant: str, prompts: Path, steps: int = 60, data: str = "", **draft: object) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in draft.items())
    block = 6 if variant != "dflash_v1" else 5
    path.write_text(f'''name = "tiny"
variant = "{variant}"
[draft]
layers = 1
block_size = {block}
taps = [1, 2]
max_mb = 1.0
markov_rank = 8
selector_top_k = 4
conv_group_size = 16
ship_dtype = "float32"
{extra}
[data]
heldout = 4
new_tokens = 40
max_prompt_tokens = 200
gen_batch = 16
{data}
[train]
steps = {steps}
batch_size = 8
num_anchors = 8
lr = 3e-3
head_lr_mult = 1.0
warmup = 10
save_every = 10
log_every = 5
eval_every = 20
bf16 = false
[eval]
rows = 4
candidates = [1, 3]
during_rows = 2
[[sources]]
name = "mine"
type = "file"
path = "{prompts}"
[[stages]]
name = "only"
sources = ["mine"]
init = "fresh"
''', encoding="utf-8")
    return path


def _run(capsys, *args: str) -> tuple[int, list[str], str]:
    code = cli_main(["train-draft", *args])
    out = capsys.readouterr()
    return code, [x for x in out.out.splitlines() if x.strip()], out.err


def _assert_greedy_is_the_targets(target: Path, draft: Path) -> None:
    """The exported draft keeps greedy output token for token the target alone's (f32, two prompts)."""
    from engine.config import GenerationConfig
    from engine.pipeline import SpeculativePipeline

    alone = SpeculativePipeline.load(target, None, precision="f32")
    spec = SpeculativePipeline.load(target, draft, precision="f32")
    gen = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    for prompt in TRAIN_PROMPTS[:2]:
        assert spec.generate(prompt, gen, chat=True).token_ids == alone.generate(prompt, gen, chat=True).token_ids


def _final_heldout_tau(capsys, base: list[str], recipe: Path, out: Path) -> dict:
    """Train `recipe` into `out` (no export) and return its final held-out τ."""
    code, _, err = _run(capsys, *base, "--recipe", str(recipe), "--out", str(out), "--no-export")
    assert code == 0, err
    return json.loads((out / "training.json").read_text())["stages"][0]["heldout_tau"]


def _grown_from_first(capsys, base: list[str], recipe: Path, tmp_path: Path, first: dict, grown: str) -> list[str]:
    """Train `recipe` into tmp_path/b from the first run's checkpoint (tmp_path/a): the record says the draft
    was `grown`, and its held-out τ before training is the first run's final τ. Returns the run's output lines."""
    code, out, err = _run(capsys, *base, "--recipe", str(recipe), "--out", str(tmp_path / "b"),
                          "--init", str(tmp_path / "a" / "checkpoint"))
    assert code == 0, err
    stage = json.loads((tmp_path / "b" / "training.json").read_text())["stages"][0]
    assert grown in stage["init"]
    assert stage["heldout_start"] == pytest.approx(first, abs=1e-6)
    return out


@pytest.fixture
def single_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("variant", ["dflash_v1", "dspark", "dflash_v2"])
def test_train_draft_end_to_end(variant: str, tmp_path: Path, capsys, request, single_thread) -> None:
    kind = VARIANT_TARGET[variant]
    hf = request.getfixturevalue(f"tiny_{kind}_hf")
    ir = request.getfixturevalue(f"tiny_{kind}_target")
    online = variant == "dflash_v2"  # features computed per batch; the other two store them
    recipe = _recipe(tmp_path / "r.toml", variant, _prompts_file(tmp_path / "p.jsonl"),
                     data='features = "online"' if online else "")
    code, out, err = _run(capsys, "--target", str(hf), "--variant", variant, "--out", str(tmp_path / "run"),
                          "--recipe", str(recipe), "--device", "cpu")
    assert code == 0, err
    assert "train-draft:" in err and "steps at most" in err  # what the run will take, before it starts
    folder = Path(out[-1])
    assert folder == tmp_path / "run" / "openvino" and (folder / "openvino_model.xml").is_file()
    record = json.loads((tmp_path / "run" / "training.json").read_text())
    loss = record["loss"]
    assert len(loss) >= 10 and sum(loss[-3:]) / 3 < 0.8 * sum(loss[:2]) / 2, loss
    assert record["heldout_tau"] and all(t >= 1.0 for t in record["heldout_tau"].values())
    assert record["stages"][0]["heldout_during"], "held-out τ is logged during training"
    assert record["stages"][0]["data"]["train_rows"] > 0
    assert record["stages"][0]["data"]["online"] is online and (record["stages"][0]["data"]["feature_gib"] == 0) is online
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()
    # the output loads in the engine and keeps greedy output the target's own (f32)
    _assert_greedy_is_the_targets(ir, folder)


def test_killed_run_resumes_from_its_checkpoint(tiny_qwen3_hf: Path, tmp_path: Path, capsys, monkeypatch,
                                                single_thread) -> None:
    import torch

    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"), steps=40)
    args = ["--target", str(tiny_qwen3_hf), "--variant", "dspark", "--out", str(tmp_path / "run"), "--recipe",
            str(recipe), "--device", "cpu", "--no-export"]
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def dying_step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 25:
            raise KeyboardInterrupt  # as if the run were killed at step 26
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", dying_step)
    code, _, _ = _run(capsys, *args)
    assert code == 130
    ckpt = torch.load(tmp_path / "run" / "work" / "stage-0.pt", weights_only=False)
    assert ckpt["step"] == 20  # the last checkpoint (every 10 steps)
    _check_snapshot(tmp_path / "run", tmp_path / "fetched", ckpt["model"], 20)
    answers = (tmp_path / "run" / "work" / "answers.jsonl.gz").read_bytes()
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    code, _, err = _run(capsys, *args)
    assert code == 2 and "--resume" in err  # an earlier run is never overwritten by accident
    code, out, err = _run(capsys, *args, "--resume")
    assert code == 0, err
    assert "resumed from" in err and "at step 20" in err and "answers:" not in err  # nothing answered twice
    assert (tmp_path / "run" / "work" / "answers.jsonl.gz").read_bytes() == answers
    record = json.loads((tmp_path / "run" / "training.json").read_text())
    steps = [s for _, s in record["loss_steps"]]
    assert steps[0] == 1 and steps[-1] == 40 and steps == sorted(steps)  # one run: the losses before the kill kept
    data = record["stages"][0]["data"]
    assert data["answered_this_run"] == 0 and data["answered"] >= data["train_rows"] > 0  # the run's rows, all answered
    assert Path(out[-1]) == tmp_path / "run" / "checkpoint"


def _check_snapshot(run: Path, dest: Path, weights: dict, step: int) -> None:
    """The checkpoint's weights as a draft folder, fetched in parts by launch.sh snapshot as a lease would."""
    import hashlib
    import subprocess
    import tarfile

    import torch

    from engine.drafts import load_draft

    latest = run / "work" / "stage-0.latest"
    assert json.loads((latest / "snapshot.json").read_text())["step"] == step
    launch = Path(__file__).resolve().parents[3] / "engine" / "training" / "launch.sh"
    for _ in range(50):  # one part a call, until none is left
        said = subprocess.run(["sh", str(launch), "snapshot", str(run), str(dest), "1"], capture_output=True,
                              text=True, check=True).stdout
        if said.rstrip().endswith(" 0 left"):
            break
    else:
        raise AssertionError(said)
    sums = next(dest.glob("*.sha256")).read_text().split("\n")
    parts = sorted(dest.glob("*.tar.*"))
    assert len(parts) == len([x for x in sums if x.strip()]) >= 1
    for line in filter(None, sums):
        digest, name = line.split()
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == digest
    (dest / "joined.tar").write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(dest / "joined.tar") as tar:
        tar.extractall(dest / "x", filter="data")
    folder = dest / "x" / "stage-0.latest"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in latest.iterdir())
    model, _, _ = load_draft(folder)
    got = model.state_dict()
    for k, v in weights.items():  # the weights of that checkpoint (ship dtype float32 in the tiny recipe)
        assert torch.equal(got[k].float(), v.float().cpu()), k


def test_a_resumed_stage_trains_only_for_what_its_time_budget_has_left() -> None:
    from engine.training.trainer import budget_progress

    assert budget_progress(0.0, 90.0, 360.0) == 0.25
    assert budget_progress(358.0, 2.0, 360.0) == 1.0  # killed at 358 s of 360: the resumed run stops after 2 s
    assert budget_progress(100.0, 0.0, 400.0) == 0.25  # the runs before the resume count from its first step
    assert budget_progress(500.0, 1.0, None) == 0.0  # no budget: progress is by steps alone


def test_a_stage_from_given_weights_reports_their_heldout_tau(tiny_qwen3_hf: Path, tmp_path: Path, capsys,
                                                              single_thread) -> None:
    """A fine-tuning run (--init) measures the weights it starts from on its held-out rows, so its
    record shows what the stage gained: here the weights are the first run's result, and the same
    held-out rows must give the first run's final τ again."""
    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"), steps=20)
    base = ["--target", str(tiny_qwen3_hf), "--variant", "dspark", "--recipe", str(recipe), "--device", "cpu",
            "--no-export"]
    code, out, err = _run(capsys, *base, "--out", str(tmp_path / "a"))
    assert code == 0, err
    first = json.loads((tmp_path / "a" / "training.json").read_text())["stages"][0]
    assert first["heldout_start"] == {}  # a fresh draft has nothing to compare with
    code, _, err = _run(capsys, *base, "--out", str(tmp_path / "b"), "--init", out[-1], "--steps", "5")
    assert code == 0, err
    assert "held-out tau of the starting weights" in err
    start = json.loads((tmp_path / "b" / "training.json").read_text())["stages"][0]["heldout_start"]
    assert start.keys() == first["heldout_tau"].keys()
    assert start == pytest.approx(first["heldout_tau"], abs=1e-6)


def test_a_draft_grows_deeper_from_given_weights_and_ships_int8_rows(tiny_qwen3_hf: Path, tiny_qwen3_target: Path,
                                                                     tmp_path: Path, capsys, monkeypatch,
                                                                     single_thread) -> None:
    """A recipe with more layers than the --init draft grows it: the new layer starts as an identity, so
    the grown draft's held-out τ before training is the first run's final τ; it then trains (here with the trained
    weights held: `trained_lr_mult = 0`, so only the new layer moves), saves its wide weights as int8 rows (a third
    of float32's bytes), exports, and keeps greedy output the target's."""
    import torch
    from safetensors.torch import load_file

    from engine.drafts import checkpoint

    monkeypatch.setattr(checkpoint, "INT8_MIN_COLUMNS", 16)  # the tiny draft's rows are narrow
    prompts = _prompts_file(tmp_path / "p.jsonl")
    base = ["--target", str(tiny_qwen3_hf), "--variant", "dspark", "--device", "cpu"]
    first = _final_heldout_tau(capsys, base, _recipe(tmp_path / "a.toml", "dspark", prompts, steps=20), tmp_path / "a")
    deeper = _recipe(tmp_path / "b.toml", "dspark", prompts, steps=5).read_text()
    deeper = deeper.replace("layers = 1", "layers = 2").replace('ship_dtype = "float32"', 'ship_dtype = "int8"')
    deeper = deeper.replace("[train]\n", "[train]\ntrained_lr_mult = 0.0\n")
    (tmp_path / "b.toml").write_text(deeper)
    out = _grown_from_first(capsys, base, tmp_path / "b.toml", tmp_path, first, "grown to 2 layers")
    ckpt = tmp_path / "b" / "checkpoint"
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["weight_storage"] == "int8"
    stored = load_file(str(ckpt / "model.safetensors"))
    assert stored["layers.1.mlp.down_proj.weight"].dtype == torch.int8
    assert "layers.1.mlp.down_proj.weight_scale" in stored
    before, after = checkpoint.read_state(tmp_path / "a" / "checkpoint"), checkpoint.read_state(ckpt)
    stored_before = checkpoint.from_int8_rows(checkpoint.int8_rows(before))  # as the int8 checkpoint stores them
    for name, w in stored_before.items():  # the trained weights held: exactly their storage round trip
        assert torch.equal(after[name].float(), w.float()), name
    assert after["layers.1.mlp.down_proj.weight"].abs().max() > 0  # the new layer learned (it started at zero)
    _assert_greedy_is_the_targets(tiny_qwen3_target, Path(out[-1]))
    # a draft is not shrunk
    shallow = deeper.replace("layers = 2", "layers = 1")
    (tmp_path / "c.toml").write_text(shallow)
    code, _, err = _run(capsys, *base, "--recipe", str(tmp_path / "c.toml"), "--out", str(tmp_path / "c"),
                        "--init", str(ckpt), "--no-export")
    assert code != 0 and "can grow, not shrink" in err


def test_a_markov_head_grows_to_the_recipes_rank_from_given_weights(tiny_qwen3_hf: Path, tiny_qwen3_target: Path,
                                                                    tmp_path: Path, capsys, single_thread) -> None:
    """A recipe whose markov_rank is above the --init draft's grows the head: the new successor columns start
    at zero, so the grown draft's held-out τ before training is the first run's final τ (a gated head and a
    Markov-reading confidence head included); training then moves the new columns, and the exported draft keeps
    greedy output the target's."""
    import torch

    from engine.drafts import checkpoint

    prompts = _prompts_file(tmp_path / "p.jsonl")
    base = ["--target", str(tiny_qwen3_hf), "--variant", "dspark", "--device", "cpu"]
    first_recipe = _recipe(tmp_path / "a.toml", "dspark", prompts, steps=20, head="gated", confidence="markov")
    first = _final_heldout_tau(capsys, base, first_recipe, tmp_path / "a")
    (tmp_path / "b.toml").write_text(first_recipe.read_text().replace("markov_rank = 8", "markov_rank = 16")
                                     .replace("steps = 20", "steps = 5"))
    out = _grown_from_first(capsys, base, tmp_path / "b.toml", tmp_path, first, "Markov head grown to rank 16")
    ckpt = tmp_path / "b" / "checkpoint"
    assert json.loads((ckpt / "config.json").read_text())["markov_rank"] == 16
    before, after = checkpoint.read_state(tmp_path / "a" / "checkpoint"), checkpoint.read_state(ckpt)
    assert before["markov_head.markov_w2.weight"].shape[1] == 8
    assert after["markov_head.markov_w2.weight"].shape[1] == 16
    assert after["markov_head.markov_w2.weight"][:, 8:].abs().max() > 0  # the new columns learned (they started at 0)
    assert not torch.equal(after["markov_head.markov_w2.weight"][:, :8].float(), before["markov_head.markov_w2.weight"].float())
    _assert_greedy_is_the_targets(tiny_qwen3_target, Path(out[-1]))
    # a head is not shrunk
    (tmp_path / "c.toml").write_text(first_recipe.read_text().replace("markov_rank = 8", "markov_rank = 4"))
    code, _, err = _run(capsys, *base, "--recipe", str(tmp_path / "c.toml"), "--out", str(tmp_path / "c"),
                        "--init", str(ckpt), "--no-export")
    assert code != 0 and "can grow, not shrink" in err


def test_int8_rows_round_trip_within_half_a_step() -> None:
    """Wide rows go int8 with one scale each and come back within half a quantisation step; narrow
    tables and vectors stay float16; a checkpoint without int8 rows reads back unchanged."""
    import torch

    from engine.drafts.checkpoint import INT8_MIN_COLUMNS, from_int8_rows, int8_rows

    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(12, INT8_MIN_COLUMNS, generator=g) * torch.linspace(0.01, 3.0, 12)[:, None],
             "table": torch.randn(40, 16, generator=g), "norm": torch.ones(8), "zero": torch.zeros(3, INT8_MIN_COLUMNS)}
    packed = int8_rows(state)
    assert packed["w"].dtype == torch.int8 and packed["w_scale"].shape == (12,)
    assert packed["table"].dtype == torch.float16 and packed["norm"].dtype == torch.float16
    back = from_int8_rows(packed)
    assert set(back) == set(state)
    step = state["w"].abs().amax(dim=1) / 127
    assert bool(((back["w"] - state["w"]).abs() <= step[:, None] / 2 + 1e-7).all())
    assert torch.equal(back["zero"], state["zero"])
    assert from_int8_rows({"x": torch.ones(2, 2), "x_scale": torch.ones(2)})["x_scale"].shape == (2,)  # float x: kept


def test_train_draft_trains_over_the_sub_vocabulary_it_ships(tiny_qwen3_hf: Path, tiny_qwen3_target: Path,
                                                            tmp_path: Path, capsys, monkeypatch, single_thread) -> None:
    """On a target with a large vocabulary (here: a sub-vocabulary of 128 of the tiny 768 forced) the
    run trains and measures the logits over the set the exported draft scores, the loss falls, and
    the draft keeps greedy output the target's own."""
    from engine.models import draft_vocab

    monkeypatch.setattr(draft_vocab, "DEFAULT_SIZE", 128)
    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"))
    code, out, err = _run(capsys, "--target", str(tiny_qwen3_hf), "--variant", "dspark", "--out", str(tmp_path / "run"),
                          "--recipe", str(recipe), "--device", "cpu")
    assert code == 0, err
    assert "logits over the draft's 128-token sub-vocabulary" in err
    record = json.loads((tmp_path / "run" / "training.json").read_text())
    assert record["stages"][0]["logits_vocab"] == 128
    loss = record["loss"]
    assert sum(loss[-3:]) / 3 < 0.8 * sum(loss[:2]) / 2, loss
    assert record["heldout_tau"] and all(t >= 1.0 for t in record["heldout_tau"].values())
    vocab = json.loads((tmp_path / "run" / "checkpoint" / "draft_vocabulary.json").read_text())
    assert vocab["size"] == 128
    _assert_greedy_is_the_targets(tiny_qwen3_target, Path(out[-1]))


def test_a_stage_trains_and_ships_the_sub_vocabulary_size_it_names(tiny_qwen3_hf: Path, tmp_path: Path, capsys,
                                                                    monkeypatch, single_thread) -> None:
    """`vocab_rows` in a stage's train settings overrides the default size (here forced to 128): the logits train
    over that many rows and the draft's draft_vocabulary.json has as many, so what it learned is what it scores."""
    from engine.models import draft_vocab

    monkeypatch.setattr(draft_vocab, "DEFAULT_SIZE", 128)
    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"), steps=10)
    recipe.write_text(recipe.read_text().replace("steps = 10\n", "steps = 10\nvocab_rows = 192\n", 1))
    code, _, err = _run(capsys, "--target", str(tiny_qwen3_hf), "--variant", "dspark", "--out", str(tmp_path / "run"),
                        "--recipe", str(recipe), "--device", "cpu", "--no-export")
    assert code == 0, err
    assert "logits over the draft's 192-token sub-vocabulary" in err
    record = json.loads((tmp_path / "run" / "training.json").read_text())
    assert record["stages"][0]["logits_vocab"] == 192
    assert json.loads((tmp_path / "run" / "checkpoint" / "draft_vocabulary.json").read_text())["size"] == 192


def test_a_feature_cap_from_the_command_line_replaces_every_stages(tmp_path: Path) -> None:
    from engine.training.recipe import RECIPES_DIR, RecipeError, load_recipe, with_feature_cap

    recipe = load_recipe(RECIPES_DIR / "qwen2.5-coder-0.5b-dspark-b8.toml")
    capped = with_feature_cap(recipe, 44.0)
    assert {recipe.stage_data(s).max_feature_gib for s in recipe.stages} != {44.0}
    assert {capped.stage_data(s).max_feature_gib for s in capped.stages} == {44.0}
    assert [s.train for s in capped.stages] == [s.train for s in recipe.stages]
    with pytest.raises(RecipeError, match="positive"):
        with_feature_cap(recipe, 0)


def _data_recipe(path: Path, seed: int) -> Path:
    path.write_text(f'''variant = "dspark"
[data]
seed = {seed}
[[sources]]
name = "code"
type = "stdlib_code"
count = 25
seed = {seed}
[[sources]]
name = "chat"
type = "composed_chat"
count = 25
seed = {seed}
''', encoding="utf-8")
    return path


def test_data_stage_is_deterministic_for_a_seed(tiny_qwen3_hf: Path, tmp_path: Path, capsys) -> None:
    def prompts(name: str, seed: int) -> list[dict]:
        code, _, err = _run(capsys, "--target", str(tiny_qwen3_hf), "--variant", "dspark", "--out", str(tmp_path / name),
                            "--recipe", str(_data_recipe(tmp_path / f"{name}.toml", seed)), "--stop-after", "prompts",
                            "--device", "cpu")
        assert code == 0, err
        with gzip.open(tmp_path / name / "work" / "prompts.jsonl.gz", "rt") as f:
            return [json.loads(x) for x in f]

    a, b, c = prompts("a", 3), prompts("b", 3), prompts("c", 4)
    assert a == b and len(a) > 20
    assert {r["kind"] for r in a} == {"code", "chat"}
    assert [r["prompt"] for r in a] != [r["prompt"] for r in c]
    bench = json.loads((tmp_path / "a" / "work" / "bench8.json").read_text())
    assert bench["n"] == 8  # the benchmark 8-gram hashes travel with the run (empty where the packages are absent)


def test_a_stage_stopped_after_its_answers_resumes_without_answering_again(tiny_qwen3_hf: Path, tmp_path: Path,
                                                                          capsys, single_thread) -> None:
    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"), steps=20)
    args = ["--target", str(tiny_qwen3_hf), "--variant", "dspark", "--out", str(tmp_path / "run"), "--recipe",
            str(recipe), "--device", "cpu", "--no-export"]
    code, out, err = _run(capsys, *args, "--stop-after", "answers")
    assert code == 0, err
    assert out == [] and "answers:" in err and "continue with the same command" in err
    work = tmp_path / "run" / "work"
    answers = (work / "answers.jsonl.gz").read_bytes()
    assert not (tmp_path / "run" / "training.json").exists() and not list(work.glob("stage-*.pt"))
    code, out, err = _run(capsys, *args, "--resume")
    assert code == 0, err
    assert "answers:" not in err and (work / "answers.jsonl.gz").read_bytes() == answers  # nothing answered twice
    record = json.loads((tmp_path / "run" / "training.json").read_text())
    assert record["stages"][0]["data"]["answered_this_run"] == 0 and Path(out[-1]) == tmp_path / "run" / "checkpoint"


def test_benchmark_prompts_are_dropped() -> None:
    from engine.training import sources as S

    bench = S.ngram_hashes("Write a persuasive essay to convince your friend to join you on a hiking trip this weekend")
    assert S.overlaps("please write a persuasive essay to convince your friend to join you on a hike", bench)
    assert not S.overlaps("Write a persuasive essay about volcanoes.", bench)
    rows = [S.PromptRow("a", "code", "", "def has_close_elements(numbers): ..."), S.PromptRow("b", "code", "", "x")]
    kept, dropped = S.drop_benchmark_overlap(rows, ["def has_close_elements("])
    assert [r.id for r in kept] == ["b"] and dropped == 1


def test_opener_kinds_added_later_leave_earlier_plans_alone(monkeypatch) -> None:
    from engine.training import sources as S

    first_kinds = {"writing", "roleplay", "ask"}
    shares = {"writing": 0.40, "roleplay": 0.30, "ask": 0.30}
    plans = [S.opener_plan(600, 62, shares), S.opener_plan(600, 6)]  # a recipe's shares, and the default ones
    assert all({kind for kind, _ in plan} == first_kinds and len(plan) == 600 for plan in plans)
    # without the later kinds the same plans come out: a recipe's earlier sources keep their turns
    all_kinds = S.OPENERS
    monkeypatch.setattr(S, "OPENERS", tuple(k for k in all_kinds if k[0] in first_kinds))
    assert [S.opener_plan(600, 62, shares), S.opener_plan(600, 6)] == plans
    monkeypatch.setattr(S, "OPENERS", all_kinds)
    wide = S.opener_plan(800, 72, {k: 1.0 for k, _, _ in all_kinds})
    assert {kind for kind, _ in wide} == {k for k, _, _ in all_kinds} and len(wide) == 800
    openers = {k: set(o) for k, _, o in all_kinds}
    assert all(opener in openers[kind] for kind, opener in wide)  # every opener drawn from its own kind


def _refused(capsys, tmp_path: Path, target: Path, recipe: Path | None, variant: str = "dspark") -> str:
    out = tmp_path / "refused"
    args = ["--target", str(target), "--variant", variant, "--out", str(out), "--device", "cpu"]
    code, _, err = _run(capsys, *args, *(["--recipe", str(recipe)] if recipe else []))
    assert code == 2, err
    assert not (out / "work" / "answers.jsonl.gz").exists() and not (out / "work" / "prompts.jsonl.gz").exists()
    return err


def test_bad_targets_are_refused_before_work(tiny_qwen3_hf: Path, tmp_path: Path, capsys) -> None:
    prompts = _prompts_file(tmp_path / "p.jsonl")
    recipe = _recipe(tmp_path / "r.toml", "dspark", prompts)
    no_template = tmp_path / "no-template"
    shutil.copytree(tiny_qwen3_hf, no_template)
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    for extra in no_template.glob("chat_template.*"):
        extra.unlink()
    assert "no chat template" in _refused(capsys, tmp_path, no_template, recipe)
    gpt2 = tmp_path / "gpt2"
    shutil.copytree(tiny_qwen3_hf, gpt2)
    c = json.loads((gpt2 / "config.json").read_text())
    c["model_type"] = "gpt2"
    (gpt2 / "config.json").write_text(json.dumps(c))
    assert "model_type 'gpt2' is not supported" in _refused(capsys, tmp_path, gpt2, recipe)
    deep = _recipe(tmp_path / "deep.toml", "dspark", prompts).read_text().replace("taps = [1, 2]", "taps = [1, 3]")
    (tmp_path / "deep.toml").write_text(deep)
    assert "taps [3] are out of range" in _refused(capsys, tmp_path, tiny_qwen3_hf, tmp_path / "deep.toml")
    assert "no such file" in _refused(capsys, tmp_path, tmp_path / "missing", recipe)


@pytest.mark.parametrize("edit,why", [
    (("lr = 3e-3", "lr = \"fast\""), "lr must be a number"),
    (("warmup = 10", "warmup = 10\nwarmpu = 3"), "unknown key(s) warmpu"),
    (("sources = [\"mine\"]", "sources = [\"yours\"]"), "names unknown sources yours"),
    (("type = \"file\"", "type = \"web\""), "type 'web' is not one of"),
    (("variant = \"dspark\"", "variant = \"dflash_v2\""), "trains a dflash_v2 draft, not dspark"),
    (("block_size = 6", "block_size = 1"), "block_size must be at least 2"),
    (("steps = 60", "steps = 2.5"), "steps must be a whole number"),
    (("init = \"fresh\"", "init = \"fresh\"\ndata = { heldout = 8 }"), "a stage may set only max_feature_gib"),
])
def test_bad_recipes_are_refused_with_the_reason(edit, why, tiny_qwen3_hf: Path, tmp_path: Path, capsys) -> None:
    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"))
    text = recipe.read_text()
    assert edit[0] in text
    recipe.write_text(text.replace(edit[0], edit[1], 1))
    assert why in _refused(capsys, tmp_path, tiny_qwen3_hf, recipe)


def test_shipped_recipes_parse_and_fit_their_drafts() -> None:
    from engine.training.recipe import RECIPES_DIR, load_recipe

    drafts = Path(__file__).resolve().parents[3] / "resources" / "drafts"
    for name in ("smollm2-dspark-b8", "smollm2-dflash-b8", "smollm2-dflash2-b8"):
        r = load_recipe(RECIPES_DIR / f"{name}.toml")
        cfg = json.loads((drafts / name / "config.json").read_text())
        dc = cfg.get("dflash_config") or {}
        assert r.draft.block_size == (cfg.get("block_size") or dc.get("block_size"))
        assert list(r.draft.taps) == list(dc.get("target_layer_ids") or cfg.get("target_layer_ids"))
        assert r.draft.layers == cfg["num_hidden_layers"]
    ds = load_recipe(RECIPES_DIR / "smollm2-dspark-b8.toml")
    assert [s.name for s in ds.stages] == [f"round-{i}" for i in range(2, 8)]
    assert ds.stage_settings(ds.stage("round-7")).num_anchors == 120
    q = load_recipe(RECIPES_DIR / "qwen2.5-coder-0.5b-dspark-b8.toml")
    # a stage's own [data] keys over the recipe's, the rest shared
    assert q.stage_data(q.stage("chat-4")).max_feature_gib > q.stage_data(q.stage("chat-3")).max_feature_gib
    assert q.stage_data(q.stage("chat-4")).heldout == q.data.heldout


def test_cli_without_torch_says_so(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    code = cli_main(["train-draft", "--target", "x", "--variant", "dspark", "--out", str(tmp_path)])
    assert code == 2 and "needs torch" in capsys.readouterr().err


def test_two_ranks_train_one_draft(tiny_qwen3_hf: Path, tmp_path: Path) -> None:
    """train-draft as torchrun starts it (WORLD_SIZE 2, gloo on CPU): one run, identical weights on both ranks."""
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"), steps=20)
    out = tmp_path / "run"
    args = [sys.executable, "-m", "engine.cli", "train-draft", "--target", str(tiny_qwen3_hf), "--variant", "dspark",
            "--out", str(out), "--recipe", str(recipe), "--device", "cpu", "--no-export"]
    root = Path(__file__).resolve().parents[3]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
        procs.append(subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert results[0][0].strip().splitlines()[-1] == str(out / "checkpoint")
    sha = [[x.split("weights sha256 ")[1] for x in (out / f).read_text().splitlines() if "weights sha256" in x]
           for f in ("log.txt", "log.rank1.txt")]
    assert sha[0] and sha[0] == sha[1]
    record = json.loads((out / "training.json").read_text())
    assert record["device"]["ranks"] == 2 and record["stages"][0]["steps"] == 20


def test_a_stage_samples_its_sources_with_its_own_batch(tiny_qwen3_hf: Path, tmp_path: Path, capsys, monkeypatch,
                                                        single_thread) -> None:
    """A stage's `data` table is what its sampled sources are generated with, not only its answers."""
    import engine.training.data as data_mod

    recipe = _recipe(tmp_path / "r.toml", "dspark", _prompts_file(tmp_path / "p.jsonl"), steps=5)
    recipe.write_text(recipe.read_text().replace('[[stages]]\nname = "only"\nsources = ["mine"]', '''[[sources]]
name = "turns"
type = "magpie"
count = 6
seed = 3
max_new = 9
min_tokens = 1

[[stages]]
name = "only"
sources = ["mine", "turns"]
data = { gen_batch = 4 }''', 1))
    real = data_mod.generate_answers
    batches: list[tuple[int, int]] = []  # (new tokens, batch) of every generate call

    def spy(target, prompts, new_tokens, batch, *a, **k):
        batches.append((new_tokens, batch))
        return real(target, prompts, new_tokens, batch, *a, **k)

    monkeypatch.setattr(data_mod, "generate_answers", spy)
    code, _, err = _run(capsys, "--target", str(tiny_qwen3_hf), "--variant", "dspark", "--out", str(tmp_path / "run"),
                        "--recipe", str(recipe), "--device", "cpu", "--no-export")
    assert code == 0, err
    assert "prompts: turns (magpie, sampled by the target)" in err
    assert (9, 4) in batches  # the sampled turns (max_new 9) at the stage's batch, not [data]'s 16
    assert all(b == 4 for _, b in batches), batches


def test_a_wait_with_a_destination_hands_back_the_newest_checkpoint(tmp_path: Path) -> None:
    """`launch.sh wait OUT S DEST` ends as `snapshot` does, so a lease lost before the next call has
    already returned the weights; before the first checkpoint it still reports the run as running."""
    import subprocess
    import tarfile

    launch = Path(__file__).resolve().parents[3] / "engine" / "training" / "launch.sh"
    run = tmp_path / "run"
    (run / "work").mkdir(parents=True)
    (run / "console.log").write_text("step 300\n")
    early = subprocess.run(["sh", str(launch), "wait", str(run), "0", str(tmp_path / "d0")], capture_output=True,
                           text=True)
    assert early.returncode == 75 and "no snapshot yet" in early.stdout and "still running" in early.stdout

    latest = run / "work" / "stage-0.latest"
    latest.mkdir()
    (latest / "snapshot.json").write_text(json.dumps({"step": 300}))
    (latest / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    (run / "console.rc").write_text("0\n")
    done = subprocess.run(["sh", str(launch), "wait", str(run), "0", str(tmp_path / "d1")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stage-0-step300: 1 parts copied" in done.stdout
    parts = sorted((tmp_path / "d1").glob("*.tar.*"))
    with tarfile.open(parts[0]) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    assert (tmp_path / "x" / "stage-0.latest" / "model.safetensors").read_bytes() == bytes(range(256)) * 4096
    assert not (tmp_path / "d1" / "record.training.json").exists()  # no checkpoint folder: the run did not finish

    # A finished run: its whole record and the sub-vocabulary counted from its answers come back too
    # (neither is in the snapshot, and the answers stay on the machine).
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "draft_vocabulary.json").write_text('{"size": 4}')
    (run / "training.json").write_text('{"stages": []}')
    again = subprocess.run(["sh", str(launch), "wait", str(run), "0", str(tmp_path / "d2")], capture_output=True,
                           text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "d2" / "record.training.json").read_text() == '{"stages": []}'
    assert (tmp_path / "d2" / "draft_vocabulary.json").read_text() == '{"size": 4}'
