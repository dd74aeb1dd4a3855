# DFlash v2 draft (round 4, issue 8), device call 1 (starts the machine). Run from the repo root:
#   bash engine/training/device/v2_call1_smoke.sh 2>&1
# carry: .device-carry/q1 (GGUF bytes 0..14999999), .device-carry/v2 (answers-r3.jsonl.xz: the 37,120 answers of
# round 3 (.device-carry/d3/answers-r3.jsonl.gz recompressed: 5.0 MB instead of 9.3), its sha256, the gguf wheel).
# Copies part 1 to /tmp/smol, the answers to /tmp/d3 (gzip again, checked), installs the wheel, then smoke-runs the
# whole job on a random SmolLM2 at the real shapes: --variant dflash_v2 (1 layer, selector rank 8, warm start from
# the shipped v1 draft), then the DSpark path of the same (refactored) job. Keeps /tmp while the machine stays warm:
# issue the next call within 30 s.
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/smol /tmp/d3 && cp .device-carry/q1/gguf.part1 /tmp/smol/ && cp .device-carry/v2/*.whl /tmp/d3/ || exit 2
python3 - <<'PY' || exit 2
import gzip, hashlib, lzma
raw = lzma.open(".device-carry/v2/answers-r3.jsonl.xz").read()
want = open(".device-carry/v2/answers-r3.jsonl.sha256").read().split()[0]
assert hashlib.sha256(raw).hexdigest() == want, "answers sha256 mismatch"
with gzip.open("/tmp/d3/answers-r3.jsonl.gz", "wb", compresslevel=1) as f:
    f.write(raw)
print("answers:", raw.count(b"\n"), "rows")
PY
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/d3/*.whl || exit 3
set +x
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job_dspark --variant dflash_v2 --target random:smollm2 \
  --data-cache /tmp/d3/answers-r3.jsonl.gz --max-prompts 2000 --out /tmp/smoke2 --work /tmp/ws2 --heldout 256 \
  --layers 1 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 8 --selector-top-k 16 \
  --init-backbone resources/drafts/smollm2-dflash-b8 --max-feature-gib 75 --steps 40 --batch 32 --anchors 256 \
  --lr 4e-4 --head-lr-mult 5 --warmup 10 --gamma 4 --short-block-frac 0.25 --log-every 10 --save-every 0 \
  --eval-rows 16 --eval-cands 1,3,7 --eval-top-k 16,8 --max-mb 12.5 --split-mib 15
python3 -m engine.training.gpu_job_dspark --target random:smollm2 --data-cache /tmp/d3/answers-r3.jsonl.gz \
  --max-prompts 1000 --out /tmp/smokeds --work /tmp/wsd --heldout 256 --layers 2 --block-size 8 \
  --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib 75 --steps 20 --batch 32 --anchors 192 \
  --warmup 5 --log-every 10 --save-every 0 --eval-rows 8 --eval-cands 3,8 --eval-top-k 8 --split-mib 15
cp /tmp/smoke2/log.txt $OUT/smoke2.log; cp /tmp/smoke2/metrics.json $OUT/smoke2.metrics.json
cp /tmp/smoke2/draft/config.json $OUT/smoke2.config.json; cp /tmp/smoke2/draft/model.safetensors $OUT/smoke2.model.safetensors
cp /tmp/smokeds/log.txt $OUT/smokeds.log
ls -la /tmp/smol /tmp/d3 /tmp/site | head -20; nvidia-smi --query-gpu=memory.used --format=csv
