#!/usr/bin/env bash
# Sets up .venv (first run only), prepares the embedded default models (first run only), opens the app.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/dflash-studio prepare
exec .venv/bin/dflash-studio gui "$@"
