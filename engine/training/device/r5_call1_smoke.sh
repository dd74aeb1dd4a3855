# Fifth data round (issue 8), device call 1 (starts the machine). Run from the repo root:
#   bash engine/training/device/r5_call1_smoke.sh 2>&1
# carry: .device-carry/r5 (7.3 MB: answers-r3.jsonl.xz + its sha256, the gguf wheel, func.jsonl.gz = the 7,105
# HumanEval-shaped function prompts (ids only), bench8.json = the 64-bit hashes of the benchmark prompts' word
# 8-grams (hashes only), tok/ = the target's tokenizer (tokenizer.json xz'ed)). The working tree is ~55 MB, so
# the GGUF travels in nine 11 MB parts in calls 2-10 (r5_call_part.sh).
# Unpacks to /tmp/r5, installs the wheel, then smoke-runs on a random SmolLM2: the Magpie sampler (CUDA generator,
# nucleus sampling) + the round file, and the DSpark job on that file (static generator, extra held-out rows,
# --init-from the shipped draft). Issue the next call within 30 s.
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/smol /tmp/r5 /tmp/smk && cp -r .device-carry/r5/* /tmp/r5/ || exit 2
python3 - <<'PY' || exit 2
import gzip, hashlib, lzma
raw = lzma.open("/tmp/r5/answers-r3.jsonl.xz").read()
want = open("/tmp/r5/answers-r3.jsonl.sha256").read().split()[0]
assert hashlib.sha256(raw).hexdigest() == want, "answers sha256 mismatch"
with gzip.open("/tmp/r5/answers-r3.jsonl.gz", "wb", compresslevel=1) as f:
    f.write(raw)
print("answers:", raw.count(b"\n"), "rows")
open("/tmp/r5/tok/tokenizer.json", "wb").write(lzma.open("/tmp/r5/tok/tokenizer.json.xz").read())
PY
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/r5/*.whl || exit 3
set +x
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.corpus_r5 magpie --target random:smollm2 --tokenizer /tmp/r5/tok --n 1024 --batch 512 \
  --max-new 48 --bench-hashes /tmp/r5/bench8.json --base /tmp/r5/answers-r3.jsonl.gz --func /tmp/r5/func.jsonl.gz \
  --extra-heldout 16 --out /tmp/smk/round5.jsonl.gz --texts-out /tmp/smk/mg.jsonl.gz 2>&1 | tail -n 4
cp /tmp/r5/answers-r3.jsonl.gz /tmp/smk/answers.jsonl.gz
python3 -m engine.training.gpu_job_dspark --target random:smollm2 --prompts /tmp/smk/round5.jsonl.gz \
  --data-cache /tmp/smk/answers.jsonl.gz --max-prompts 1300 --out /tmp/smkds --work /tmp/wsmk --heldout 256 \
  --new-tokens 48 --gen-impl static --gen-batch 1024 --extra-heldout 16 --extra-heldout-kinds magpie,func \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib 80 --steps 20 --batch 32 --anchors 192 \
  --warmup 5 --log-every 10 --save-every 0 --eval-rows 16 --eval-cands 3,8 --eval-top-k 8 --split-mib 15 2>&1 | tail -n 30
cp /tmp/smkds/log.txt $OUT/smoke_ds.log 2>/dev/null
ls -la /tmp/smol /tmp/r5 /tmp/site | head -20; nvidia-smi --query-gpu=memory.used --format=csv
