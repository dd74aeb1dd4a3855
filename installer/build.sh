#!/usr/bin/env bash
# Builds the DFlash Studio bundle and its Linux package in one go:
#   dist/installer/dflash-studio/                one-dir bundle (run ./dflash-studio; --self-test checks it)
#   dist/installer/dflash-studio_<ver>_amd64.deb  installs to /opt/dflash-studio, /usr/bin/dflash-studio
#   dist/installer/build-info.json                timings and sizes of this build
#
#   bash installer/build.sh [--no-default-model] [--no-deb] [--out DIR] [--work DIR] [--clean]
#
# Uses the repo's .venv (scripts/bootstrap.sh makes it) and installs the `installer` extra
# (PyInstaller) into it when missing. The dev venv also builds, at build time, what the bundle
# carries instead of torch: the self-test's tiny IRs (installer/make_testdata.py) and, unless
# --no-default-model, the embedded default model (`dflash-studio prepare`, ~4 min the first time,
# reused afterwards). docs/installer.md explains the choices.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

DEFAULT_MODEL=1 DEB=1 CLEAN=0
OUT="$ROOT/dist/installer" WORK="$ROOT/build/installer"
while [ $# -gt 0 ]; do
  case "$1" in
    --no-default-model) DEFAULT_MODEL=0 ;;
    --no-deb) DEB=0 ;;
    --out) OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; shift ;;
    --work) WORK="$(mkdir -p "$2" && cd "$2" && pwd)"; shift ;;
    --clean) CLEAN=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

PY="$ROOT/.venv/bin/python"
t_start=$(date +%s.%N)
stamp() { date +%s.%N; }
took() { python3 -c "print(round($(stamp) - $1, 1))"; }
say() { printf '\n== %s\n' "$*"; }

say "Python environment"
bash scripts/bootstrap.sh
if ! "$PY" -c "import PyInstaller" 2>/dev/null; then
  echo "Installing the installer extra (PyInstaller) into .venv..."
  "$PY" -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[installer]"
fi
"$PY" -m PyInstaller --version

mkdir -p "$WORK" "$OUT"
[ "$CLEAN" = 1 ] && rm -rf "$WORK/pyi" "$WORK/testdata"

say "Self-test models (tiny target + draft, built from the test fixtures)"
t0=$(stamp)
key=$(cat tests/fixtures/tiny_models.py tests/fixtures/tiny_drafts.py installer/make_testdata.py engine/export/*.py \
      2>/dev/null | sha256sum | cut -c1-16)
if [ -f "$WORK/testdata/.key-$key" ]; then
  echo "up to date: $WORK/testdata"
else
  rm -rf "$WORK/testdata"
  "$PY" installer/make_testdata.py "$WORK/testdata" > "$WORK/testdata.log" 2>&1 \
    || { tail -30 "$WORK/testdata.log"; echo "build.sh: building the self-test models failed" >&2; exit 1; }
  touch "$WORK/testdata/.key-$key"
fi
t_testdata=$(took "$t0")

DEFAULT_MODELS=""
t_model=0
if [ "$DEFAULT_MODEL" = 1 ]; then
  say "Embedded default model (SmolLM2-135M-Instruct, int8 OpenVINO IR)"
  t0=$(stamp)
  home="$WORK/default-home"
  DFLASH_STUDIO_HOME="$home" "$PY" -m engine.cli prepare
  # Bundle only the IR folder (and drafts for it, if prepare made any): not the 500 MB HF folder.
  DEFAULT_MODELS="$WORK/default-models"
  rm -rf "$DEFAULT_MODELS" && mkdir -p "$DEFAULT_MODELS"
  cp -al "$home/models/SmolLM2-135M-Instruct-ov" "$DEFAULT_MODELS/"
  if [ -d "$home/models/drafts" ] && [ -n "$(ls -A "$home/models/drafts")" ]; then
    cp -al "$home/models/drafts" "$DEFAULT_MODELS/"
  fi
  t_model=$(took "$t0")
fi

say "PyInstaller bundle"
t0=$(stamp)
rm -rf "$OUT/dflash-studio"
DFLASH_TESTDATA="$WORK/testdata" DFLASH_DEFAULT_MODELS="$DEFAULT_MODELS" \
  "$PY" -m PyInstaller --noconfirm --log-level WARN --workpath "$WORK/pyi" --distpath "$OUT" \
  installer/dflash-studio.spec
t_bundle=$(took "$t0")
for banned in torch transformers optimum nncf; do
  if [ -e "$OUT/dflash-studio/_internal/$banned" ]; then
    echo "build.sh: $banned ended up in the bundle; it must not" >&2; exit 1
  fi
done

say "Self-test of the bundle"
t0=$(stamp)
"$OUT/dflash-studio/dflash-studio" --self-test --output "$WORK/selftest.json" > /dev/null
echo "passed: $WORK/selftest.json"
t_selftest=$(took "$t0")

t_deb=0
DEB_FILE=""
if [ "$DEB" = 1 ]; then
  say "Debian package"
  t0=$(stamp)
  DEB_FILE=$("$PY" installer/linux/make_deb.py "$OUT/dflash-studio" "$OUT" --work "$WORK/deb")
  echo "$DEB_FILE"
  t_deb=$(took "$t0")
fi

"$PY" - "$OUT" "$DEB_FILE" "$t_testdata" "$t_model" "$t_bundle" "$t_selftest" "$t_deb" "$(took "$t_start")" \
  "$DEFAULT_MODEL" <<'PYEOF'
import json, os, sys
from pathlib import Path
out, deb, *times, with_model = sys.argv[1:]
bundle = Path(out) / "dflash-studio"
size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file() and not f.is_symlink())
info = {"bundle": str(bundle), "bundle_mb": round(size / 2**20, 1), "with_default_model": with_model == "1",
        "deb": deb or None, "deb_mb": round(os.path.getsize(deb) / 2**20, 1) if deb else None,
        "seconds": dict(zip(("testdata", "default_model", "pyinstaller", "selftest", "deb", "total"),
                            map(float, times)))}
(Path(out) / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
print(json.dumps(info, indent=2))
PYEOF
