# Third data round, device call 5 of 6, within 30 s of call 4. Run as DEADLINE=<s> GEN_UNTIL=<s> bash engine/training/device/r3_call5_train.sh 2>&1
# carry: .device-carry/q5 (GGUF part 5). Joins and checks the GGUF, then the DSpark job: the 45,336 prompts of
# prompts3 (first 15,868 = the v1/DSpark file, whose first 256 stay the held-out set), the 14,592 cached answers reused,
# the rest answered by the target with the static-cache generator (bf16, batch 2048, <= 384 new tokens) until GEN_UNTIL,
# features for the rows that fit in 75 GiB, training warm-started from ALL weights of the shipped DSpark draft until
# DEADLINE - RESERVE, the draft saved (split for the 16 MiB return limit), then held-out acceptance.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/smol/gguf.part1 /tmp/smol/gguf.part2 /tmp/smol/gguf.part3 /tmp/smol/gguf.part4 .device-carry/q5/gguf.part5 > $G || exit 2
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 2
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/d3/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job_dspark --target $G --prompts /tmp/d3/prompts3.jsonl.gz --data-cache /tmp/d3/answers.jsonl.gz \
  --out /tmp/r5 --work /tmp/w5 --heldout 256 --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 \
  --markov-rank 12 --head vanilla --confidence markov --init-from resources/drafts/smollm2-dspark-b8 \
  --gen-impl static --gen-dtype bfloat16 --gen-batch 2048 --new-tokens 384 --gen-until ${GEN_UNTIL:-220} --max-feature-gib 75 \
  --steps 1000000 --batch 32 --anchors 192 --lr 3e-4 --head-lr-mult 5 --warmup 100 --gamma 4 --tv-weight 0.5 \
  --unary-weight 0.3 --short-block-frac 0.25 --deadline ${DEADLINE:-560} --reserve ${RESERVE:-60} --save-every 1000 \
  --log-every 100 --eval-rows 256 --eval-cands 3,5,7,8 --eval-top-k 8 --split-mib 15
mkdir -p $OUT/draft && cp /tmp/r5/draft/model.safetensors.part-* /tmp/r5/draft/model.safetensors.sha256 /tmp/r5/draft/config.json \
  /tmp/r5/draft/training.json $OUT/draft/; cp /tmp/r5/log.txt /tmp/r5/metrics.json /tmp/d3/answers.jsonl.gz $OUT/
ls -la $OUT $OUT/draft; nvidia-smi --query-gpu=memory.used --format=csv
