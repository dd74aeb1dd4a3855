# Sixth data round: the driver, started in its own session by r6_call11_train.sh (it outlives the calls while the
# machine stays warm). Steps: 1. task-primed user turns sampled from the target and the round's ordered prompt
# file; 2. the DSpark job (answers for the new rows, static generator bf16; features; continue the shipped draft);
# 3. the new rows' answers packed for the way back. Each step writes /tmp/<pr|ds>/rc; /tmp/jobs.done at the end.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/pr /tmp/ds
t0=$(date +%s)
python3 -m engine.training.corpus_r6 primed --target $G --tokenizer /tmp/r6/tok --n ${PR_N:-20480} --batch 2048 \
  --max-new 200 --temperature 1.0 --top-p 0.95 --until ${PR_UNTIL:-170} --bench-hashes /tmp/r6/bench8.json \
  --base /tmp/r6/answers-base.jsonl.gz --extra-heldout 64 --out /tmp/r6/round6.jsonl.gz \
  --texts-out /tmp/pr/primed_texts.jsonl.gz > /tmp/pr/stdout.txt 2>&1
echo $? > /tmp/pr/rc
echo "primed step: $(( $(date +%s) - t0 )) s" >> /tmp/pr/stdout.txt
cp /tmp/r6/answers-base.jsonl.gz /tmp/r6/answers.jsonl.gz
if [ -f /tmp/r6/round6.jsonl.gz ]; then P="--prompts /tmp/r6/round6.jsonl.gz"; K=magpie,func,primed
else P=""; K=magpie,func; fi  # no primed rows: the earlier rounds' cache alone, in its order
python3 -m engine.training.gpu_job_dspark --target $G $P --data-cache /tmp/r6/answers.jsonl.gz \
  --out /tmp/ds --work /tmp/wds --heldout 256 --new-tokens ${NEW:-256} --gen-impl static --gen-batch 2048 \
  --gen-until ${GEN_UNTIL:-300} --extra-heldout 64 --extra-heldout-kinds $K \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib ${GIB:-78} --steps 1000000 --batch 32 \
  --anchors ${ANCHORS:-240} --lr ${LR:-2e-4} --head-lr-mult 5 --warmup 50 --gamma 4 --tv-weight 0.5 --unary-weight 0.3 \
  --short-block-frac 0.25 --deadline ${D2:-1000} --reserve ${R2:-60} --save-every 2000 --log-every 200 \
  --eval-rows 256 --eval-cands 3,5,7,8 --eval-top-k 8 --split-mib 15 > /tmp/ds/stdout.txt 2>&1
echo $? > /tmp/ds/rc
python3 - <<'PY' >> /tmp/ds/stdout.txt 2>&1
import gzip, json, lzma
n = 0
with gzip.open("/tmp/r6/answers.jsonl.gz", "rt") as f, lzma.open("/tmp/ds/answers-r6-new.jsonl.xz", "wt") as g:
    for line in f:
        d = json.loads(line)
        if d.get("kind") == "primed" and d.get("answer"):
            g.write(line if line.endswith("\n") else line + "\n"); n += 1
print("new answers packed:", n)
PY
touch /tmp/jobs.done
