# Seventh data round (issue 8), device call 1 (starts the machine; nvidia-h200-x2, or one GPU). Run from the repo root:
#   bash engine/training/device/r7_call1_smoke.sh 2>&1
# carry: .device-carry/r7 (9.5 MB: round 6's carry less the GGUF: answers-r3.jsonl.xz + sha256 (rounds 1-3, the 256
# held-out rows first), answers-r5-new.jsonl.xz + sha256, bench8.json (benchmark 8-gram hashes), tok/, the gguf wheel).
# Then the GGUF in nine parts (r5_call_part.sh, carry .device-carry/r5p1..9) and round 6's answers and primed texts
# (r7_call_r6data.sh, carry .device-carry/r7b). Unpacks to /tmp/r7, installs the wheel, then smoke-runs on a random
# SmolLM2 what the round runs: one primed sampler per GPU at once, the merge, and the DSpark job under torchrun with
# one rank per GPU (NCCL; its first run on GPUs): 10 steps, and the ranks' final weights must agree.
# Issue the next call within 30 s.
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
NGPU=$(nvidia-smi -L | wc -l)
mkdir -p /tmp/smol /tmp/r7 /tmp/smk && cp -r .device-carry/r7/* /tmp/r7/ || exit 2
(cd /tmp/r7 && sed "s#/tmp/r6/##" answers-r5-new.sha256 | sha256sum -c) || exit 2
python3 - <<'PY' || exit 2
import hashlib, lzma
raw = lzma.open("/tmp/r7/answers-r3.jsonl.xz").read()
assert hashlib.sha256(raw).hexdigest() == open("/tmp/r7/answers-r3.jsonl.sha256").read().split()[0], "sha256"
open("/tmp/r7/answers-r3.jsonl", "wb").write(raw)
open("/tmp/r7/answers-r5-new.jsonl", "wb").write(lzma.open("/tmp/r7/answers-r5-new.jsonl.xz").read())
open("/tmp/r7/tok/tokenizer.json", "wb").write(lzma.open("/tmp/r7/tok/tokenizer.json.xz").read())
PY
cat /tmp/r7/answers-r3.jsonl /tmp/r7/answers-r5-new.jsonl | gzip -1 > /tmp/smk/base.jsonl.gz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/r7/*.whl || exit 3
set +x
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=8
for g in $(seq 0 $((NGPU - 1))); do
  CUDA_VISIBLE_DEVICES=$g python3 -m engine.training.corpus_r7 sample --target random:smollm2 --tokenizer /tmp/r7/tok \
    --n 512 --batch 512 --max-new 48 --bench-hashes /tmp/r7/bench8.json --seed $((71 + g)) --id-prefix p7$g \
    --rows-out /tmp/smk/rows$g.jsonl.gz > /tmp/smk/sample$g.txt 2>&1 &
done
wait
tail -n 2 /tmp/smk/sample*.txt
python3 -m engine.training.corpus_r7 merge --base /tmp/smk/base.jsonl.gz --rows /tmp/smk/rows*.jsonl.gz \
  --extra-heldout 16 --recent-kinds magpie,func --out /tmp/smk/round7.jsonl.gz 2>&1 | tail -n 3
cp /tmp/smk/base.jsonl.gz /tmp/smk/answers.jsonl.gz
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=$NGPU -m engine.training.gpu_job_dspark \
  --target random:smollm2 --prompts /tmp/smk/round7.jsonl.gz \
  --data-cache /tmp/smk/answers.jsonl.gz --max-prompts 700 --out /tmp/smkds --work /tmp/wsmk --heldout 256 \
  --new-tokens 48 --gen-impl static --gen-batch 1024 --extra-heldout 16 --extra-heldout-kinds magpie,func,primed \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib 80 --steps 10 --batch 32 --anchors 120 \
  --warmup 5 --log-every 5 --save-every 0 --eval-rows 16 --eval-cands 3,8 --eval-top-k 8 --split-mib 15 \
  > /tmp/smk/ds.txt 2>&1; echo "smoke job: rc $?"
grep -E "data parallel|this rank|step [0-9]+:|training:|held-out, 8|job |Error|error" /tmp/smkds/log.txt | tail -n 14
tail -n 3 /tmp/smkds/log.rank1.txt 2>/dev/null; tail -n 5 /tmp/smk/ds.txt
python3 - <<'PY'
import glob, json
r = [json.load(open(p)) for p in sorted(glob.glob("/tmp/wsmk/ddp_rank*.json"))]
if r:
    print("ranks", len(r), "weights agree:", len({x["params_sha256_end"] for x in r}) == 1,
          "changed:", r[0]["params_sha256_end"] != r[0]["params_sha256_start"],
          "disjoint shards:", not set(r[0]["train_row_ids"]) & set(r[-1]["train_row_ids"]))
PY
cp /tmp/smkds/log.txt $OUT/smoke_ds.log 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
