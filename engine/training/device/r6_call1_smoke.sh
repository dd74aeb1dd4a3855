# Sixth data round (issue 8), device call 1 (starts the machine). Run from the repo root:
#   bash engine/training/device/r6_call1_smoke.sh 2>&1
# carry: .device-carry/r6 (9.5 MB: answers-r3.jsonl.xz + sha256 = rounds 1-3's answers (the 256 held-out rows
# first), answers-r5-new.jsonl.xz + sha256 = round 5's 21,042 Magpie + function answers (its 128 extra held-out
# rows first), bench8.json = the benchmark prompts' word 8-gram hashes, tok/ = the target's tokenizer, the gguf
# wheel). The GGUF then travels in nine 11 MB parts (calls 2-10, r5_call_part.sh with .device-carry/r5p1..9).
# Unpacks to /tmp/r6 (base cache = rounds 1-3 then round 5, one gzip), installs the wheel, then smoke-runs on a
# random SmolLM2: the task-primed sampler + round file, and the DSpark job on that file (10 steps). Issue the next
# call within 30 s.
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/smol /tmp/r6 /tmp/smk && cp -r .device-carry/r6/* /tmp/r6/ || exit 2
sha256sum -c /tmp/r6/answers-r5-new.sha256 || exit 2
python3 - <<'PY' || exit 2
import gzip, hashlib, lzma
raw = lzma.open("/tmp/r6/answers-r3.jsonl.xz").read()
assert hashlib.sha256(raw).hexdigest() == open("/tmp/r6/answers-r3.jsonl.sha256").read().split()[0], "sha256"
new = lzma.open("/tmp/r6/answers-r5-new.jsonl.xz").read()
with gzip.open("/tmp/r6/answers-base.jsonl.gz", "wb", compresslevel=1) as f:
    f.write(raw + new)
print("answers:", raw.count(b"\n"), "+", new.count(b"\n"), "rows")
open("/tmp/r6/tok/tokenizer.json", "wb").write(lzma.open("/tmp/r6/tok/tokenizer.json.xz").read())
PY
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/r6/*.whl || exit 3
set +x
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m engine.training.corpus_r6 primed --target random:smollm2 --tokenizer /tmp/r6/tok --n 512 --batch 512 \
  --max-new 48 --bench-hashes /tmp/r6/bench8.json --base /tmp/r6/answers-base.jsonl.gz --extra-heldout 16 \
  --out /tmp/smk/round6.jsonl.gz --texts-out /tmp/smk/pr.jsonl.gz 2>&1 | tail -n 4
cp /tmp/r6/answers-base.jsonl.gz /tmp/smk/answers.jsonl.gz
python3 -m engine.training.gpu_job_dspark --target random:smollm2 --prompts /tmp/smk/round6.jsonl.gz \
  --data-cache /tmp/smk/answers.jsonl.gz --max-prompts 700 --out /tmp/smkds --work /tmp/wsmk --heldout 256 \
  --new-tokens 48 --gen-impl static --gen-batch 1024 --extra-heldout 16 --extra-heldout-kinds magpie,func,primed \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --max-feature-gib 80 --steps 10 --batch 32 --anchors 240 \
  --warmup 5 --log-every 10 --save-every 0 --eval-rows 16 --eval-cands 3,8 --eval-top-k 8 --split-mib 15 2>&1 | tail -n 30
cp /tmp/smkds/log.txt $OUT/smoke_ds.log 2>/dev/null
ls -la /tmp/smol /tmp/r6 /tmp/site | head -20; nvidia-smi --query-gpu=memory.used --format=csv
