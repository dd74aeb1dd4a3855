"""`dflash-studio serve` as a process: it serves, and Ctrl+C lets a running stream finish, then exits 0."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from fixtures.tiny_drafts import TRAIN_PROMPTS

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ctrl_c_drains_running_streams_and_stops(tiny_qwen3_target, tiny_draft):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--target", str(tiny_qwen3_target),
                             "--draft", str(tiny_draft), "--precision", "f32", "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        first_chunk = threading.Event()
        got: dict = {"lines": []}

        def stream() -> None:
            body = {"model": model, "prompt": TRAIN_PROMPTS[0], "max_tokens": 160, "temperature": 0, "stream": True,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got["lines"].append(line[6:])
                        first_chunk.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first_chunk.wait(60)
        proc.send_signal(signal.SIGINT)
        t.join(120)
        assert got["lines"][-1] == "[DONE]"
        usage = json.loads(got["lines"][-2])["usage"]
        assert usage["completion_tokens"] == 160  # the stream ran to its end after Ctrl+C
        assert proc.wait(60) == 0
        assert "Server stopped." in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
