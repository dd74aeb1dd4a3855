# Run from the repo root on the device machine right after call 1: bash engine/training/device/call2_train.sh 2>&1
# carry: .device-carry/p2 (GGUF bytes 49181216..end), .device-carry/st
# Device call 2: GGUF part 2 arrives, the full GGUF is checked, then the real training job.
mkdir -p /tmp/smol
P1=.device-carry/p1/gguf.part1; [ -f "$P1" ] || P1=/tmp/smol/gguf.part1
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat "$P1" .device-carry/p2/gguf.part2 > $G || exit 2
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device-carry/st/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job --target $G --prompts .device-carry/st/prompts.jsonl.gz \
  --out $OUT --work /tmp/work --data-cache /tmp/work/answers.jsonl.gz --heldout 256 --new-tokens 320 --gen-batch 2048 \
  --gen-until ${GEN_UNTIL:-200} --deadline ${DEADLINE:-545} --reserve ${RESERVE:-75} \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --steps 1000000 --batch 32 --anchors 256 \
  --lr 6e-4 --warmup 100 --gamma 4 --short-block-frac 0.25 --save-every 500 --log-every 100 --eval-rows 256 --eval-cands 1,3,5,7 \
  --split-mib 15
cp /tmp/work/answers.jsonl.gz $OUT/ 2>/dev/null; ls -la $OUT $OUT/draft
