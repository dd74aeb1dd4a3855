"""The DSpark job data parallel (engine/training/distributed.py): two ranks on CPU over gloo, launched
as torchrun would (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT), on the tiny Llama target."""
from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from engine.export.dspark import load_dspark_checkpoint
from engine.training import corpus, gpu_job, gpu_job_dspark
from engine.training import distributed as ddp

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
TIMEOUT_S = 150  # a deadlock (mismatched collectives) shows as a timeout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], logs: Path) -> list[subprocess.CompletedProcess]:
    """Both ranks of `python args` (e.g. -m engine.training.gpu_job_dspark ...), with torchrun's environment."""
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "WORLD_SIZE": str(WORLD), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        out = open(logs / f"stdout.rank{rank}.txt", "w")
        procs.append((subprocess.Popen([sys.executable, *args], cwd=ROOT,
                                       env=env, stdout=out, stderr=subprocess.STDOUT), out))
    done = []
    try:
        for p, out in procs:
            p.wait(timeout=TIMEOUT_S)
            out.close()
            done.append(subprocess.CompletedProcess(p.args, p.returncode))
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
    return done


def test_dspark_job_on_two_ranks(tiny_llama_hf: Path, tmp_path: Path) -> None:
    """Two ranks split the answer generation (rank 0 writes every answer once), hold disjoint shards of
    the training rows that fit in twice --max-feature-gib, take the same steps with averaged gradients
    (identical final weights, not the starting ones), and rank 0 alone evaluates (also the starting
    draft on the extra held-out rows, which the other rank waits for) and writes metrics.json."""
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_hf)
    rows, _ = corpus.build_corpus(12, 12, seed=2)
    prompts = tmp_path / "p.jsonl.gz"
    corpus.write_rows(corpus.tokenize_rows(tok, rows, 160), prompts)
    prows = corpus.read_rows(prompts)
    # the starting draft (so that the job also evaluates it on the extra held-out rows before training)
    tcfg = AutoConfig.from_pretrained(tiny_llama_hf).to_dict()
    torch.manual_seed(3)
    draft, dcfg = gpu_job_dspark.new_dspark_draft(tcfg, 1, 4, [0, 2], 3, 8, "vanilla", True, True, 8)
    init = gpu_job_dspark.ship_dspark(draft, dcfg, tmp_path / "init", torch.float16, {})
    # a feature budget that twice holds about 80 % of all rows' tokens (once: 40 %, fewer training rows)
    per_token = 2 * tcfg["hidden_size"] * 4  # two taps, float32
    gib = 0.8 * sum(len(r.ids) + 24 for r in prows) * per_token / WORLD / 2**30

    out, work, cache = tmp_path / "out", tmp_path / "work", tmp_path / "a.jsonl.gz"
    args = ["--target", str(tiny_llama_hf), "--prompts", str(prompts), "--data-cache", str(cache), "--out", str(out),
            "--work", str(work), "--device", "cpu", "--heldout", "4", "--new-tokens", "24", "--gen-batch", "16",
            "--layers", "1", "--block-size", "4", "--taps", "0,2", "--markov-rank", "8", "--batch", "8",
            "--anchors", "8", "--warmup", "1", "--log-every", "2", "--eval-cands", "2,4", "--eval-rows", "4",
            "--save-every", "2", "--no-bf16", "--steps", "3", "--gen-impl", "static", "--gen-dtype", "float32",
            "--init-from", str(init), "--extra-heldout", "2", "--extra-heldout-kinds", "code,chat",
            "--max-feature-gib", f"{gib:.9f}"]
    tmp_path.joinpath("logs").mkdir()
    done = _launch(["-m", "engine.training.gpu_job_dspark", *args], tmp_path / "logs")
    for rank, p in enumerate(done):
        assert p.returncode == 0, (tmp_path / "logs" / f"stdout.rank{rank}.txt").read_text()[-4000:]

    # the data cache: every prompt answered, each once
    with gzip.open(cache, "rt", encoding="utf-8") as f:
        cached = [json.loads(line) for line in f if line.strip()]
    ids = [d["id"] for d in cached]
    assert len(ids) == len(set(ids)) == len(prows)
    answers = {d["id"]: d["answer"] for d in cached}

    info = [json.loads((work / f"ddp_rank{r}.json").read_text()) for r in range(WORLD)]
    # generation was split: disjoint, non-empty shares that answered every row
    got = [set(i["answered_ids"]) for i in info]
    assert all(got) and not (got[0] & got[1]) and got[0] | got[1] == set(answers)
    # the training rows: the ones that fit in 2 x the budget (file order, after the held-out rows), split
    held = prows[:2]  # --heldout 4, capped at a tenth of 24
    rest = prows[2:]
    extra = [r for r in rest if r.kind == "code"][:2] + [r for r in rest if r.kind == "chat"][:2]
    train = [r for r in rest if r.id not in {e.id for e in extra}]
    def fit(gib_: float) -> list:
        return gpu_job.rows_within_feature_budget(held + extra, train, answers, gib_, per_token, log=lambda s: None)

    budget = fit(WORLD * gib)
    assert 0 < len(fit(gib)) < len(budget) < len(train)  # one rank's budget would hold fewer
    shards = [i["train_row_ids"] for i in info]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(r.id for r in budget)
    assert shards == [[r.id for r in budget[k::WORLD]] for k in range(WORLD)]
    # the same steps, the same final weights, which training changed
    assert info[0]["steps"] == info[1]["steps"] == 3
    assert info[0]["params_sha256_start"] == info[1]["params_sha256_start"]
    assert info[0]["params_sha256_end"] == info[1]["params_sha256_end"] != info[0]["params_sha256_start"]

    m = json.loads((out / "metrics.json").read_text())
    assert m["distributed"]["world_size"] == WORLD and m["distributed"]["backend"] == "gloo"
    assert m["distributed"]["train_rows_per_rank"] == [len(s) for s in shards]
    assert m["distributed"]["answers_per_rank"] == [len(g) for g in got]
    assert m["data"]["prompts_train"] == len(budget) and m["data"]["prompts_extra_heldout"] == 4
    assert m["train"]["steps"] == 3 and m["train"]["loss_last"] is not None
    for key in ("heldout", "heldout_extra", "heldout_extra_init"):
        walk = m[key]["4"]["topk"]["tokens_per_step"]
        assert 1.0 <= walk["all"] <= 5
    # rank 0 alone writes the shared files; the checkpoint holds the trained weights
    assert (out / "draft" / "model.safetensors").is_file() and (work / "ckpt.pt").is_file()
    assert (out / "log.rank1.txt").is_file() and "rank 1 of 2" not in (out / "log.txt").read_text()
    ck = torch.load(work / "ckpt.pt", weights_only=False)
    trained, _ = load_dspark_checkpoint(init)
    trained.load_state_dict(ck["model"])
    assert ck["step"] == 3 and ddp.params_sha256(trained) == info[0]["params_sha256_end"]


# train_dspark alone on two ranks, with a rank that runs out of memory or out of time on its own
_TRAIN = """
import json, sys, torch
from engine.training import distributed as ddp, gpu_job_dspark as J
from engine.training.dflash_train import target_weights
from engine.training.gpu_job import build_flat_data
from engine.training.target_loader import load_target

hf, mode, out = sys.argv[1:4]
world = ddp.world_from_env()
dev = torch.device("cpu")
ddp.init(world, dev)
target, _ = load_target(hf, torch.float32, dev)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(20, 700, (12,), generator=g).tolist() for _ in range(8)]
answers = [torch.randint(20, 700, (16,), generator=g).tolist() for _ in range(8)]
data, _ = build_flat_data(target, prompts, answers, ["chat"] * 8, [0, 2], 4096, torch.float32, lambda s: None)
embed, lm_head = target_weights(target)
torch.manual_seed(world.rank)  # different weights on each rank: training must start from rank 0's
draft, _ = J.new_dspark_draft(target.config.to_dict(), 1, 4, [0, 2], 3, 8, "vanilla", True, True, 32)
real, calls = J.batch_loss, [0]

def flaky(*a, **k):
    calls[0] += 1
    if mode == "oom" and world.rank == 1 and calls[0] == 2:
        raise torch.OutOfMemoryError("simulated")
    return real(*a, **k)

J.batch_loss = flaky
budget = 1e-9 if mode == "time" and world.rank == 1 else None
cfg = J.DSparkTrainConfig(steps=4, batch_size=4, num_anchors=32, warmup=1, bf16=False, log_every=1, save_every=0,
                          time_budget_s=budget)
res = J.train_dspark(draft, data, torch.arange(world.rank, 8, world.size), embed, lm_head, cfg, J.LossWeights(),
                     None, False, lambda s: None, world)
json.dump({"steps": res["steps"], "anchors": res["anchors_final"], "losses": res["losses"],
           "sha": ddp.params_sha256(draft)}, open(out + str(world.rank), "w"))
ddp.close(world)
"""


def test_ranks_agree_on_out_of_memory_and_time_budget(tiny_llama_hf: Path, tmp_path: Path) -> None:
    """An out-of-memory step on one rank alone makes every rank halve its anchors and retry the step
    (no deadlock, the same steps and weights on both); a time budget spent on one rank stops both."""
    script = tmp_path / "train.py"
    script.write_text(_TRAIN, encoding="utf-8")
    for mode, steps, anchors in (("oom", 4, 16), ("time", 0, 32)):
        logs = tmp_path / mode
        logs.mkdir()
        done = _launch([str(script), str(tiny_llama_hf), mode, str(logs / "res")], logs)
        for rank, p in enumerate(done):
            assert p.returncode == 0, (logs / f"stdout.rank{rank}.txt").read_text()[-4000:]
        res = [json.loads((logs / f"res{r}").read_text()) for r in range(WORLD)]
        assert res[0]["steps"] == res[1]["steps"] == steps, mode
        assert res[0]["anchors"] == res[1]["anchors"] == anchors, mode
        assert res[0]["sha"] == res[1]["sha"], mode  # rank 0's start, the same averaged steps
        assert res[0]["losses"] == res[1]["losses"], mode  # logged as the mean over the ranks
        if mode == "oom":
            assert [s for s, _, _ in res[0]["losses"]] == [1, 2, 3, 4]
