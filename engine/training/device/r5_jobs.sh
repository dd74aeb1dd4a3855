# Fifth data round: the driver, started in its own session by r5_call11_train.sh (it outlives the calls while the
# machine stays warm). Steps: 1. Magpie prompts sampled from the target and the round's ordered prompt file;
# 2. the DSpark job (answers for the new rows, static generator bf16; features; continue the shipped draft);
# 3. the new rows' answers packed for the way back. Each step writes /tmp/<mg|ds>/rc; /tmp/jobs.done at the end.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/mg /tmp/ds
t0=$(date +%s)
python3 -m engine.training.corpus_r5 magpie --target $G --tokenizer /tmp/r5/tok --n ${MG_N:-16384} --batch 2048 \
  --max-new 224 --temperature 1.0 --top-p 0.95 --until ${MG_UNTIL:-150} --bench-hashes /tmp/r5/bench8.json \
  --base /tmp/r5/answers-r3.jsonl.gz --func /tmp/r5/func.jsonl.gz --extra-heldout 64 --out /tmp/r5/round5.jsonl.gz \
  --texts-out /tmp/mg/magpie_texts.jsonl.gz > /tmp/mg/stdout.txt 2>&1
echo $? > /tmp/mg/rc
if [ ! -f /tmp/r5/round5.jsonl.gz ]; then  # no Magpie rows: the round file with the function prompts alone
  python3 -m engine.training.corpus_r5 magpie --target $G --tokenizer /tmp/r5/tok --n 0 --base /tmp/r5/answers-r3.jsonl.gz \
    --func /tmp/r5/func.jsonl.gz --extra-heldout 64 --out /tmp/r5/round5.jsonl.gz >> /tmp/mg/stdout.txt 2>&1
fi
echo "magpie step: $(( $(date +%s) - t0 )) s" >> /tmp/mg/stdout.txt
cp /tmp/r5/answers-r3.jsonl.gz /tmp/r5/answers.jsonl.gz
python3 -m engine.training.gpu_job_dspark --target $G --prompts /tmp/r5/round5.jsonl.gz --data-cache /tmp/r5/answers.jsonl.gz \
  --out /tmp/ds --work /tmp/wds --heldout 256 --new-tokens ${NEW:-320} --gen-impl static --gen-batch 2048 \
  --gen-until ${GEN_UNTIL:-330} --extra-heldout 64 --extra-heldout-kinds magpie,func \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib ${GIB:-80} --steps 1000000 --batch 32 --anchors 192 \
  --lr ${LR:-2e-4} --head-lr-mult 5 --warmup 50 --gamma 4 --tv-weight 0.5 --unary-weight 0.3 --short-block-frac 0.25 \
  --deadline ${D2:-1000} --reserve ${R2:-60} --save-every 2000 --log-every 200 --eval-rows 256 --eval-cands 3,5,7,8 \
  --eval-top-k 8 --split-mib 15 > /tmp/ds/stdout.txt 2>&1
echo $? > /tmp/ds/rc
python3 - <<'PY' >> /tmp/ds/stdout.txt 2>&1
import gzip, json, lzma
n = 0
with gzip.open("/tmp/r5/answers.jsonl.gz", "rt") as f, lzma.open("/tmp/ds/answers-r5-new.jsonl.xz", "wt") as g:
    for line in f:
        d = json.loads(line)
        if d.get("kind") in ("magpie", "func") and d.get("answer"):
            g.write(line if line.endswith("\n") else line + "\n"); n += 1
print("new answers packed:", n)
PY
touch /tmp/jobs.done
