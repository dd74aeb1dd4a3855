# Third data round, device call 6 of 6, within 30 s of call 5 (no carry: the GGUF, prompts, answers and call 5's draft
# are in /tmp). Run as DEADLINE=<s> GEN_UNTIL=<s> bash engine/training/device/r3_call6_continue.sh 2>&1
# Answers any prompt call 5 did not reach (until GEN_UNTIL), then continues training from call 5's draft (all weights,
# fresh optimizer, lower lr) on every answer that fits, saves, evaluates on the same 256 held-out answers.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f /tmp/r5/draft/model.safetensors ] || cat /tmp/r5/draft/model.safetensors.part-* > /tmp/r5/draft/model.safetensors || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job_dspark --target $G --prompts /tmp/d3/prompts3.jsonl.gz --data-cache /tmp/d3/answers.jsonl.gz \
  --out /tmp/r6 --work /tmp/w6 --heldout 256 --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 \
  --markov-rank 12 --head vanilla --confidence markov --init-from /tmp/r5/draft \
  --gen-impl static --gen-dtype bfloat16 --gen-batch 2048 --new-tokens 384 --gen-until ${GEN_UNTIL:-60} --max-feature-gib 75 \
  --steps 1000000 --batch 32 --anchors 192 --lr ${LR:-2e-4} --head-lr-mult 5 --warmup 50 --gamma 4 --tv-weight 0.5 \
  --unary-weight 0.3 --short-block-frac 0.25 --deadline ${DEADLINE:-560} --reserve ${RESERVE:-60} --save-every 1000 \
  --log-every 100 --eval-rows 256 --eval-cands 3,5,7,8 --eval-top-k 8 --split-mib 15
mkdir -p $OUT/draft && cp /tmp/r6/draft/model.safetensors.part-* /tmp/r6/draft/model.safetensors.sha256 /tmp/r6/draft/config.json \
  /tmp/r6/draft/training.json $OUT/draft/; cp /tmp/r6/log.txt /tmp/r6/metrics.json /tmp/d3/answers.jsonl.gz $OUT/
ls -la $OUT $OUT/draft
