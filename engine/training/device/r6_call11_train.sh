# Sixth data round, device call 11, within 30 s of call 10 (no carry). Run as
#   D2=<s> PR_UNTIL=<s> GEN_UNTIL=<s> WAIT=<s> bash engine/training/device/r6_call11_train.sh 2>&1
# Joins the nine GGUF parts, checks the sha256, starts r6_jobs.sh in its own session (setsid: one target load and
# one cosine schedule per job across the 10-minute calls), then waits WAIT seconds (r6_wait.sh).
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/smol/gguf.part1 /tmp/smol/gguf.part2 /tmp/smol/gguf.part3 /tmp/smol/gguf.part4 /tmp/smol/gguf.part5 \
  /tmp/smol/gguf.part6 /tmp/smol/gguf.part7 /tmp/smol/gguf.part8 /tmp/smol/gguf.part9 > $G || exit 2
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 2
[ -d /tmp/site/gguf ] || exit 3
rm -f /tmp/jobs.done
D2=${D2:-1000} PR_UNTIL=${PR_UNTIL:-150} GEN_UNTIL=${GEN_UNTIL:-330} setsid nohup bash engine/training/device/r6_jobs.sh \
  > /tmp/jobs.log 2>&1 < /dev/null &
sleep 2; cat /tmp/jobs.log
bash engine/training/device/r6_wait.sh ${WAIT:-570}
