"""GET /metrics in the Prometheus text format (prometheus_client, one registry per server), as vLLM does."""
from __future__ import annotations

from typing import Callable

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()  # the *_created series only repeat when the server started

CONTENT_TYPE = CONTENT_TYPE_LATEST
_STEP_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """Counters for requests, tokens, drafted / accepted draft tokens, and histograms of step times."""

    def __init__(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("dflash_requests", "Requests that ended, by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("dflash_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("dflash_generation_tokens", "Tokens generated", registry=r)
        self.draft_tokens = Counter("dflash_draft_tokens", "Draft candidates validated by the target", registry=r)
        self.accepted_tokens = Counter("dflash_accepted_tokens", "Draft candidates the target accepted", registry=r)
        self.step_seconds = Histogram("dflash_step_seconds", "Wall time of one engine step (all requests)",
                                      buckets=_STEP_BUCKETS, registry=r)
        self.ttft_seconds = Histogram("dflash_time_to_first_token_seconds", "Time from arrival to the first token",
                                      buckets=_TTFT_BUCKETS, registry=r)
        Gauge("dflash_requests_running", "Requests the engine is serving", registry=r).set_function(running)
        Gauge("dflash_requests_waiting", "Requests queued behind the running ones", registry=r).set_function(waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)
