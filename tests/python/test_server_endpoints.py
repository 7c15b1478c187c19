"""Legacy Completions, /v1/models/{id}, /tokenize, /detokenize, Anthropic count_tokens and the
protocol-shaped errors of every status, through the official SDKs where they reach."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from server_process import MODEL, engine_idle, server_process


@pytest.fixture(scope="module")
def server(tiny_checkpoint) -> Iterator[str]:
    with server_process("--enable-debug-endpoints") as (_, url):
        yield url


# ---- /v1/completions ----------------------------------------------------------------------------


def test_server_completions_text_and_token_prompts(server, oai) -> None:
    r = oai.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 1
    # The text prompt is BOS + its tokens: the same ids as a token prompt give the same text.
    ids = httpx.post(server + "/tokenize", json={"prompt": "The capital of France is"}).json()
    same = oai.completions.create(model=MODEL, prompt=ids["tokens"], max_tokens=8, temperature=0)
    again = oai.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert same.choices[0].text == again.choices[0].text
    assert same.usage.prompt_tokens == ids["count"]


def test_server_completions_list_of_prompts_and_logprobs(oai) -> None:
    r = oai.completions.create(
        model=MODEL, prompt=["one", [0, 100, 200], "three"], max_tokens=4, logprobs=3, seed=1
    )
    assert [c.index for c in sorted(r.choices, key=lambda c: c.index)] == [0, 1, 2]
    assert r.usage.completion_tokens == 12
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
        # Where each token's text starts (a token ending inside a UTF-8 character contributes
        # its bytes with the next one, so offsets may repeat).
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert lp.text_offset[-1] < len(c.text)
        assert all(0 < len(top) <= 3 for top in lp.top_logprobs)


def test_server_completions_seed_reproducible_and_stream_equals_whole(oai) -> None:
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0.9, seed=5)
    whole = oai.completions.create(**kwargs)
    chunks = list(
        oai.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    assert oai.completions.create(**kwargs).choices[0].text == whole.choices[0].text


def test_server_completions_stop_string_cuts_and_aborts(server, oai) -> None:
    kwargs = dict(model=MODEL, prompt="Write a haiku about the sea.", temperature=0)
    full = oai.completions.create(max_tokens=40, **kwargs).choices[0].text
    stop = full[len(full) // 3 : len(full) // 3 + 3]
    want = full[: full.index(stop)]
    r = oai.completions.create(max_tokens=1000, stop=[stop, "never-appears"], **kwargs)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 40  # the engine request ended at the stop string
    streamed = list(oai.completions.create(max_tokens=1000, stop=stop, stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in streamed) == want
    assert streamed[-1].choices[0].finish_reason == "stop"
    engine_idle(server)


def test_server_completions_echo(oai) -> None:
    r = oai.completions.create(model=MODEL, prompt="Hello there", max_tokens=3, echo=True)
    assert r.choices[0].text.startswith("Hello there") and len(r.choices[0].text) > 11


def test_server_completions_errors(oai) -> None:
    with pytest.raises(openai.NotFoundError, match="nope"):
        oai.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="context length"):
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oai.completions.create(model=MODEL, prompt="hi", temperature=-1)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        oai.completions.create(model=MODEL, prompt=[10**9])
    with pytest.raises(openai.BadRequestError, match="best_of"):
        oai.completions.create(model=MODEL, prompt="hi", best_of=3)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        oai.completions.create(model=MODEL, prompt="hi", logit_bias={"1": 5})


# ---- models, tokenize, detokenize, count_tokens ------------------------------------------------


def test_server_model_by_id(server, oai) -> None:
    m = oai.models.retrieve(MODEL)
    assert m.id == MODEL and m.model_extra["max_model_len"] == 4096
    with pytest.raises(openai.NotFoundError) as err:
        oai.models.retrieve("nope")
    assert err.value.body["message"]


def test_server_tokenize_detokenize(server) -> None:
    r = httpx.post(server + "/tokenize", json={"prompt": "hello world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 4096
    text = httpx.post(server + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"]
    assert text.endswith("hello world")
    plain = {"prompt": "hello world", "add_special_tokens": False}
    assert httpx.post(server + "/tokenize", json=plain).json()["tokens"] == r["tokens"][1:]
    chat = httpx.post(
        server + "/tokenize", json={"messages": [{"role": "user", "content": "hello"}]}
    ).json()
    assert chat["count"] > r["count"]  # the chat template around the message
    bad = httpx.post(server + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    bad = httpx.post(server + "/tokenize", json={"prompt": "a", "messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["message"]


def test_server_count_tokens_matches_messages_usage(claude) -> None:
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    counted = claude.messages.count_tokens(
        model=MODEL, messages=messages, system="Be brief.", thinking={"type": "disabled"}
    )
    m = claude.messages.create(
        model=MODEL,
        max_tokens=2,
        messages=messages,
        system="Be brief.",
        thinking={"type": "disabled"},
    )
    assert counted.input_tokens == m.usage.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.count_tokens(model="nope", messages=messages)
    assert err.value.body["type"] == "error"


# ---- errors in the protocol's shape, whatever the status ---------------------------------------


def test_server_errors_unknown_route_and_method(server) -> None:
    r = httpx.get(server + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = httpx.get(server + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server + "/v1/messages/nothing", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server + "/v1/responses")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_server_errors_deeply_nested_json_is_a_400(server) -> None:
    deep = b"[" * 10000 + b"]" * 10000
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/completions", "/tokenize"):
        r = httpx.post(server + path, content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "nested" in r.json()["error"]["message"], path
    r = httpx.post(server + "/v1/messages", content=b'{"a":' * 10000 + b"1" + b"}" * 10000)
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_server_errors_body_too_large_is_a_413(server) -> None:
    big = json.dumps({"model": MODEL, "prompt": "x" * (9 << 20)})
    r = httpx.post(server + "/v1/completions", content=big)
    assert r.status_code == 413 and r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it is read
        for _ in range(9):
            yield b" " * (1 << 20)

    r = httpx.post(server + "/v1/messages", content=chunks())
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert httpx.get(server + "/health").status_code == 200


def test_server_request_id_echoed(server) -> None:
    r = httpx.get(server + "/health", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    generated = httpx.get(server + "/v1/nothing").headers["x-request-id"]
    assert len(generated) == 32
    r = httpx.get(server + "/health", headers={"x-request-id": "bad id\twith spaces"})
    assert r.headers["x-request-id"] != "bad id\twith spaces"


def test_server_unexpected_exception_is_a_json_500(tiny_checkpoint) -> None:
    import asyncio

    from deepinfer.server import ServerConfig, create_app

    app = create_app(ServerConfig(model_path=tiny_checkpoint, served_model_names=[MODEL]))

    @app.get("/v1/messages/boom")
    async def boom() -> None:
        raise RuntimeError("boom")

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/v1/messages/boom")

    r = asyncio.run(call())
    assert r.status_code == 500 and r.json()["type"] == "error"
    assert r.headers["x-request-id"] in r.json()["error"]["message"]
