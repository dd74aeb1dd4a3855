"""A bounded load on a loopback server: client threads x requests with mixed settings, some clients
disconnecting mid-stream. Deterministic by request index, so a test can check every answer."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fixtures.tiny_drafts import TRAIN_PROMPTS


@dataclass
class Spec:
    index: int
    chat: bool
    stream: bool
    sampled: bool
    stop: list[str] | None
    disconnect: bool
    max_tokens: int
    prompt: str

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": 0.9 if self.sampled else 0.0}
        if self.sampled:
            kw["seed"] = self.index
        if self.stop:
            kw["stop"] = self.stop
        if self.disconnect:  # long enough that the client leaves while the engine still works on it
            kw["extra_body"] = {"ignore_eos": True}
        return kw


@dataclass
class Outcome:
    spec: Spec
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(o.completion_tokens for o in self.outcomes)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def specs(threads: int, per_thread: int, prompts: tuple[str, ...] = TRAIN_PROMPTS, base_tokens: int = 16) -> list[Spec]:
    out = []
    for i in range(threads * per_thread):
        disconnect = i % 8 == 5
        out.append(Spec(i, chat=i % 2 == 0, stream=disconnect or i % 3 != 0, sampled=i % 4 == 1,
                        stop=["\n\n"] if i % 5 == 2 else None, disconnect=disconnect,
                        max_tokens=200 if disconnect else base_tokens + (i % 3) * 8, prompt=prompts[i % len(prompts)]))
    return out


def _one(client, model: str, spec: Spec) -> Outcome:
    out = Outcome(spec)
    kw = spec.kwargs()
    try:
        if spec.chat:
            messages = [{"role": "user", "content": spec.prompt}]
            if spec.stream:
                stream = client.chat.completions.create(model=model, messages=messages, stream=True,
                                                        stream_options={"include_usage": True}, **kw)
                for n, chunk in enumerate(stream):
                    if spec.disconnect and n == 2:
                        stream.close()
                        out.finish_reason = "disconnected"
                        return out
                    if chunk.choices:
                        out.text += chunk.choices[0].delta.content or ""
                        out.finish_reason = chunk.choices[0].finish_reason or out.finish_reason
                    if chunk.usage:
                        out.completion_tokens = chunk.usage.completion_tokens
            else:
                r = client.chat.completions.create(model=model, messages=messages, **kw)
                out.text, out.finish_reason = r.choices[0].message.content, r.choices[0].finish_reason
                out.completion_tokens = r.usage.completion_tokens
        else:
            if spec.stream:
                stream = client.completions.create(model=model, prompt=spec.prompt, stream=True,
                                                   stream_options={"include_usage": True}, **kw)
                for n, chunk in enumerate(stream):
                    if spec.disconnect and n == 2:
                        stream.close()
                        out.finish_reason = "disconnected"
                        return out
                    if chunk.choices:
                        out.text += chunk.choices[0].text
                        out.finish_reason = chunk.choices[0].finish_reason or out.finish_reason
                    if chunk.usage:
                        out.completion_tokens = chunk.usage.completion_tokens
            else:
                r = client.completions.create(model=model, prompt=spec.prompt, **kw)
                out.text, out.finish_reason = r.choices[0].text, r.choices[0].finish_reason
                out.completion_tokens = r.usage.completion_tokens
    except Exception as exc:  # noqa: BLE001 - the test reports every failure
        out.error = f"{type(exc).__name__}: {exc}"
    return out


def run_load(make_client, model: str, threads: int = 8, per_thread: int = 4, **spec_kw: Any) -> LoadResult:
    """`threads` client threads, each sending its `per_thread` requests one after the other."""
    todo = specs(threads, per_thread, **spec_kw)
    result = LoadResult()
    lock = threading.Lock()

    def worker(k: int) -> None:
        client = make_client()
        for spec in todo[k::threads]:
            o = _one(client, model, spec)
            with lock:
                result.outcomes.append(o)

    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join(600)
    result.seconds = time.perf_counter() - t0
    result.outcomes.sort(key=lambda o: o.spec.index)
    return result
