# DSpark draft, device call 3 of 3, issued within 30 s of call 2 (warm machine). Run as DEADLINE=<s> bash engine/training/device/dspark_call3_train.sh
# carry: .device-carry/p3 (GGUF bytes 71000000..end), .device-carry/ds
# The GGUF is joined and checked, then the real job: the 14,592 cached answers of the v1 run (256 held out: the same
# held-out set as the v1 draft), features, training warm-started from the shipped v1 draft until DEADLINE - RESERVE,
# the draft saved (split for the 16 MiB return limit), then held-out acceptance for 3 walks x 3/5/7/8 candidates.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/smol/gguf.part1 /tmp/smol/gguf.part2 .device-carry/p3/gguf.part3 > $G || exit 2
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 2
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device-carry/ds/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job_dspark --target $G --data-cache .device-carry/ds/answers.jsonl.gz \
  --out $OUT --work /tmp/work --heldout 256 --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 \
  --markov-rank 12 --head vanilla --confidence markov --init-backbone resources/drafts/smollm2-dflash-b8 \
  --steps 1000000 --batch 32 --anchors 192 --lr 4e-4 --head-lr-mult 5 --warmup 100 --gamma 4 --tv-weight 0.5 \
  --unary-weight 0.3 --short-block-frac 0.25 --deadline ${DEADLINE:-360} --reserve ${RESERVE:-40} --save-every 1000 \
  --log-every 100 --eval-rows 256 --eval-cands 3,5,7,8 --eval-top-k 8 --split-mib 15
ls -la $OUT $OUT/draft
