# Wait for a round's driver (r7_jobs.sh and later) until it is done or LIMIT seconds passed, printing progress, then
# bring back what has finished: pr.tar (the primed step's stdout + texts), and for the DSpark job the draft's
# model.safetensors parts + .sha256, meta.tar (log, metrics, config, training.json, stdout, ranks' checks) and the
# round's new answers (answers-$ROUND-new.jsonl.xz). Run as ROUND=r7 bash engine/training/device/wait.sh LIMIT 2>&1,
# each within 30 s of the previous call. (Rounds 5 and 6 used r5_wait.sh / r6_wait.sh, this with their names.)
LIMIT=${1:-570}
ROUND=${ROUND:?name the round, e.g. ROUND=r7}
t0=$(date +%s)
last=0
while [ ! -f /tmp/jobs.done ] && [ $(( $(date +%s) - t0 )) -lt $LIMIT ]; do
  sleep 5
  now=$(( $(date +%s) - t0 ))
  if [ $(( now - last )) -ge 60 ]; then
    last=$now
    [ -f /tmp/ds/log.txt ] && echo "[$now s] ds: $(tail -n 1 /tmp/ds/log.txt)" || echo "[$now s] pr: $(tail -q -n 1 /tmp/pr/*.txt 2>/dev/null | tr '\n' ' ')"
  fi
done
if [ -f /tmp/pr/rc ]; then
  tar -C /tmp/pr -cf $OUT/pr.tar . ; echo "== pr: rc $(cat /tmp/pr/rc)"; grep -E "sample|merge|primed|Error|error" /tmp/pr/stdout.txt | tail -n 8
fi
if [ -f /tmp/ds/rc ]; then
  mkdir -p $OUT/ds && cp /tmp/ds/draft/model.safetensors.* $OUT/ds/ 2>/dev/null
  cp /tmp/ds/answers-$ROUND-new.jsonl.xz $OUT/ds/ 2>/dev/null
  cp /tmp/wds/ddp_rank*.json /tmp/ds/ 2>/dev/null
  (cd /tmp/ds && tar -cf $OUT/ds/meta.tar log.txt metrics.json stdout.txt rc draft/config.json draft/training.json \
    $(ls log.rank*.txt ddp_rank*.json 2>/dev/null))
  echo "== ds: rc $(cat /tmp/ds/rc)"; grep -E "held-out|training:|evaluation|saved|job |failed|Error|answers|features|generation: time|this rank" /tmp/ds/log.txt | tail -n 60
fi
ls -la $OUT $OUT/ds 2>/dev/null; nvidia-smi --query-gpu=memory.used --format=csv,noheader
[ -f /tmp/ds/log.txt ] && [ ! -f /tmp/ds/rc ] && tail -n 5 /tmp/ds/log.txt; true
