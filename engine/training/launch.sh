#!/bin/sh
# Start `dflash-studio train-draft` in the background on a machine whose shell calls are time-limited,
# then wait for it (docs/training.md, "On a remote GPU machine"):
#   NGPU=2 sh engine/training/launch.sh start OUT --target G --variant dspark ...   # returns at once
#   sh engine/training/launch.sh wait OUT 560      # follows OUT/console.log for up to 560 s; rc 0 when done
# NGPU > 1 runs it under torchrun (data parallel); PYTHON picks the interpreter (default python3).
set -u
cmd=$1; out=$2; shift 2
PY=${PYTHON:-python3}
case $cmd in
  start)
    mkdir -p "$out"
    if [ "${NGPU:-1}" -gt 1 ]; then
      run="$PY -m torch.distributed.run --standalone --nproc_per_node=$NGPU -m engine.cli"
    else
      run="$PY -m engine.cli"
    fi
    rm -f "$out/console.rc"
    setsid nohup sh -c "$run train-draft --out '$out' $*; echo \$? > '$out/console.rc'" \
      > "$out/console.log" 2>&1 < /dev/null &
    sleep 2; tail -n 20 "$out/console.log" ;;
  wait)
    end=$(( $(date +%s) + ${1:-560} ))
    while [ ! -f "$out/console.rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    tail -n 30 "$out/console.log"
    [ -f "$out/console.rc" ] && exit "$(cat "$out/console.rc")"
    echo "still running (log: $out/console.log)"; exit 75 ;;
  *) echo "usage: launch.sh start|wait OUT ..." >&2; exit 2 ;;
esac
