# Seventh data round, device call 11, within 30 s of the last GGUF part (carry .device-carry/r7b: round 6's 15,329
# primed answers, xz + sha256, and its primed texts, which the merge keeps out of round 7). Run as
#   bash engine/training/device/r7_call_r6data.sh 2>&1
mkdir -p /tmp/r7 && cp .device-carry/r7b/* /tmp/r7/ || exit 2
cd /tmp/r7 && xz -dkf answers-r6-new.jsonl.xz && sha256sum -c answers-r6-new.sha256 || exit 2
ls -la /tmp/r7 /tmp/smol
