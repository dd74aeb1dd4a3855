# Third data round, device call 3 of 6, issued within 30 s of the previous one (warm machine). carry: .device-carry/q3 (GGUF part 3)
mkdir -p /tmp/smol && cp .device-carry/q3/gguf.part3 /tmp/smol/ && ls -la /tmp/smol /tmp/d3
