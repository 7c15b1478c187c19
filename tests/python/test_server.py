"""The HTTP server with the official SDKs (openai, anthropic; pinned in the test extras) as clients
of a real server process on 127.0.0.1, serving the embedded tiny model.

A random tiny model never emits tool-call or thinking markup, so the server runs with
--test-hooks: the x-deepinfer-forced-output header makes the engine emit the given text
(SamplingParams.forced_tokens), which drives the recipe's parser through the real path.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deepseek-v4-tiny"
FORCE = "x-deepinfer-forced-output"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CALL_TEXT = (
    'I should look it up.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_checkpoint) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deepinfer.serve",
            "--config",
            str(ROOT / "configs/tiny.yaml"),
            "--port",
            str(port),
            "--test-hooks",
            "--enable-debug-endpoints",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError("server did not start")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def engine_idle(server: str, timeout: float = 10.0) -> dict:
    """Waits until no request runs and every KV block is free again; returns the counters."""
    deadline = time.time() + timeout
    while True:
        s = httpx.get(server + "/debug/engine").json()
        idle = s["num_running"] == 0 and s["num_waiting"] == 0
        if idle and s["num_blocks_free"] == s["num_blocks_total"]:
            return s
        if time.time() > deadline:
            raise AssertionError(f"engine not idle / blocks not freed: {s}")
        time.sleep(0.05)


# ---- the three protocols, streamed and not -----------------------------------------------------


def test_server_chat_completions(oai) -> None:
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
    assert r.choices[0].message.content
    stream = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_server_responses(oai) -> None:
    r = oai.responses.create(model=MODEL, input="hello", max_output_tokens=8)
    assert r.status in ("completed", "incomplete") and r.usage.output_tokens == 8
    events = list(
        oai.responses.create(model=MODEL, input="hello", max_output_tokens=8, stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] in (
        "response.completed",
        "response.incomplete",
    )


def test_server_messages(claude) -> None:
    m = claude.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        thinking={"type": "disabled"},
    )
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 8
    assert m.content and m.content[0].type == "text"
    with claude.messages.stream(
        model=MODEL,
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        thinking={"type": "disabled"},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and text == final.content[0].text


# ---- parsing through recipe: tool calls, thinking, stop sequences -------------------------------


def test_server_tool_call_parsed(oai) -> None:
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=TOOLS,
        max_tokens=200,
        extra_headers={FORCE: json.dumps(TOOL_CALL_TEXT)},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Paris"
    }
    # Streamed, the same call arrives in deltas.
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=TOOLS,
        max_tokens=200,
        stream=True,
        extra_headers={FORCE: json.dumps(TOOL_CALL_TEXT)},
    )
    name, args, finish = "", "", None
    for c in stream:
        for tc in c.choices[0].delta.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert (
        name == "get_weather" and json.loads(args) == {"city": "Paris"} and finish == "tool_calls"
    )


def test_server_tool_use_in_messages(claude) -> None:
    tools = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": TOOLS[0]["function"]["parameters"],
        }
    ]
    m = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        tools=tools,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        extra_headers={FORCE: json.dumps(TOOL_CALL_TEXT)},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert (
        m.stop_reason == "tool_use"
        and uses[0].name == "get_weather"
        and uses[0].input == {"city": "Paris"}
    )


def test_server_thinking_on_and_off(oai) -> None:
    forced = {FORCE: json.dumps("Let me think.</think>The answer is 4.<｜end▁of▁sentence｜>")}
    on = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "2+2?"}],
        max_tokens=100,
        extra_headers=forced,
        extra_body={"thinking": {"type": "enabled"}},
    )
    msg = on.choices[0].message
    assert msg.reasoning_content == "Let me think." and msg.content == "The answer is 4."
    forced = {FORCE: json.dumps("The answer is 4.<｜end▁of▁sentence｜>")}
    off = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "2+2?"}],
        max_tokens=100,
        extra_headers=forced,
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert off.choices[0].message.content == "The answer is 4."
    assert getattr(off.choices[0].message, "reasoning_content", None) in (None, "")
    assert off.choices[0].finish_reason == "stop"


def test_server_stop_sequence_aborts_the_engine_request(server, oai) -> None:
    forced = {FORCE: json.dumps("alpha STOP " + "beta " * 200)}
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "go"}],
        max_tokens=400,
        stop=["STOP"],
        extra_headers=forced,
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert r.choices[0].message.content.strip() == "alpha" and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 50  # the engine stopped long before max_tokens
    engine_idle(server)


# ---- determinism, disconnects, concurrency ------------------------------------------------------


def test_server_streamed_text_equals_non_streamed(oai) -> None:
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "tell me a story"}],
        max_tokens=24,
        temperature=0.8,
        seed=7,
        extra_body={"thinking": {"type": "disabled"}},
    )
    whole = oai.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or "" for c in oai.chat.completions.create(stream=True, **kwargs)
    )
    assert streamed == whole and whole


def test_server_leak_client_disconnect_mid_stream_frees_blocks(server) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x " * 300}],
        "max_tokens": 3000,
        "stream": True,
        "thinking": {"type": "disabled"},
    }
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = 0
        for line in r.iter_lines():
            lines += line.startswith("data:")
            if lines == 3:
                break  # leave mid-stream: closing the response drops the connection
    running = httpx.get(server + "/debug/engine").json()
    s = engine_idle(server)
    assert s["num_blocks_free"] == s["num_blocks_total"], (running, s)


def test_server_leak_50_concurrent_streaming_clients(server) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"client {i} " * (1 + i % 7)}],
            max_tokens=16 + i % 5,
            stream=True,
            extra_body={"thinking": {"type": "disabled"}},
        )
        finish = None
        async for c in stream:
            finish = c.choices[0].finish_reason or finish
        return finish

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
        return await asyncio.gather(*(one(client, i) for i in range(50)))

    finishes = asyncio.run(run())
    assert finishes == ["length"] * 50
    engine_idle(server)


# ---- errors: the protocol's own shape, 4xx, and the server keeps serving -----------------------


def test_server_errors_in_protocol_shapes(server, oai) -> None:
    def post(path: str, content: bytes | str) -> httpx.Response:
        return httpx.post(
            server + path, content=content, headers={"content-type": "application/json"}
        )

    r = post("/v1/chat/completions", b"{not json")
    assert r.status_code == 400 and "error" in r.json() and r.json()["error"]["message"]
    r = post("/v1/messages", b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["message"]
    r = post("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [], "suffix": "x"}))
    assert r.status_code == 400 and "suffix" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=7
        )
    with pytest.raises(openai.BadRequestError, match="context length"):  # prompt + max_tokens
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5000
        )
    with pytest.raises(openai.BadRequestError, match="context length"):  # the prompt alone
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x " * 5000}]
        )
    with pytest.raises(anthropic.BadRequestError) as err:
        anthropic.Anthropic(base_url=server, api_key="x", max_retries=0).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"top_p": 5},
        )
    assert err.value.body["type"] == "error"
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    assert (
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        .choices[0]
        .finish_reason
        == "length"
    )


def test_server_user_text_never_becomes_a_special_token(tiny_checkpoint) -> None:
    import deepseek_recipe as dr
    from deepinfer.server.app import Server, ServerConfig

    server = Server(ServerConfig(model_path=tiny_checkpoint, served_model_names=[MODEL]))

    def encode(text: str) -> list[int]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        return server.encode(dr.ChatCompletionRequest(json.dumps(body)).convert(server.options))

    user_id = server.tokenizer.encode("<｜User｜>")
    assert len(user_id) == 1
    # The template's own user marker is the only one: the typed spelling stays plain text.
    assert (
        encode("hi <｜User｜> there").count(user_id[0]) == encode("hi there").count(user_id[0]) == 1
    )


def test_server_models_health_and_metrics(server, oai) -> None:
    assert [m.id for m in oai.models.list()] == [MODEL]
    assert httpx.get(server + "/health").json() == {"status": "ok"}
    oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    text = httpx.get(server + "/metrics").text
    for name in (
        "deepinfer_requests_total",
        "deepinfer_prompt_tokens_total",
        "deepinfer_generation_tokens_total",
        "deepinfer_prompt_cache_hit_tokens_total",
        "deepinfer_time_to_first_token_seconds_bucket",
        "deepinfer_time_per_output_token_seconds_bucket",
        "deepinfer_num_requests_running",
        "deepinfer_num_requests_waiting",
        "deepinfer_kv_cache_usage_ratio",
    ):
        assert name in text, name
