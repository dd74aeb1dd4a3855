#!/bin/sh
# Start `dflash-studio train-draft` in the background on a machine whose shell calls are time-limited,
# then wait for it (docs/training.md, "On a remote GPU machine"):
#   NGPU=2 sh engine/training/launch.sh start OUT --target G --variant dspark ...   # returns at once
#   sh engine/training/launch.sh wait OUT 560 [DEST [PER]]  # follows OUT/console.log for up to 560 s; rc 0 when
#                                                  # done; with DEST, ends as `snapshot OUT DEST PER` does
#   sh engine/training/launch.sh snapshot OUT DEST 4  # the newest weights of the running stage, 4 parts a call
# A lease can end between two calls (a call that comes more than the machine's idle time after the last): give
# every wait a DEST under the call's returned folder, so the newest checkpoint is already here when it does.
# NGPU > 1 runs it under torchrun (data parallel); PYTHON picks the interpreter (default python3).
set -u
cmd=$1; out=$2; shift 2
PY=${PYTHON:-python3}
snapshot() {
    # The draft folder the running stage wrote at its last checkpoint (work/stage-N.latest), as a tar in
    # 15 MiB parts under OUT/snap/NAME with their sha256 sums; each call copies at most PER parts not yet
    # copied into DEST (a machine that returns a few files per call), so a lease that ends mid-stage keeps
    # the weights: join the parts of one NAME, check the sums, and pass the folder to --init.
    dest=$1; per=${2:-4}
    latest=$(ls -td "$out"/work/stage-*.latest 2>/dev/null | head -n 1)
    if [ -z "$latest" ]; then echo "no snapshot yet in $out/work"; return 1; fi
    step=$(sed 's/.*"step": *\([0-9]*\).*/\1/' "$latest/snapshot.json")
    name=$(basename "$latest" .latest)-step$step
    dir="$out/snap/$name"
    if [ ! -d "$dir" ]; then
      rm -rf "$out/snap"; mkdir -p "$dir.tmp"
      tar -cf - -C "$(dirname "$latest")" "$(basename "$latest")" | split -b 15M -d - "$dir.tmp/$name.tar."
      (cd "$dir.tmp" && sha256sum "$name".tar.* > "$name.sha256")
      mv "$dir.tmp" "$dir"
    fi
    mkdir -p "$dest"; cp "$dir/$name.sha256" "$dest/"
    # A finished run's small files first: the whole record (OUT/training.json) and the sub-vocabulary that
    # `finish` counted from the run's answers are not in the snapshot, and the answers stay on the machine.
    if [ -f "$out/console.rc" ] && [ -d "$out/checkpoint" ]; then
      [ -f "$out/training.json" ] && cp "$out/training.json" "$dest/record.training.json"
      [ -f "$out/checkpoint/draft_vocabulary.json" ] && cp "$out/checkpoint/draft_vocabulary.json" "$dest/"
    fi
    n=0
    for f in "$dir/$name".tar.*; do
      [ -e "$dir/sent.$(basename "$f")" ] && continue
      [ "$n" -lt "$per" ] || break
      cp "$f" "$dest/" && touch "$dir/sent.$(basename "$f")"; n=$((n + 1))
    done
    left=$(( $(ls "$dir/$name".tar.* | wc -l) - $(ls "$dir" | grep -c '^sent\.') ))
    echo "snapshot $name: $n parts copied to $dest, $left left"
}

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
    if [ $# -ge 2 ]; then snapshot "$2" "${3:-8}" || true; fi
    [ -f "$out/console.rc" ] && exit "$(cat "$out/console.rc")"
    echo "still running (log: $out/console.log)"; exit 75 ;;
  snapshot)
    snapshot "$@" ;;
  *) echo "usage: launch.sh start|wait|snapshot OUT ..." >&2; exit 2 ;;
esac
