# DFlash v2 round: the training driver, started in the background by v2_call5_train.sh (setsid: it outlives the
# calls while the machine stays warm). D1 / D2: each job's --deadline in seconds from its own start (D2=0 skips
# the DSpark continuation). Each job writes /tmp/<v2|ds>/rc when it ends; /tmp/jobs.done at the end.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/v2 /tmp/ds
# 1. DFlash v2: 1 layer at SmolLM2's width, warm-started from the shipped v1 draft (fc, hidden_norm, layer 0, norm),
#    selector rank 8 (the file must stay <= 12.5 MB in fp16), K = 16, on the 37,120 answers of round 3 (no generation).
python3 -m engine.training.gpu_job_dspark --variant dflash_v2 --target $G --data-cache /tmp/d3/answers-r3.jsonl.gz \
  --out /tmp/v2 --work /tmp/wv2 --heldout 256 --layers 1 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 \
  --markov-rank 8 --selector-top-k 16 --init-backbone resources/drafts/smollm2-dflash-b8 --max-feature-gib 75 \
  --steps 1000000 --batch 32 --anchors 256 --lr ${LR1:-4e-4} --head-lr-mult 5 --warmup 100 --gamma 4 \
  --short-block-frac 0.25 --deadline ${D1:-900} --reserve ${R1:-55} --save-every 2000 --log-every 200 \
  --eval-rows 256 --eval-cands 1,3,5,7 --eval-top-k 16,8 --max-mb 12.5 --split-mib 15 > /tmp/v2/stdout.txt 2>&1
echo $? > /tmp/v2/rc
# 2. DSpark: continue the shipped draft (all weights, fresh optimizer, lower lr) on the same answers.
if [ "${D2:-0}" -gt 0 ]; then
  python3 -m engine.training.gpu_job_dspark --target $G --data-cache /tmp/d3/answers-r3.jsonl.gz \
    --out /tmp/ds --work /tmp/wds --heldout 256 --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 \
    --markov-rank 12 --head vanilla --confidence markov --init-from resources/drafts/smollm2-dspark-b8 \
    --max-feature-gib 75 --steps 1000000 --batch 32 --anchors 192 --lr ${LR2:-1.5e-4} --head-lr-mult 5 --warmup 50 \
    --gamma 4 --tv-weight 0.5 --unary-weight 0.3 --short-block-frac 0.25 --deadline ${D2} --reserve ${R2:-40} \
    --save-every 2000 --log-every 200 --eval-rows 256 --eval-cands 3,5,7,8 --eval-top-k 8 --split-mib 15 \
    > /tmp/ds/stdout.txt 2>&1
  echo $? > /tmp/ds/rc
fi
touch /tmp/jobs.done
