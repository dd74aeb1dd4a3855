# DFlash v2 round: wait for the background jobs (v2_jobs.sh) until they are done or LIMIT seconds passed, printing
# progress, then bring back what has finished: per job the draft's model.safetensors (or its parts) + .sha256 and
# meta.tar (log.txt, metrics.json, draft/config.json, draft/training.json, stdout.txt): at most 7 files.
# Run as bash engine/training/device/v2_wait.sh LIMIT 2>&1 (calls 6 and 7, each within 30 s of the previous one).
LIMIT=${1:-570}
t0=$(date +%s)
last=0
while [ ! -f /tmp/jobs.done ] && [ $(( $(date +%s) - t0 )) -lt $LIMIT ]; do
  sleep 5
  now=$(( $(date +%s) - t0 ))
  if [ $(( now - last )) -ge 60 ]; then
    last=$now
    for j in v2 ds; do [ -f /tmp/$j/log.txt ] && echo "[$now s] $j: $(tail -n 1 /tmp/$j/log.txt)"; done
  fi
done
for j in v2 ds; do
  if [ -f /tmp/$j/rc ]; then
    mkdir -p $OUT/$j && cp /tmp/$j/draft/model.safetensors* $OUT/$j/
    tar -C /tmp/$j -cf $OUT/$j/meta.tar log.txt metrics.json stdout.txt rc draft/config.json draft/training.json
    echo "== $j: rc $(cat /tmp/$j/rc)"; grep -E "held-out|training:|evaluation|saved|job |failed|Error" /tmp/$j/log.txt | tail -n 40
  fi
done
ls -la $OUT/*; nvidia-smi --query-gpu=memory.used --format=csv,noheader
for j in v2 ds; do [ -f /tmp/$j/log.txt ] && [ ! -f /tmp/$j/rc ] && tail -n 5 /tmp/$j/log.txt; done; true
