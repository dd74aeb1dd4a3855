# Third data round, device call 4 of 6, issued within 30 s of the previous one (warm machine). carry: .device-carry/q4 (GGUF part 4)
mkdir -p /tmp/smol && cp .device-carry/q4/gguf.part4 /tmp/smol/ && ls -la /tmp/smol /tmp/d3
