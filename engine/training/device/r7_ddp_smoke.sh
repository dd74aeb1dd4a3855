# Data-parallel smoke run of the DSpark job on 2 GPUs (engine/training/distributed.py; tested on CPU with
# gloo only, never on GPUs before this script). Run from the repo root on the 2-GPU kind (nvidia-h200-x2):
#   bash engine/training/device/r7_ddp_smoke.sh 2>&1
# No carry: a random SmolLM2 (--target random:smollm2) answers 1,024 random-token prompts, once on one GPU
# (the reference) and once under torchrun on two (NCCL). Checks: both exit 0, the ranks' final weights agree
# (out/ddp_rank*.json), the training rows are split (metrics.json "distributed"), and the steps/s of both
# runs (each step of the 2-GPU run trains twice the sequences, so the same steps/s = twice the throughput;
# --max-feature-gib 0.4 per GPU: about half the training rows fit on one GPU, all of them on two).
# Leave NVLink multicast off (NCCL_NVLS_ENABLE=0).
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/ddp
python3 - <<'PY' || exit 2
import gzip, json, random
rng = random.Random(0)
with gzip.open("/tmp/ddp/prompts.jsonl.gz", "wt") as f:
    for i in range(1024):
        kind = ("chat", "code", "magpie")[i % 3]
        ids = [rng.randrange(20, 49152) for _ in range(rng.randrange(16, 120))]
        f.write(json.dumps({"id": f"r{i}", "kind": kind, "ids": ids}) + "\n")
PY
set +x
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=8
ARGS="--target random:smollm2 --prompts /tmp/ddp/prompts.jsonl.gz --heldout 64 --new-tokens 64 --gen-impl static
  --gen-batch 512 --extra-heldout 8 --extra-heldout-kinds code,magpie --layers 2 --block-size 8 --taps 1,8,15,22,27
  --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov --init-from resources/drafts/smollm2-dspark-b8
  --max-feature-gib 0.4 --steps 60 --batch 32 --anchors 240 --warmup 5 --log-every 20 --save-every 30 --eval-rows 16
  --eval-cands 3,8 --eval-top-k 8"
# one GPU: the reference (the single-process path, unchanged)
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m engine.training.gpu_job_dspark $ARGS --data-cache /tmp/ddp/a1.jsonl.gz \
  --out /tmp/ddp/one > /tmp/ddp/one.txt 2>&1; echo "one GPU: rc $?"
grep -E "step [0-9]+:|training:|held-out, 8 candidates, walk topk|job " /tmp/ddp/one.txt | tail -n 6
# two GPUs: torchrun, one rank per GPU (cuda:LOCAL_RANK), NCCL
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m engine.training.gpu_job_dspark \
  $ARGS --data-cache /tmp/ddp/a2.jsonl.gz --out /tmp/ddp/two > /tmp/ddp/two.txt 2>&1; echo "two GPUs: rc $?"
grep -E "data parallel|trains on|step [0-9]+:|training:|held-out, 8 candidates, walk topk|job |Error|error" /tmp/ddp/two.txt | tail -n 14
tail -n 5 /tmp/ddp/two/log.rank1.txt
python3 - <<'PY'
import gzip, json
m = json.load(open("/tmp/ddp/two/metrics.json"))
r = [json.load(open(f"/tmp/ddp/two/ddp_rank{k}.json")) for k in (0, 1)]
print("distributed:", m.get("distributed"), "steps", m["train"]["steps"], "loss_last", m["train"]["loss_last"])
print("weights agree:", r[0]["params_sha256_end"] == r[1]["params_sha256_end"],
      "changed:", r[0]["params_sha256_end"] != r[0]["params_sha256_start"],
      "disjoint shards:", not set(r[0]["train_row_ids"]) & set(r[1]["train_row_ids"]))
ids = [json.loads(l)["id"] for l in gzip.open("/tmp/ddp/a2.jsonl.gz", "rt") if l.strip()]
print("cache:", len(ids), "answers,", len(set(ids)), "distinct")
PY
cp /tmp/ddp/one/log.txt $OUT/r7_one.log 2>/dev/null; cp /tmp/ddp/two/log.txt $OUT/r7_two.log 2>/dev/null
cp /tmp/ddp/two/log.rank1.txt $OUT/r7_two_rank1.log 2>/dev/null
cp /tmp/ddp/two/metrics.json $OUT/r7_two_metrics.json 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv
