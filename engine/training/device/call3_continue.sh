# Device call 3 (issued within 30 s of call 2, on the still-warm machine; carry .device-carry/st only):
# reuse the GGUF and the cached answers in /tmp, generate more answers, continue from call 2's weights.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.gpu_job --target /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf \
  --prompts .device-carry/st/prompts.jsonl.gz --out $OUT --work /tmp/work3 --data-cache /tmp/work/answers.jsonl.gz \
  --init-from /tmp/work/ckpt.pt --heldout 256 --new-tokens 320 --gen-batch 2048 --gen-until 125 --deadline 465 \
  --reserve 75 --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --steps 1000000 --batch 32 \
  --anchors 256 --lr 3e-4 --warmup 50 --gamma 4 --short-block-frac 0.25 --save-every 500 --log-every 100 \
  --eval-rows 256 --eval-cands 1,3,5,7 --split-mib 15 2>&1
cp /tmp/work/answers.jsonl.gz $OUT/
