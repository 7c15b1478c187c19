"""Structured outputs and forced tool calls through the HTTP server, with the official SDKs, on
the random tiny model: the grammar constraint, not the model, makes the outputs valid.

The tiny model never ends a thinking block by itself, so thinking-mode requests force a short
reasoning prefix with the x-deepinfer-forced-output test hook; the constraint takes over after it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepseek_recipe as dr
import httpx
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_process import engine_idle, server_process

pytest.importorskip("xgrammar")

MODEL = "deepseek-v4-tiny"
FORCE = "x-deepinfer-forced-output"
NO_THINKING = {"thinking": {"type": "disabled"}}
THINK_FIRST = {FORCE: json.dumps("Let me see.</think>")}
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"type": "string", "enum": ["red", "blue"]},
        "size": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["ok", "color", "size"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
}
DAY = {
    "type": "object",
    "properties": {"day": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["day"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_calendar", "parameters": DAY}},
]
PARAMS = {"get_weather": CITY, "get_calendar": DAY}


@pytest.fixture(scope="module")
def server(tiny_checkpoint) -> Iterator[str]:
    with server_process("--test-hooks", "--enable-debug-endpoints") as (_, url):
        yield url


def valid(value: object, schema: dict) -> bool:
    """The subset of JSON Schema used here."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and all(k in value for k in schema.get("required", []))
            and all(valid(v, props[k]) for k, v in value.items() if k in props)
            and (schema.get("additionalProperties", True) or set(value) <= set(props))
        )
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return True


def chat(oai: openai.OpenAI, **kwargs: object):
    kwargs.setdefault("messages", [{"role": "user", "content": "Answer in JSON."}])
    kwargs.setdefault("max_tokens", 300)
    return oai.chat.completions.create(model=MODEL, **kwargs)


def streamed_text(stream) -> tuple[str, str | None]:
    text, finish = "", None
    for c in stream:
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
    return text, finish


# ---- answer formats ------------------------------------------------------------------------------


def test_json_schema(oai) -> None:
    r = chat(oai, response_format=RESPONSE_FORMAT, extra_body=NO_THINKING)
    assert r.choices[0].finish_reason == "stop"
    assert valid(json.loads(r.choices[0].message.content), SCHEMA)
    text, finish = streamed_text(
        chat(oai, response_format=RESPONSE_FORMAT, extra_body=NO_THINKING, stream=True)
    )
    assert finish == "stop" and valid(json.loads(text), SCHEMA)


def test_json_schema_after_thinking(oai) -> None:
    r = chat(oai, response_format=RESPONSE_FORMAT, extra_headers=THINK_FIRST)
    msg = r.choices[0].message
    assert msg.reasoning_content == "Let me see."
    assert valid(json.loads(msg.content), SCHEMA)
    text, finish = streamed_text(
        chat(oai, response_format=RESPONSE_FORMAT, extra_headers=THINK_FIRST, stream=True)
    )
    assert finish == "stop" and valid(json.loads(text), SCHEMA)


def test_json_object(oai) -> None:
    tokenizer = dr.Tokenizer.from_file(_tokenizer_json())
    (brace,) = tokenizer.encode("}")
    # The grammar allows "}" right after "{"; the bias makes the random model take it.
    r = chat(
        oai,
        response_format={"type": "json_object"},
        logit_bias={str(brace): 100},
        extra_body=NO_THINKING,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_and_choice(oai) -> None:
    pattern = "[a-c]{3}-[0-9]{2}"
    for body in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
        r = chat(oai, extra_body={**NO_THINKING, **body})
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
    r = chat(oai, response_format={"type": "regex", "regex": pattern}, extra_body=NO_THINKING)
    assert re.fullmatch(pattern, r.choices[0].message.content)
    r = chat(oai, extra_body={**NO_THINKING, "structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content in ("yes", "no")
    text, _ = streamed_text(
        chat(
            oai,
            extra_body={"guided_choice": ["up", "down"]},
            stream=True,
            extra_headers=THINK_FIRST,
        )
    )
    assert text in ("up", "down")


def test_responses_text_format(oai) -> None:
    r = oai.responses.create(
        model=MODEL,
        input="Answer in JSON.",
        max_output_tokens=300,
        text={"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA}},
        extra_headers=THINK_FIRST,
    )
    assert valid(json.loads(r.output_text), SCHEMA)


def test_invalid_constraints_are_400_naming_the_field(oai) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"structured_outputs": {"regex": "[a-c"}})
    assert "structured_outputs.regex" in str(e.value) and e.value.body["param"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"guided_regex": "(ab"})
    assert "guided_regex" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"guided_json": "{not json"})
    assert "guided_json" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"structured_outputs": {"json": {"$ref": "#/missing"}}})
    assert "structured_outputs.json" in str(e.value)
    # The recipe checks response_format's schema itself; its error gets the field.
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, response_format=bad)
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "invalid JSON schema in 'response_format.json_schema.schema'" in str(e.value)
    bad_text = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=MODEL, input="hi", text=bad_text)
    assert e.value.body["param"] == "text.format.schema"
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}})
    assert "conflicting" in str(e.value)


def test_completions_structured_outputs(server) -> None:
    pattern = "[a-c]{3}-[0-9]{2}"
    r = httpx.post(
        server + "/v1/completions",
        json={"model": MODEL, "prompt": "id:", "max_tokens": 50, "guided_regex": pattern},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert re.fullmatch(pattern, r.json()["choices"][0]["text"])
    r = httpx.post(
        server + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "structured_outputs": {"choice": ["a", "b"]}},
        timeout=60,
    )
    assert r.json()["choices"][0]["text"] in ("a", "b")
    r = httpx.post(
        server + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "structured_outputs": {"regex": "("}},
        timeout=60,
    )
    assert r.status_code == 400 and "structured_outputs.regex" in r.text


# ---- forced tool calls -------------------------------------------------------------------------


def calls_of(r) -> list[tuple[str, dict]]:
    msg = r.choices[0].message
    return [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]


def test_tool_choice_required(oai) -> None:
    for extra in ({"extra_body": NO_THINKING}, {"extra_headers": THINK_FIRST}):
        r = chat(oai, tools=TOOLS, tool_choice="required", **extra)
        assert r.choices[0].finish_reason == "tool_calls"
        calls = calls_of(r)
        assert calls and all(valid(args, PARAMS[name]) for name, args in calls)
    # Thinking mode: the reasoning comes first, then the call.
    assert r.choices[0].message.reasoning_content == "Let me see."


def test_tool_choice_named_and_not_parallel(oai) -> None:
    named = {"type": "function", "function": {"name": "get_calendar"}}
    for extra in ({"extra_body": NO_THINKING}, {"extra_headers": THINK_FIRST}):
        r = chat(oai, tools=TOOLS, tool_choice=named, **extra)
        calls = calls_of(r)
        assert calls and all(n == "get_calendar" and valid(a, DAY) for n, a in calls)
        r = chat(oai, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **extra)
        calls = calls_of(r)
        assert len(calls) == 1 and valid(calls[0][1], PARAMS[calls[0][0]])


def test_tool_choice_required_streamed(oai) -> None:
    stream = chat(
        oai,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        extra_body=NO_THINKING,
        stream=True,
    )
    name, args, finish = "", "", None
    for c in stream:
        for tc in c.choices[0].delta.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls" and valid(json.loads(args), PARAMS[name])


def test_anthropic_tool_choice_any_and_tool(claude) -> None:
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]
    for kwargs in ({"thinking": {"type": "disabled"}}, {"extra_headers": THINK_FIRST}):
        m = claude.messages.create(
            model=MODEL,
            max_tokens=300,
            tools=tools,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "weather?"}],
            **kwargs,
        )
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(uses) == 1
        assert valid(uses[0].input, PARAMS[uses[0].name])
    m = claude.messages.create(
        model=MODEL,
        max_tokens=300,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "weather?"}],
        thinking={"type": "disabled"},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and all(u.name == "get_weather" and valid(u.input, CITY) for u in uses)


# ---- failures ------------------------------------------------------------------------------------


def test_grammar_failure_ends_only_that_request(server, oai) -> None:
    pattern = "[a-c]{3}"
    # Forced text the grammar rejects at its second token.
    bad = {FORCE: json.dumps("ab" + "zzzz" * 10)}

    def failing():
        return chat(oai, extra_body={**NO_THINKING, "guided_regex": pattern}, extra_headers=bad)

    def fine():
        return chat(oai, extra_body={**NO_THINKING, "guided_regex": pattern})

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(failing), pool.submit(fine), pool.submit(failing), pool.submit(fine)]
        results = [f.result() for f in futures]
    for r in results[0::2]:
        assert r.choices[0].finish_reason == "stop"
        # The text the grammar accepted; the refused token is not reported.
        assert r.choices[0].message.content == "ab"
    for r in results[1::2]:
        assert re.fullmatch(pattern, r.choices[0].message.content)
    _text, finish = streamed_text(
        chat(
            oai, extra_body={**NO_THINKING, "guided_regex": pattern}, extra_headers=bad, stream=True
        )
    )
    assert finish == "stop"
    engine_idle(server)
    assert httpx.get(server + "/health").status_code == 200


def _tokenizer_json() -> str:
    from deepinfer.server.app import tokenizer_json_path

    return tokenizer_json_path()


# ---- tool_choice auto: a tool-call block that does not parse -----------------------------------

D = "｜DSML｜"
BROKEN_CALL = (
    f'Checking.\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="city" string="false">Paris</{D}parameter>\n</{D}invoke>\n'
    f"</{D}tool_calls><｜end▁of▁sentence｜>"
)
TRUNCATED_CALL = (
    f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="city" string="true">Pa'
)


def test_auto_tool_call_that_does_not_parse_comes_back_as_text(oai) -> None:
    """tool_choice auto leaves the model free; markup whose arguments are not JSON is returned as
    text with finish_reason "tool_call_error", never as a tool call with broken arguments."""
    kw = dict(tools=TOOLS, tool_choice="auto", extra_body=NO_THINKING)
    r = chat(oai, extra_headers={FORCE: json.dumps(BROKEN_CALL)}, max_tokens=80, **kw)
    choice = r.choices[0]
    assert not choice.message.tool_calls
    assert choice.finish_reason == "tool_call_error"
    assert "Checking." in choice.message.content and "get_weather" in choice.message.content
    text, finish = streamed_text(
        chat(oai, extra_headers={FORCE: json.dumps(BROKEN_CALL)}, max_tokens=80, stream=True, **kw)
    )
    assert finish == "tool_call_error" and "get_weather" in text


def test_truncated_tool_call_comes_back_as_text_with_length(oai) -> None:
    kw = dict(tools=TOOLS, tool_choice="auto", extra_body=NO_THINKING)
    n = 27  # ends inside the parameter value (the forced text is 29 tokens)
    r = chat(oai, extra_headers={FORCE: json.dumps(TRUNCATED_CALL)}, max_tokens=n, **kw)
    choice = r.choices[0]
    assert not choice.message.tool_calls
    assert choice.finish_reason == "length"
    assert "get_weather" in (choice.message.content or "")
    forced = {FORCE: json.dumps(TRUNCATED_CALL)}
    text, finish = streamed_text(chat(oai, extra_headers=forced, max_tokens=n, stream=True, **kw))
    assert finish == "length" and "get_weather" in text
