# DSpark draft, device call 2 of 3, issued within 30 s of call 1 (warm machine). carry: .device-carry/p2 (GGUF bytes 35000000..70999999)
mkdir -p /tmp/smol && cp .device-carry/p2/gguf.part2 /tmp/smol/ && ls -la /tmp/smol /tmp/ds /tmp/site | head -20
