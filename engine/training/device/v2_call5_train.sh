# DFlash v2 round, device call 5, within 30 s of call 4. Run as D1=<s> D2=<s> WAIT=<s> bash engine/training/device/v2_call5_train.sh 2>&1
# carry: .device-carry/q5 (GGUF part 5). Joins and checks the GGUF, starts v2_jobs.sh in its own session (it runs on
# after this call returns: one load + features per job, one cosine schedule over the whole deadline, instead of
# restarting the job in every 10-minute call), then waits WAIT seconds (v2_wait.sh) and returns what has finished.
G=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/smol/gguf.part1 /tmp/smol/gguf.part2 /tmp/smol/gguf.part3 /tmp/smol/gguf.part4 .device-carry/q5/gguf.part5 > $G || exit 2
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $G" | sha256sum -c || exit 2
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/d3/*.whl || exit 3
rm -f /tmp/jobs.done
D1=${D1:-900} D2=${D2:-0} setsid nohup bash engine/training/device/v2_jobs.sh > /tmp/jobs.log 2>&1 < /dev/null &
sleep 2; cat /tmp/jobs.log
bash engine/training/device/v2_wait.sh ${WAIT:-570}
