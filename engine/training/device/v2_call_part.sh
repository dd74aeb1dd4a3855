# DFlash v2 round, device calls 2-4, each issued within 30 s of the previous one (warm machine).
# Run as PART=<2|3|4> bash engine/training/device/v2_call_part.sh 2>&1, carry .device-carry/q$PART (GGUF part $PART).
mkdir -p /tmp/smol && cp .device-carry/q$PART/gguf.part$PART /tmp/smol/ && ls -la /tmp/smol /tmp/d3
