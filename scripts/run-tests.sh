#!/usr/bin/env bash
# Sets up .venv (first run only) and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
exec .venv/bin/python -m pytest -q "$@"
