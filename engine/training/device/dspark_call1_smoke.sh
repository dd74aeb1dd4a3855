# DSpark draft, device call 1 of 3 (starts the machine). Run from the repo root: bash engine/training/device/dspark_call1_smoke.sh
# carry: .device-carry/p1 (GGUF bytes 0..34999999), .device-carry/ds (answers.jsonl.gz from the v1 run, gguf wheel)
# GGUF part 1, the cached answers and the gguf wheel go to /tmp (kept while the machine stays warm), then a CUDA smoke
# run of the whole DSpark job on a random SmolLM2-shaped target at the real batch shape (memory, speed, shipping).
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/smol /tmp/ds && cp .device-carry/p1/gguf.part1 /tmp/smol/ && cp .device-carry/ds/answers.jsonl.gz /tmp/ds/ || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device-carry/ds/*.whl || exit 3
set +x
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job_dspark --target random:smollm2 --data-cache /tmp/ds/answers.jsonl.gz \
  --out $OUT/smoke --work /tmp/work-smoke --max-prompts 800 --heldout 256 --layers 2 --block-size 8 \
  --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-backbone resources/drafts/smollm2-dflash-b8 --steps 30 --batch 32 --anchors 192 --warmup 10 \
  --log-every 10 --save-every 0 --eval-rows 8 --eval-cands 3,8 --split-mib 15
ls -la /tmp/smol $OUT/smoke/draft
