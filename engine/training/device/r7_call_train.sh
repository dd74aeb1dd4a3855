# Seventh data round, device call 12, within 30 s of call 11 (no carry). Run as
#   D2=<s> PR_UNTIL=<s> GEN_UNTIL=<s> WAIT=<s> bash engine/training/device/r7_call_train.sh 2>&1
# Joins the nine GGUF parts (sha256 checked) and the answers of rounds 1-3, 5 and 6 into one cache (in that order:
# the held-out rows first), starts r7_jobs.sh in its own session (it outlives the 10-minute calls), then waits
# WAIT seconds (wait.sh).
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/smol/gguf.part1 /tmp/smol/gguf.part2 /tmp/smol/gguf.part3 /tmp/smol/gguf.part4 /tmp/smol/gguf.part5 \
  /tmp/smol/gguf.part6 /tmp/smol/gguf.part7 /tmp/smol/gguf.part8 /tmp/smol/gguf.part9 > $G || exit 2
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 2
[ -d /tmp/site/gguf ] && [ -f /tmp/r7/answers-r6-new.jsonl ] || exit 3
cat /tmp/r7/answers-r3.jsonl /tmp/r7/answers-r5-new.jsonl /tmp/r7/answers-r6-new.jsonl | gzip -1 > /tmp/r7/answers-base.jsonl.gz
rm -f /tmp/jobs.done
D2=${D2:-1100} PR_UNTIL=${PR_UNTIL:-130} GEN_UNTIL=${GEN_UNTIL:-300} setsid nohup bash engine/training/device/r7_jobs.sh \
  > /tmp/jobs.log 2>&1 < /dev/null &
sleep 2; cat /tmp/jobs.log
ROUND=r7 bash engine/training/device/wait.sh ${WAIT:-560}
