"""OpenAI request bodies (pydantic) and how their fields map onto engine.config.GenerationConfig.

Types are strict (a string where a number belongs is a 400 naming the field, as OpenAI answers);
unknown fields are ignored, as vLLM does, except the ones that would silently change the answer
(tools, response formats, n > 1, ...), which are refused with the reason. A few vLLM extras that
the engine has (top_k, min_p, repetition_penalty, min_tokens, ignore_eos) and the draft's own knobs
(num_assistant_tokens, markov_head_top_k) are accepted as extra body fields.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.config import GenerationConfig
from engine.sampling.processors import needs_logits
from engine.serve.errors import bad_request

MAX_STOP_STRINGS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class _Sampling(_Strict):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, Any] | None = None
    # vLLM-style extras the engine has
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    # the draft's knobs (docs/serving.md)
    num_assistant_tokens: int | None = Field(None, ge=1)
    markov_head_top_k: int | None = Field(None, ge=0)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None


def parse_body(raw: bytes, model: type[_Sampling]) -> _Sampling:
    """The request body as `model`; a 400 naming the field (or the JSON error) otherwise."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON ({exc}). Send a JSON object, e.g. "
                          '{"model": "...", "messages": [{"role": "user", "content": "Hi"}]}.') from exc
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, not {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        got = f" (got {json.dumps(err['input'])[:80]})" if "input" in err and err["type"] != "missing" else ""
        raise bad_request(f"Invalid value for '{param}': {err['msg']}{got}.", param) from exc


def refuse_unsupported(req: _Sampling) -> None:
    """400 for fields that would change the answer in a way this server cannot honour."""
    if req.n not in (None, 1):
        raise bad_request(f"n={req.n}: this server returns one choice per request; use n=1 and send the "
                          "request several times instead.", "n")
    if req.logit_bias:
        raise bad_request("logit_bias is not supported by this engine: leave it out.", "logit_bias")
    if isinstance(req, ChatCompletionRequest):
        if req.tools or req.functions or req.tool_choice not in (None, "none"):
            raise bad_request("Tool and function calling are not supported by this server: leave out tools, "
                              "functions and tool_choice.", "tools")
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise bad_request(f"response_format {req.response_format.get('type')!r} is not supported: only plain "
                              "text answers (leave response_format out).", "response_format")
        if req.top_logprobs:
            raise bad_request("top_logprobs > 0 is not available: the engine keeps only the chosen token's "
                              "log-probability. Use logprobs=true with top_logprobs=0.", "top_logprobs")
    else:
        if req.echo:
            raise bad_request("echo=true is not supported: the answer holds only the completion.", "echo")
        if req.best_of not in (None, 1):
            raise bad_request(f"best_of={req.best_of}: this server generates one completion per request; use "
                              "best_of=1.", "best_of")
        if req.suffix:
            raise bad_request("suffix (insertion) is not supported: leave it out.", "suffix")
        if req.logprobs:
            raise bad_request(f"logprobs={req.logprobs} asks for alternatives the engine does not keep (only the "
                              "chosen token's log-probability): use logprobs=0.", "logprobs")


def wants_logprobs(req: _Sampling) -> bool:
    if isinstance(req, ChatCompletionRequest):
        return req.logprobs
    return req.logprobs is not None


def stop_strings(req: _Sampling) -> list[str]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"stop has {len(stops)} strings: give at most {MAX_STOP_STRINGS}.", "stop")
    if any(not s for s in stops):
        raise bad_request("stop: every stop string must be non-empty.", "stop")
    return stops


def requested_max_tokens(req: _Sampling) -> int | None:
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        return req.max_completion_tokens
    return req.max_tokens


# GenerationConfig field -> the request field a person wrote (for error messages)
FIELD_NAMES = {"max_new_tokens": "max_tokens", "rng_seed": "seed", "min_new_tokens": "min_tokens",
               "stop_strings": "stop"}


def generation_config(req: _Sampling, max_new_tokens: int) -> GenerationConfig:
    """The engine settings for a request. temperature 0 is greedy (OpenAI clients send it so);
    no temperature means OpenAI's default of 1, which samples."""
    temperature = 1.0 if req.temperature is None else req.temperature
    sample = temperature > 0.0
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value is not None and value < 0:
            raise bad_request(f"{name}={value}: negative penalties (which favour repeats) are not supported "
                              "by this engine; use 0 to 2.", name)
    if req.seed is not None and req.seed < 0:
        raise bad_request(f"seed={req.seed}: use a whole number >= 0.", "seed")
    cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=req.min_tokens or 0,
        num_assistant_tokens=req.num_assistant_tokens,
        markov_head_top_k=req.markov_head_top_k,
        stop_strings=stop_strings(req),
        ignore_eos=req.ignore_eos,
        do_sample=sample,
        temperature=temperature if sample else 1.0,
        top_k=max(0, req.top_k or 0),
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=req.min_p or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        rng_seed=req.seed,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        from engine.serve.errors import from_value_error

        raise from_value_error(exc, FIELD_NAMES) from exc
    if wants_logprobs(req) and not needs_logits(cfg):
        raise bad_request("logprobs are computed for requests that read the target's full distribution: sampled "
                          "ones (temperature > 0) or ones with a presence/frequency/repetition penalty or "
                          "min_tokens. A greedy request (temperature 0) runs on the target's in-graph argmax and "
                          "has none: set a temperature, or leave logprobs out.", "logprobs")
    return cfg


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, str]]:
    """Messages as the chat template takes them: text content only (content parts are joined)."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            texts = []
            for j, part in enumerate(m.content):
                try:
                    texts.append(TextPart.model_validate(part).text)
                except ValidationError as exc:
                    raise bad_request(f"messages[{i}].content[{j}]: only text parts ({{\"type\": \"text\", "
                                      "\"text\": ...}) are supported by this text model.",
                                      f"messages.{i}.content.{j}") from exc
            content = "".join(texts)
        else:
            content = m.content or ""
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": content})
    return out


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """One prompt: a string, a one-string list, or token ids."""
    p = req.prompt
    if isinstance(p, str):
        return p
    if not p:
        raise bad_request("prompt is empty: send some text.", "prompt")
    if all(isinstance(x, str) for x in p):
        if len(p) != 1:
            raise bad_request(f"prompt holds {len(p)} prompts: this server takes one prompt per request.", "prompt")
        return p[0]
    return [int(x) for x in p]
