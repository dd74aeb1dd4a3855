# Third data round, optional device call 7, within 30 s of call 6 (no carry), only if the session's device time allows.
# Run as DEADLINE=<s> bash engine/training/device/r3_call7_v1.sh 2>&1
# The DFlash v1 draft on the same (now larger) answer set: warm-started from the shipped smollm2-dflash-b8 (all
# weights, fresh optimizer), no new generation (--gen-until 1), held-out acceptance on the same 256 answers.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job --target $G --prompts /tmp/d3/prompts3.jsonl.gz --data-cache /tmp/d3/answers.jsonl.gz \
  --out /tmp/r7 --work /tmp/w7 --init-from resources/drafts/smollm2-dflash-b8 --heldout 256 --new-tokens 384 \
  --gen-impl static --gen-batch 2048 --gen-until 1 --max-feature-gib 75 --deadline ${DEADLINE:-300} --reserve ${RESERVE:-50} \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --steps 1000000 --batch 32 --anchors 256 \
  --lr 3e-4 --warmup 50 --gamma 4 --short-block-frac 0.25 --save-every 500 --log-every 100 \
  --eval-rows 256 --eval-cands 1,3,5,7 --split-mib 15
mkdir -p $OUT/draft && cp /tmp/r7/draft/model.safetensors.part-* /tmp/r7/draft/model.safetensors.sha256 /tmp/r7/draft/config.json \
  /tmp/r7/draft/training.json $OUT/draft/; cp /tmp/r7/log.txt /tmp/r7/metrics.json $OUT/
ls -la $OUT $OUT/draft
