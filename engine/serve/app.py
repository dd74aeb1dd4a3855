"""The FastAPI app: /v1/models, /v1/chat/completions, /v1/completions (plain and SSE), /health, /metrics.

Each request becomes a `Job` handed to the bridge (bounded queue) and the step loop; the loop thread
sends the job's messages back through `loop.call_soon_threadsafe` into an asyncio queue the handler
reads. A streamed response writes one OpenAI chunk per engine step and ends with `data: [DONE]`;
a client that goes away mid-stream (or mid-wait) cancels its request.
"""
from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.serve.bridge import Bridge
from engine.serve.errors import AUTHENTICATION, NOT_FOUND, APIError
from engine.serve.jobs import Delta, Done, Failed, Job, Started, model_not_found
from engine.serve.metrics import CONTENT_TYPE
from engine.serve.schemas import (ChatCompletionRequest, CompletionRequest, _Sampling, parse_body,
                                  refuse_unsupported)

DISCONNECT_POLL_S = 0.25


def error_response(err: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def create_app(bridge: Bridge, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="DFlash Studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.bridge = bridge

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err = APIError(404, f"Unknown path {request.url.path}: this server has /v1/models, /v1/chat/completions, "
                                "/v1/completions, /health and /metrics.", NOT_FOUND, None, "unknown_url")
        elif exc.status_code == 405:
            err = APIError(405, f"{request.method} is not allowed on {request.url.path}.", "invalid_request_error")
        else:
            err = APIError(exc.status_code, str(exc.detail), "invalid_request_error")
        return error_response(err)

    async def check_key(request: Request) -> None:
        if not api_key:
            return
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not token or not secrets.compare_digest(token.encode(), api_key.encode()):
            what = "wrong" if token else "missing"
            raise APIError(401, f"The API key is {what}: send it as 'Authorization: Bearer KEY' (the openai "
                                "client's api_key).", AUTHENTICATION, None, "invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if bridge.model() is not None and not bridge.closing else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(bridge.metrics.render(), media_type=CONTENT_TYPE)

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        m = bridge.model()
        return {"object": "list", "data": [m.card()] if m is not None else []}

    @v1.get("/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        m = bridge.model()
        if m is None or m.id != model_id:
            raise model_not_found(model_id, m.id if m else "no model")
        return m.card()

    @v1.post("/chat/completions")
    async def chat(request: Request) -> Response:
        req = parse_body(await request.body(), ChatCompletionRequest)
        return await _serve(request, bridge, "chat", req)

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        req = parse_body(await request.body(), CompletionRequest)
        return await _serve(request, bridge, "completion", req)

    app.include_router(v1)
    return app


async def _serve(request: Request, bridge: Bridge, kind: str, req: _Sampling) -> Response:
    refuse_unsupported(req)
    served = bridge.model()
    if served is None:
        raise APIError(503, "No model is loaded: load a target in the app first.", "service_unavailable_error")
    if req.model != served.id:
        raise model_not_found(req.model, served.id)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def send(message: object) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, message)

    job = Job(kind, req, send)
    bridge.submit(job)
    first = await _next(queue, request, bridge, job)
    if first is None:
        return Response(status_code=499)
    if isinstance(first, Failed):
        raise first.error
    assert isinstance(first, Started)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_stream(queue, bridge, job, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    text: list[str] = []
    logprobs: list[dict[str, Any]] = []
    while True:
        msg = await _next(queue, request, bridge, job)
        if msg is None:
            return Response(status_code=499)
        if isinstance(msg, Delta):
            text.append(msg.text)
            logprobs += msg.logprobs or []
        elif isinstance(msg, Failed):
            raise msg.error
        elif isinstance(msg, Done):
            return JSONResponse(_final(job, "".join(text), logprobs if job_wants_logprobs(job) else None, msg))


async def _next(queue: asyncio.Queue, request: Request, bridge: Bridge, job: Job) -> object | None:
    """The job's next message; None (and the job cancelled) when the client has gone away."""
    while True:
        try:
            return await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                bridge.cancel(job)
                return None


def job_wants_logprobs(job: Job) -> bool:
    from engine.serve.schemas import wants_logprobs

    return wants_logprobs(job.request)


def _choice_logprobs(job: Job, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    if job.kind == "chat":
        return {"content": [{"token": p["token"], "logprob": p["logprob"], "bytes": p["bytes"], "top_logprobs": []}
                            for p in logprobs]}
    offsets, pos = [], 0
    for p in logprobs:
        offsets.append(pos)
        pos += len(p["token"])
    return {"tokens": [p["token"] for p in logprobs], "token_logprobs": [p["logprob"] for p in logprobs],
            "top_logprobs": [{p["token"]: p["logprob"]} for p in logprobs], "text_offset": offsets}


def _final(job: Job, text: str, logprobs: list[dict[str, Any]] | None, done: Done) -> dict[str, Any]:
    lp = _choice_logprobs(job, logprobs) if logprobs is not None else None
    if job.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                  "finish_reason": done.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": done.finish_reason}
        obj = "text_completion"
    return {"id": job.id, "object": obj, "created": job.created, "model": job.request.model,
            "system_fingerprint": None, "choices": [choice], "usage": done.usage, "speculative": done.speculative}


def _chunk(job: Job, text: str | None, finish: str | None, logprobs: list[dict[str, Any]] | None,
           include_usage: bool, role: bool = False) -> dict[str, Any]:
    if job.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    if logprobs:
        choice["logprobs"] = _choice_logprobs(job, logprobs)
    out = {"id": job.id, "object": obj, "created": job.created, "model": job.request.model,
           "system_fingerprint": None, "choices": [choice]}
    if include_usage:
        out["usage"] = None
    return out


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(queue: asyncio.Queue, bridge: Bridge, job: Job, include_usage: bool) -> AsyncIterator[str]:
    """One chunk per engine step; the last one carries finish_reason and the speculative stats."""
    finished = False
    try:
        if job.kind == "chat":
            yield _sse(_chunk(job, "", None, None, include_usage, role=True))
        while True:
            msg = await queue.get()
            if isinstance(msg, Delta):
                if msg.text or msg.logprobs:
                    yield _sse(_chunk(job, msg.text, None, msg.logprobs, include_usage))
            elif isinstance(msg, Done):
                last = _chunk(job, None if job.kind == "chat" else "", msg.finish_reason, None, include_usage)
                last["speculative"] = msg.speculative
                yield _sse(last)
                if include_usage:
                    yield _sse({"id": job.id, "object": last["object"], "created": job.created,
                                "model": job.request.model, "system_fingerprint": None, "choices": [],
                                "usage": msg.usage, "speculative": msg.speculative})
                finished = True
                yield _sse("[DONE]")
                return
            elif isinstance(msg, Failed):
                finished = True
                yield _sse(msg.error.body())
                yield _sse("[DONE]")
                return
    finally:
        if not finished:  # the client went away (the response task was cancelled): free the engine's slot
            bridge.cancel(job)
