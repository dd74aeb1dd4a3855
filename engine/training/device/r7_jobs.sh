# Seventh data round: the driver, started in its own session by r7_call_train.sh. Steps: 1. one primed sampler per
# GPU at once (corpus_r7 sample, seeds 71, 72, ...), then the merge (repeats of round 6's turns and of each other
# dropped) into the round's ordered prompt file; 2. the DSpark job under torchrun, one rank per GPU (answers for the
# new rows split over the ranks, bf16 static generator; features, each rank its shard; continue the shipped draft);
# 3. the new rows' answers packed for the way back. Each step writes /tmp/<pr|ds>/rc; /tmp/jobs.done at the end.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
NGPU=$(nvidia-smi -L | wc -l)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=8
mkdir -p /tmp/pr /tmp/ds
t0=$(date +%s)
for g in $(seq 0 $((NGPU - 1))); do
  CUDA_VISIBLE_DEVICES=$g python3 -m engine.training.corpus_r7 sample --target $G --tokenizer /tmp/r7/tok \
    --n ${PR_N:-16384} --batch 2048 --max-new 200 --temperature 1.0 --top-p 0.95 --until ${PR_UNTIL:-130} \
    --bench-hashes /tmp/r7/bench8.json --seed $((71 + g)) --id-prefix p7$g --rows-out /tmp/pr/rows$g.jsonl.gz \
    > /tmp/pr/sample$g.txt 2>&1 &
done
wait
python3 -m engine.training.corpus_r7 merge --base /tmp/r7/answers-base.jsonl.gz --rows /tmp/pr/rows*.jsonl.gz \
  --seen /tmp/r7/primed-texts-r6.jsonl.gz --out /tmp/r7/round7.jsonl.gz --texts-out /tmp/pr/primed_texts.jsonl.gz \
  > /tmp/pr/stdout.txt 2>&1
echo $? > /tmp/pr/rc
cat /tmp/pr/sample*.txt >> /tmp/pr/stdout.txt
echo "primed step: $(( $(date +%s) - t0 )) s" >> /tmp/pr/stdout.txt
cp /tmp/r7/answers-base.jsonl.gz /tmp/r7/answers.jsonl.gz
[ -f /tmp/r7/round7.jsonl.gz ] && P="--prompts /tmp/r7/round7.jsonl.gz" || P=""  # else the earlier rounds alone
python3 -m torch.distributed.run --standalone --nproc_per_node=$NGPU -m engine.training.gpu_job_dspark \
  --target $G $P --data-cache /tmp/r7/answers.jsonl.gz \
  --out /tmp/ds --work /tmp/wds --heldout 256 --new-tokens ${NEW:-256} --gen-impl static --gen-batch 2048 \
  --gen-until ${GEN_UNTIL:-300} --extra-heldout 64 --extra-heldout-kinds magpie,func,primed \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib ${GIB:-78} --steps 1000000 --batch 32 \
  --anchors ${ANCHORS:-120} --lr ${LR:-2e-4} --head-lr-mult 5 --warmup 50 --gamma 4 --tv-weight 0.5 --unary-weight 0.3 \
  --short-block-frac 0.25 --deadline ${D2:-1100} --reserve ${R2:-60} --save-every 2000 --log-every 200 \
  --eval-rows 256 --eval-cands 3,5,7,8 --eval-top-k 8 --split-mib 15 > /tmp/ds/stdout.txt 2>&1
echo $? > /tmp/ds/rc
python3 - <<'PY' >> /tmp/ds/stdout.txt 2>&1
import gzip, json, lzma
n = 0
with gzip.open("/tmp/r7/answers.jsonl.gz", "rt") as f, lzma.open("/tmp/ds/answers-r7-new.jsonl.xz", "wt") as g:
    for line in f:
        d = json.loads(line)
        if str(d.get("id", "")).startswith("p7") and d.get("answer"):
            g.write(line if line.endswith("\n") else line + "\n"); n += 1
print("new answers packed:", n)
PY
touch /tmp/jobs.done
