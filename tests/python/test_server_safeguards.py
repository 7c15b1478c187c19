"""The API key, CORS, the /debug gate and the SIGTERM drain, on servers started with the flags."""

from __future__ import annotations

import json
import signal
import threading
import time

import anthropic
import httpx
import openai
import pytest
from server_process import MODEL, server_process

KEY = "sk-test-0123456789"


def test_server_api_key_cors_and_public_metrics(tiny_checkpoint) -> None:
    args = ("--api-key", KEY, "--public-metrics", "--allowed-origins", "https://app.example")
    with server_process(*args) as (_, url):
        ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        assert ok.models.retrieve(MODEL).id == MODEL
        r = ok.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert r.choices[0].finish_reason == "length"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
        hi = [{"role": "user", "content": "a"}]
        assert claude.messages.count_tokens(model=MODEL, messages=hi).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError) as err:
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
                model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        assert err.value.body["error"]["type"] == "authentication_error"
        r = httpx.post(url + "/tokenize", json={"prompt": "hi"})
        assert r.status_code == 401 and r.json()["error"]["message"]
        assert httpx.get(url + "/v1/nothing").status_code == 401  # routes are not enumerable
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 200  # --public-metrics

        # CORS: the preflight and the response carry the origin; another origin gets none.
        pre = httpx.options(
            url + "/v1/chat/completions",
            headers={
                "origin": "https://app.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization,content-type",
            },
        )
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        r = httpx.get(
            url + "/v1/models",
            headers={"origin": "https://app.example", "authorization": f"Bearer {KEY}"},
        )
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = httpx.get(url + "/health", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers

        # /debug/* is off without --enable-debug-endpoints, even with the key.
        r = httpx.get(url + "/debug/engine", headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 404 and r.json()["error"]["message"]


def test_server_no_cors_and_metrics_behind_key_by_default(tiny_checkpoint) -> None:
    with server_process("--api-key", KEY) as (_, url):
        assert httpx.get(url + "/metrics").status_code == 401
        auth = {"x-api-key": KEY}
        assert httpx.get(url + "/metrics", headers=auth).status_code == 200
        r = httpx.get(url + "/health", headers={"origin": "https://app.example"})
        assert "access-control-allow-origin" not in r.headers


def test_server_sigterm_drains_then_aborts_with_a_finish(tiny_checkpoint) -> None:
    with server_process("--shutdown-timeout", "1.5") as (proc, url):
        events: dict[str, list] = {"chat": [], "completions": []}

        def stream(path: str, body: dict, sink: list) -> None:
            with httpx.stream("POST", url + path, json=body, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        sink.append(json.loads(line[6:]))
                    elif line == "data: [DONE]":
                        sink.append("[DONE]")

        long = {"model": MODEL, "max_tokens": 3500, "stream": True}
        threads = [
            threading.Thread(
                target=stream,
                args=(
                    "/v1/chat/completions",
                    long | {"messages": [{"role": "user", "content": "go"}]},
                    events["chat"],
                ),
            ),
            threading.Thread(
                target=stream,
                args=("/v1/completions", long | {"prompt": "go"}, events["completions"]),
            ),
        ]
        for t in threads:
            t.start()
        deadline = time.time() + 20
        while not (events["chat"] and events["completions"]) and time.time() < deadline:
            time.sleep(0.05)
        started = time.time()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        r = httpx.post(url + "/v1/messages", json={"model": MODEL, "max_tokens": 2})
        assert r.status_code == 503 and r.json()["type"] == "error"  # new work is turned away
        assert httpx.get(url + "/health").status_code == 503
        for t in threads:
            t.join(timeout=20)
        assert proc.wait(timeout=20) is not None
        assert 1.4 < time.time() - started < 15  # waited for the timeout, then aborted
        chat, completions = events["chat"], events["completions"]
        assert chat[-1] == "[DONE]" and completions[-1] == "[DONE]"
        assert chat[-2]["choices"][0]["finish_reason"] == "stop"  # the recipe's name for it
        assert completions[-2]["choices"][0]["finish_reason"] == "abort"
