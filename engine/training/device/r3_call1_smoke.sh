# Third data round (issue 8), device call 1 of 6 (starts the machine). Run from the repo root: bash engine/training/device/r3_call1_smoke.sh 2>&1
# carry: .device-carry/q1 (GGUF bytes 0..14999999), .device-carry/d3 (prompts3.jsonl.gz ids-only, the v1 run's answers.jsonl.gz, gguf wheel)
# Copies part 1 and d3 to /tmp (kept while the machine stays warm: issue the next call within 30 s), installs the wheel,
# times the static-cache generator against HF generate on a random SmolLM2-shaped target at the real batch,
# then smoke-runs the whole DSpark job with --gen-impl static on it (warm start from the shipped DSpark draft).
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/smol /tmp/d3 && cp .device-carry/q1/gguf.part1 /tmp/smol/ && cp .device-carry/d3/* /tmp/d3/ || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/d3/*.whl || exit 3
set +x
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 - <<'PY'
import sys, time, torch
import engine.training.gpu_job_dspark  # stubs openvino (missing on the GPU machine) before the imports below
from engine.training.target_loader import load_target
from engine.training.gpu_job import generate_answers
from engine.training.fast_generate import generate_answers_static
torch.backends.cuda.matmul.allow_tf32 = True
m, info = load_target("random:smollm2", torch.float32, torch.device("cuda"))
g = torch.Generator().manual_seed(0)
P = [torch.randint(100, 49000, (int(n),), generator=g).tolist() for n in torch.randint(60, 160, (2048,), generator=g)]
for impl, n_new in (("static", 16), ("static", 256), ("hf", 32)):
    torch.cuda.synchronize(); t = time.time()
    f = generate_answers_static if impl == "static" else generate_answers
    out = f(m, P, n_new, 2048, -1, 2, log=lambda s: None)
    torch.cuda.synchronize(); dt = time.time() - t
    print(f"{impl}: 2048 x {n_new} new tokens in {dt:.2f}s = {2048 * n_new / dt:.0f} tok/s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
a = generate_answers_static(m, P[:64], 24, 64, -1, 2, log=lambda s: None, dtype=torch.float32)
b = generate_answers(m, P[:64], 24, 64, -1, 2, log=lambda s: None)
print("static f32 == hf (random target, 64 x 24):", sum(x == y for x, y in zip(a, b)), "/ 64", flush=True)
PY
python3 -m engine.training.gpu_job_dspark --target random:smollm2 --prompts /tmp/d3/prompts3.jsonl.gz \
  --data-cache /tmp/work-smoke/answers.jsonl.gz --out $OUT/smoke --work /tmp/work-smoke --max-prompts 1500 --heldout 256 \
  --layers 2 --block-size 8 --taps 1,8,15,22,27 --mask-token-id 16 --markov-rank 12 --head vanilla --confidence markov \
  --init-from resources/drafts/smollm2-dspark-b8 --gen-impl static --gen-batch 2048 --new-tokens 64 --max-feature-gib 75 \
  --steps 30 --batch 32 --anchors 192 --warmup 10 --log-every 10 --save-every 0 --eval-rows 8 --eval-cands 3,8 --split-mib 15
ls -la /tmp/smol /tmp/d3 $OUT/smoke/draft
