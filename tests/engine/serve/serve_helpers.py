"""Start and stop a real server (engine + step-loop thread + uvicorn) on a free loopback port."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.pipeline import SpeculativePipeline
from engine.scheduler import SchedulerConfig
from engine.serve.bridge import Bridge
from engine.serve.loop import EngineLoop
from engine.serve.model import served_model
from engine.serve.server import UvicornServer, http_server


@dataclass
class Served:
    pipe: SpeculativePipeline
    loop: EngineLoop
    bridge: Bridge
    http: UvicornServer
    api_key: str | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}/v1"

    @property
    def model_id(self) -> str:
        return self.bridge.model().id

    def client(self, **kw: Any):
        from openai import OpenAI

        kw.setdefault("api_key", self.api_key or "none")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 120)
        return OpenAI(base_url=self.url, **kw)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until nothing is outstanding (cancels take a step to land)."""
        deadline = time.monotonic() + timeout
        while self.bridge.outstanding or self.loop.live.jobs:
            if time.monotonic() > deadline:
                raise AssertionError(f"still outstanding: {[r.id for r in self.bridge.rows() if r.state != 'done']}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.http.stop(30)
        self.bridge.close()
        self.loop.stop()


def start_server(target: Path, draft: Path | None, api_key: str | None = None, max_queue: int = 64,
                 max_running: int = 16, scheduler: SchedulerConfig | None = None) -> Served:
    pipe = SpeculativePipeline.load(target, draft, precision="f32",
                                    scheduler=scheduler or SchedulerConfig(max_num_seqs=max_running))
    loop = EngineLoop(pipe, served_model(str(target), pipe.draft_name))
    bridge = Bridge(loop, max_queue=max_queue, max_running=max_running)
    loop.on_step = bridge.observe_step
    loop.start()
    http = http_server(bridge, "127.0.0.1", 0, api_key)
    http.start()
    deadline = time.monotonic() + 30
    while not http.started:
        if time.monotonic() > deadline or not http.running:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    return Served(pipe, loop, bridge, http, api_key)
