# Third data round, device call 2 of 6, issued within 30 s of the previous one (warm machine). carry: .device-carry/q2 (GGUF part 2)
mkdir -p /tmp/smol && cp .device-carry/q2/gguf.part2 /tmp/smol/ && ls -la /tmp/smol /tmp/d3
