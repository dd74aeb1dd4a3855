# Fifth data round, device calls 2-10, each issued within 30 s of the previous one (warm machine).
# Run as PART=<1..9> bash engine/training/device/r5_call_part.sh 2>&1, carry .device-carry/r5p$PART (GGUF bytes
# (PART-1)*11e6 .. PART*11e6-1, `dd bs=1000000 skip=$(( (PART-1)*11 )) count=11` of the GGUF).
mkdir -p /tmp/smol && cp .device-carry/r5p$PART/gguf.part$PART /tmp/smol/ && ls -la /tmp/smol
