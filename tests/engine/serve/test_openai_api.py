"""The server through the official openai client: chat and completions, plain and streamed, usage,
stops, seeds, logprobs, the speculative extra object and every error with its status code."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine.config import GenerationConfig
from fixtures.tiny_drafts import TRAIN_PROMPTS

PROMPT = TRAIN_PROMPTS[0]
MESSAGES = [{"role": "user", "content": PROMPT}]


def _stream_chat(client, model: str, **kw):
    text, chunks = [], []
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, stream=True, **kw):
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return "".join(text), chunks


def test_models_lists_the_served_target(served):
    models = served.client().models.list().data
    assert [m.id for m in models] == [served.model_id]
    assert models[0].model_extra["max_model_len"] == 4096  # the tiny target's max_position_embeddings
    assert served.client().models.retrieve(served.model_id).id == served.model_id


def test_greedy_chat_equals_the_target_alone_plain_and_streamed(served, reference):
    client = served.client()
    plain = client.chat.completions.create(model=served.model_id, messages=MESSAGES, temperature=0, max_tokens=24)
    streamed, chunks = _stream_chat(client, served.model_id, temperature=0, max_tokens=24)
    solo = reference.generate(MESSAGES, GenerationConfig(max_new_tokens=24))
    assert plain.choices[0].message.content == solo.text == streamed
    assert plain.choices[0].message.role == "assistant"
    assert plain.choices[0].finish_reason == ("length" if solo.finish_reason == "length" else "stop")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    u = plain.usage
    assert (u.prompt_tokens, u.completion_tokens) == (solo.metrics.prompt_tokens, len(solo.token_ids))
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_greedy_completion_plain_and_streamed_with_usage_chunk(served, reference):
    client = served.client()
    plain = client.completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=20)
    chunks = list(client.completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=20,
                                            stream=True, stream_options={"include_usage": True}))
    solo = reference.generate(PROMPT, GenerationConfig(max_new_tokens=20), chat=False)
    assert plain.object == "text_completion"
    assert plain.choices[0].text == solo.text == "".join(c.choices[0].text for c in chunks if c.choices)
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(solo.token_ids) == plain.usage.completion_tokens
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens == solo.metrics.prompt_tokens


def test_speculative_fields_report_what_the_draft_did(served):
    resp = served.client().chat.completions.create(model=served.model_id, messages=MESSAGES, temperature=0,
                                                   max_tokens=32)
    spec = resp.model_extra["speculative"]
    assert spec["draft"] == served.pipe.draft_name
    assert spec["drafted"] > 0 and 0 < spec["accepted"] <= spec["drafted"]  # the trained draft on its own prompt
    assert spec["tokens_per_step"] > 1.0
    assert spec["accepted"] <= spec["verified"] <= spec["drafted"]  # the policy may check fewer than were drafted
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted"] / spec["verified"], abs=1e-3)
    assert len(spec["acceptance_by_position"]) > 0 and spec["target_steps"] >= 1


def test_stop_string_ends_the_answer_before_it(served):
    client = served.client()
    full = client.completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=30,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) > 12
    stop = full[8:11]
    cut = full[: full.index(stop)]
    plain = client.completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=30, stop=[stop],
                                      extra_body={"ignore_eos": True})
    streamed = client.completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=30,
                                         stop=stop, stream=True, extra_body={"ignore_eos": True})
    chunks = list(streamed)
    assert plain.choices[0].text == cut and plain.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in chunks) == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_a_seed_reproduces_a_sampled_answer(served):
    client = served.client()

    def sample(seed: int) -> str:
        return client.chat.completions.create(model=served.model_id, messages=MESSAGES, temperature=1.0, seed=seed,
                                              max_tokens=16).choices[0].message.content

    first = sample(7)
    assert sample(7) == first
    assert len({sample(s) for s in (1, 2, 3)} | {first}) > 1  # sampling, not greedy in disguise


def test_logprobs_of_sampled_tokens(served):
    resp = served.client().chat.completions.create(model=served.model_id, messages=MESSAGES, temperature=0.8, seed=3,
                                                   max_tokens=8, logprobs=True)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert all(p.logprob <= 0.0 for p in content)
    assert "".join(p.token for p in content) == resp.choices[0].message.content
    done = served.client().completions.create(model=served.model_id, prompt=PROMPT, temperature=0.8, seed=3,
                                              max_tokens=8, logprobs=0)
    lp = done.choices[0].logprobs
    assert len(lp.token_logprobs) == done.usage.completion_tokens and lp.text_offset[0] == 0


@pytest.mark.parametrize("kw, param", [
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"presence_penalty": -1}, "presence_penalty"),
    ({"temperature": 0, "logprobs": True}, "logprobs"),
    ({"temperature": 1, "logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ({"seed": -4}, "seed"),
    ({"extra_body": {"num_assistant_tokens": 99}}, "num_assistant_tokens"),
])
def test_out_of_range_values_are_400_naming_the_field(served, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        served.client().chat.completions.create(model=served.model_id, messages=MESSAGES, **{"max_tokens": 4, **kw})
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error"
    assert param.split("_")[0] in err["message"]


def test_a_prompt_over_the_context_is_context_length_exceeded(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=served.model_id, messages=MESSAGES, max_tokens=5000)
    assert e.value.body["code"] == "context_length_exceeded" and "4096" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=served.model_id, prompt="a b c d " * 1500, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"


def test_malformed_json_wrong_types_unknown_model_and_path(served):
    base = served.url
    r = httpx.post(f"{base}/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/chat/completions", json={"model": served.model_id, "messages": MESSAGES, "max_tokens": "5"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(f"{base}/chat/completions", json={"model": served.model_id, "messages": "hello"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{base}/completions", json={"model": served.model_id})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "required" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as e:
        served.client().chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert e.value.body["code"] == "model_not_found" and served.model_id in e.value.body["message"]
    r = httpx.get(f"{base}/embeddings")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    # ... and it keeps serving
    ok = served.client().completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=3)
    assert ok.usage.completion_tokens >= 1


def test_health_and_prometheus_metrics(served):
    served.client().completions.create(model=served.model_id, prompt=PROMPT, temperature=0, max_tokens=6)
    assert httpx.get(served.url.replace("/v1", "/health")).status_code == 200
    r = httpx.get(served.url.replace("/v1", "/metrics"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values['dflash_requests_total{outcome="length"}'] >= 1
    assert values["dflash_generation_tokens_total"] >= 6 and values["dflash_prompt_tokens_total"] > 0
    assert 0 < values["dflash_accepted_tokens_total"] <= values["dflash_draft_tokens_total"]
    assert values["dflash_step_seconds_count"] >= 1 and values["dflash_requests_waiting"] == 0


def test_a_full_queue_answers_429_at_once(tiny_qwen3_target, tiny_draft):
    from serve_helpers import start_server

    s = start_server(tiny_qwen3_target, tiny_draft, max_queue=0, max_running=1)
    try:
        client = s.client()
        stream = client.completions.create(model=s.model_id, prompt=PROMPT, temperature=0, max_tokens=400,
                                           stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the one slot is taken
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=s.model_id, prompt=PROMPT, max_tokens=2, timeout=5)
        assert e.value.status_code == 429 and e.value.body["code"] == "queue_full"
        stream.close()
        s.wait_idle()
        assert s.bridge.rows()[0].state == "cancelled"
    finally:
        s.stop()


def test_a_client_that_disconnects_mid_stream_cancels_its_request(served):
    body = {"model": served.model_id, "prompt": PROMPT, "max_tokens": 600, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{served.url}/completions", json=body) as r:
            lines = r.iter_lines()
            got = []
            for line in lines:
                if line.startswith("data: {"):
                    got.append(json.loads(line[6:]))
                    if len(got) == 2:
                        break
    assert len(got) == 2
    served.wait_idle()
    row = next(r for r in served.bridge.rows() if r.state == "cancelled")
    assert row.completion_tokens < 600
    assert not served.pipe.has_unfinished()
    kv = served.pipe.kv_stats()
    assert kv["free_blocks"] == kv["total_blocks"]


def test_api_key_is_required_when_set(tiny_qwen3_target, tiny_draft):
    from serve_helpers import start_server

    s = start_server(tiny_qwen3_target, tiny_draft, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            s.client(api_key="wrong").models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        r = httpx.post(f"{s.url}/completions", json={"model": s.model_id, "prompt": "x"})
        assert r.status_code == 401 and "missing" in r.json()["error"]["message"]
        assert [m.id for m in s.client(api_key="s3cret").models.list().data] == [s.model_id]
    finally:
        s.stop()


def test_binding_beyond_loopback_needs_a_key(capsys):
    from engine.cli import main
    from engine.serve.server import BindError, check_bind

    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "key")
    with pytest.raises(BindError, match="without an API key"):
        check_bind("0.0.0.0", None)
    assert main(["serve", "--host", "0.0.0.0", "--target", "/nonexistent", "--draft", "none"]) == 2
    assert "Refusing to listen on 0.0.0.0 without an API key" in capsys.readouterr().err


def test_a_next_chat_turn_reuses_the_generated_ids_from_the_prefix_cache(tiny_qwen3_target, tiny_draft, reference):
    """A client resends the whole conversation: the server hands the engine the messages, so the second
    turn matches the first reply's generated ids in the prefix cache, and the answer stays the target's."""
    from engine.scheduler import SchedulerConfig

    from serve_helpers import start_server

    s = start_server(tiny_qwen3_target, tiny_draft, scheduler=SchedulerConfig(prefix_caching=True))
    try:
        client = s.client()
        first = client.chat.completions.create(model=s.model_id, messages=MESSAGES, temperature=0, max_tokens=40)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        turn2 = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                            {"role": "user", "content": TRAIN_PROMPTS[1]}]
        second = client.chat.completions.create(model=s.model_id, messages=turn2, temperature=0, max_tokens=24)
        # the target alone answers both turns too, so its second prompt is built from its own reply's ids
        assert reference.generate(MESSAGES, GenerationConfig(max_new_tokens=40)).text == first.choices[0].message.content
        solo = reference.generate(turn2, GenerationConfig(max_new_tokens=24))
        assert second.choices[0].message.content == solo.text
        assert second.usage.prompt_tokens == solo.metrics.prompt_tokens
        assert second.usage.prompt_tokens_details.cached_tokens >= 16  # at least one full block of turn one
    finally:
        s.stop()
