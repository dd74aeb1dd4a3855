# Run from the repo root on the device machine: bash engine/training/device/call1_smoke.sh 2>&1
# carry: .device-carry/p1 (GGUF bytes 0..49181215), .device-carry/st (prompts.jsonl.gz, whl/gguf-0.19.0-py3-none-any.whl)
# Device call 1: GGUF part 1 arrives (kept for call 2), wheels, CUDA smoke of the whole job on a random SmolLM2-shaped target.
set -x
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
nproc; free -g | head -2
mkdir -p /tmp/smol && cp .device-carry/p1/gguf.part1 /tmp/smol/gguf.part1 && ls -la /tmp/smol
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device-carry/st/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 - <<'PY'
import numpy as np, torch, transformers, safetensors, gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize, dequantize
x = np.random.randn(64, 64).astype(np.float32)
for t in (Q.Q4_1, Q.Q8_0):
    print(t.name, float(np.abs(dequantize(quantize(x, t), t) - x).max()))
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())
PY
set +x
python3 -m engine.training.gpu_job --target random:smollm2 --prompts .device-carry/st/prompts.jsonl.gz \
  --out $OUT/smoke --work /tmp/work-smoke --max-prompts 2112 --heldout 64 --new-tokens 128 --gen-batch 2048 \
  --steps 60 --batch 32 --anchors 256 --warmup 10 --short-block-frac 0.25 --log-every 10 --save-every 30 --eval-rows 16 --split-mib 15 \
  --data-cache /tmp/work-smoke/answers.jsonl.gz
nvidia-smi --query-gpu=memory.used --format=csv
