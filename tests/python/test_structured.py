"""Structured outputs (deepinfer.structured): request parsing, grammar compilation with the real
DeepSeek V4 tokenizer, and the per-request constraint driven token by token as the engine will."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

pytest.importorskip("xgrammar")

import deepseek_recipe as dr
from deepinfer.server.app import tokenizer_json_path
from deepinfer.structured import (
    ConstraintSpec,
    StructuredCompiler,
    constraint_spec_from_request,
    make_constraint,
    request_thinks,
    tool_call_spec,
)
from deepinfer.tiny import TOKENIZER_VOCAB

MODEL = "DeepSeek-V4-Pro"
# A model vocabulary padded past the tokenizer's, to check the ids beyond it stay disallowed.
PADDED_VOCAB = TOKENIZER_VOCAB + 64


@pytest.fixture(scope="module")
def tokenizer():
    return dr.Tokenizer.from_file(tokenizer_json_path())


@pytest.fixture(scope="module")
def eos(tokenizer):
    (eos_id,) = tokenizer.encode(dr.SpecialToken.Eos.default_str())
    return eos_id


@pytest.fixture(scope="module")
def compiler(eos):
    return StructuredCompiler(tokenizer_json_path(), PADDED_VOCAB, [eos])


def new_mask(vocab: int = PADDED_VOCAB) -> np.ndarray:
    return np.zeros((vocab + 31) // 32, dtype=np.uint32)


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def drive(constraint, tokens: list[int]) -> int | None:
    """Feed tokens as the engine does (fill, then accept); the index of the first rejected token,
    or None. Checks that each accepted token was allowed by the mask."""
    for i, t in enumerate(tokens):
        mask = new_mask()
        constraint.fill_allowed(mask)
        ok = constraint.accept(t)
        assert ok == allowed(mask, t), (i, t)
        if not ok:
            return i
    return None


def run_text(compiler, tokenizer, eos, spec, text, thinking=False):
    c = make_constraint(compiler.compile(spec), PADDED_VOCAB, thinking)
    rejected = drive(c, tokenizer.encode(text) + [eos])
    return c, rejected


# ----- request parsing


def chat(**extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": "json please"}], **extra}


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_spec_kinds():
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}
    spec = constraint_spec_from_request("chat", chat(response_format=rf))
    assert spec.kind == "json_schema" and json.loads(spec.text) == SCHEMA
    assert spec.field == "response_format.json_schema.schema"
    assert constraint_spec_from_request("chat", chat(response_format={"type": "text"})) is None
    spec = constraint_spec_from_request("chat", chat(response_format={"type": "json_object"}))
    assert spec == ConstraintSpec("json_object", "")
    flat = {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}
    spec = constraint_spec_from_request("responses", {"model": MODEL, "input": "x", "text": flat})
    assert spec.kind == "json_schema" and spec.field == "text.format.schema"
    for key, value, kind in [
        ("json", SCHEMA, "json_schema"),
        ("regex", r"\d+", "regex"),
        ("choice", ["a", "b"], "choice"),
        ("grammar", 'root ::= "x"', "grammar"),
        ("json_object", True, "json_object"),
    ]:
        spec = constraint_spec_from_request("chat", chat(structured_outputs={key: value}))
        assert spec.kind == kind and spec.field == f"structured_outputs.{key}"
    spec = constraint_spec_from_request("chat", chat(guided_choice=["x", "y"]))
    assert spec == ConstraintSpec("choice", '["x", "y"]')
    assert constraint_spec_from_request("chat", chat()) is None


def test_spec_errors_name_the_field():
    with pytest.raises(ValueError, match=r"'response_format', 'guided_regex'"):
        constraint_spec_from_request(
            "chat", chat(response_format={"type": "json_object"}, guided_regex="a")
        )
    with pytest.raises(ValueError, match=r"structured_outputs\.choice"):
        constraint_spec_from_request("chat", chat(structured_outputs={"choice": []}))
    with pytest.raises(ValueError, match="guided_json"):
        constraint_spec_from_request("chat", chat(guided_json="{nope"))
    with pytest.raises(ValueError, match=r"response_format.json_schema.schema"):
        constraint_spec_from_request(
            "chat", chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})
        )
    with pytest.raises(ValueError, match="unknown tool"):
        constraint_spec_from_request(
            "chat",
            chat(tools=[TOOL_WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}),
        )


# ----- compilation and masks


def test_json_schema(compiler, tokenizer, eos):
    spec = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    c, rejected = run_text(compiler, tokenizer, eos, spec, '{"name": "Ada", "age": 36}')
    assert rejected is None and c.is_terminated()
    # A string where the schema wants an integer.
    _, rejected = run_text(compiler, tokenizer, eos, spec, '{"name": "Ada", "age": "36"}')
    assert rejected is not None

    mask = new_mask()
    make_constraint(compiler.compile(spec), PADDED_VOCAB, False).fill_allowed(mask)
    (brace,) = tokenizer.encode("{")
    assert allowed(mask, brace)
    for letter in "aAx":
        (t,) = tokenizer.encode(letter)
        assert not allowed(mask, t)
    assert not allowed(mask, eos)
    assert not any(allowed(mask, t) for t in range(TOKENIZER_VOCAB, PADDED_VOCAB))


def test_json_object_regex_grammar_choice(compiler, tokenizer, eos):
    cases = [
        (ConstraintSpec("json_object", ""), '{"a": [1, {"b": null}]}', '["not an object"]'),
        (ConstraintSpec("regex", r"\d{3}-[a-z]+"), "123-abc", "12-abc"),
        (ConstraintSpec("grammar", 'root ::= "yes" | "no"'), "no", "maybe"),
        (ConstraintSpec("choice", json.dumps(["café", 'say "hi"\n'])), 'say "hi"\n', "cafe"),
    ]
    for spec, good, bad in cases:
        c, rejected = run_text(compiler, tokenizer, eos, spec, good)
        assert rejected is None and c.is_terminated(), spec
        _, rejected = run_text(compiler, tokenizer, eos, spec, bad)
        assert rejected is not None, spec
    # Lark, the other grammar syntax vLLM accepts.
    lark = ConstraintSpec("grammar", 'start: "a" "b"+')
    c, rejected = run_text(compiler, tokenizer, eos, lark, "abbb")
    assert rejected is None and c.is_terminated()


def test_compile_errors_name_the_field(compiler):
    for spec, what in [
        (ConstraintSpec("json_schema", '{"type": 5}', "response_format.json_schema.schema"), ""),
        (ConstraintSpec("regex", "a((", "guided_regex"), "regular expression"),
        (ConstraintSpec("grammar", "root ::= undefined_rule", "structured_outputs.grammar"), ""),
    ]:
        with pytest.raises(ValueError, match=f"{what}.*'{spec.field}'"):
            compiler.compile(spec)


def test_cache(eos):
    small = StructuredCompiler(tokenizer_json_path(), PADDED_VOCAB, [eos], cache_size=2)
    a = ConstraintSpec("regex", "a+")
    first = small.compile(a)
    assert small.compile(ConstraintSpec("regex", "a+", "other_field")) is first
    small.compile(ConstraintSpec("regex", "b+"))
    small.compile(a)  # refreshes a
    small.compile(ConstraintSpec("regex", "c+"))  # evicts b+
    assert small.compile(a) is first
    assert ("regex", "b+") not in small._cache


# ----- thinking and rollback


def test_thinking_passes_until_end_of_thinking(compiler, tokenizer, eos):
    spec = ConstraintSpec("json_schema", json.dumps(SCHEMA))
    text = 'Let me think: letters, {"braces"} and <think> too.</think>{"name": "x", "age": 1}'
    c, rejected = run_text(compiler, tokenizer, eos, spec, text, thinking=True)
    assert rejected is None and c.is_terminated()

    c = make_constraint(compiler.compile(spec), PADDED_VOCAB, True)
    mask = new_mask()
    c.fill_allowed(mask)
    (letter,) = tokenizer.encode("a")
    assert allowed(mask, letter) and allowed(mask, eos)
    assert not any(allowed(mask, t) for t in range(TOKENIZER_VOCAB, PADDED_VOCAB))
    assert not c.accept(TOKENIZER_VOCAB + 1)
    # After </think> the grammar applies: a letter is rejected.
    assert c.accept(compiler.think_end_id) and not c.thinking
    assert not c.accept(letter)


def test_rollback(compiler, tokenizer, eos):
    spec = ConstraintSpec("regex", "[0-9]+")
    c = make_constraint(compiler.compile(spec), PADDED_VOCAB, True)
    digits = [tokenizer.encode(d)[0] for d in "12"]
    toks = tokenizer.encode("hmm") + [compiler.think_end_id] + digits
    assert drive(c, toks) is None
    c.rollback(2)  # back to just after </think>
    assert not c.thinking
    c.rollback(1)  # un-ends the thinking
    assert c.thinking
    (letter,) = tokenizer.encode("a")
    assert c.accept(letter)
    c.rollback(1)
    assert drive(c, toks[-3:] + [eos]) is None and c.is_terminated()


# ----- tool calls

TOOL_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "opts": {"type": "object", "properties": {"units": {"type": "string"}}},
            },
            "required": ["city"],
        },
    },
}
TOOL_TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
}


def dsml_call(name: str, params: list[tuple[str, str, bool]]) -> str:
    lines = [f'<｜DSML｜invoke name="{name}">']
    for key, value, is_string in params:
        flag = "true" if is_string else "false"
        lines.append(f'<｜DSML｜parameter name="{key}" string="{flag}">{value}</｜DSML｜parameter>')
    lines.append("</｜DSML｜invoke>")
    return "\n".join(lines) + "\n"


WEATHER_CALL = dsml_call(
    "get_weather",
    [("city", "Paris <north>", True), ("days", "3", False), ("opts", '{"units": "C"}', False)],
)
TIME_CALL = dsml_call("get_time", [("zone", "UTC", True)])


def converted(body: dict):
    return dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())


def recipe_tool_calls(conversation, tokenizer, token_ids: list[int]) -> list[dict]:
    """What the server returns for these output tokens: the recipe's parser over them."""
    gen = dr.ChatCompletionRequest.chunk_generator(conversation, "chatcmpl-t", MODEL)
    proc = dr.StreamProcessor(gen, conversation.parsing_options, tokenizer)
    resp = dr.ChatCompletionResponse("chatcmpl-t", MODEL, 0, 1, 0)
    chunks = proc.push(dr.InferenceChunk.ready())
    chunks += proc.push(dr.InferenceChunk.tokens(token_ids))
    chunks += proc.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
    chunks += proc.finish()
    for ch in chunks:
        resp.accumulate(ch)
    message = json.loads(resp.to_json())["choices"][0]["message"]
    return [
        {"name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"])}
        for tc in message.get("tool_calls") or []
    ]


def test_required_tool_calls_match_the_recipe(compiler, tokenizer, eos):
    body = chat(
        tools=[TOOL_WEATHER, TOOL_TIME], tool_choice="required", thinking={"type": "disabled"}
    )
    conv = converted(body)
    assert not request_thinks(conv)
    spec = constraint_spec_from_request("chat", body, conv)
    assert spec.kind == "tool_calls" and json.loads(spec.text)["block_opened"]
    # Without the converted request the body alone gives the same spec.
    assert constraint_spec_from_request("chat", body) == spec

    output = WEATHER_CALL + TIME_CALL + "</｜DSML｜tool_calls>"
    ids = tokenizer.encode(output)
    # The DSML marker is the single special token, as the model emits it (13 markers).
    assert ids.count(tokenizer.encode("｜DSML｜")[0]) == 13
    calls = recipe_tool_calls(conv, tokenizer, ids)
    assert calls == [
        {
            "name": "get_weather",
            "arguments": {"city": "Paris <north>", "days": 3, "opts": {"units": "C"}},
        },
        {"name": "get_time", "arguments": {"zone": "UTC"}},
    ]
    c = make_constraint(compiler.compile(spec), PADDED_VOCAB, False)
    assert drive(c, ids + [eos]) is None and c.is_terminated()

    for bad in [
        WEATHER_CALL.replace("get_weather", "get_wether"),  # unknown tool
        WEATHER_CALL.replace('"3"', '"three"').replace(">3<", ">three<"),  # days not an integer
        "</｜DSML｜tool_calls>",  # no call at all
        "Sure, calling it now.",
    ]:
        _, rejected = run_text(compiler, tokenizer, eos, spec, bad)
        assert rejected is not None, bad


def test_named_tool_and_no_parallel(compiler, tokenizer, eos):
    body = chat(
        tools=[TOOL_WEATHER, TOOL_TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        thinking={"type": "disabled"},
    )
    conv = converted(body)
    spec = constraint_spec_from_request("chat", body, conv)
    assert [t["name"] for t in json.loads(spec.text)["tools"]] == ["get_time"]
    ids = tokenizer.encode(TIME_CALL + "</｜DSML｜tool_calls>")
    assert recipe_tool_calls(conv, tokenizer, ids) == [
        {"name": "get_time", "arguments": {"zone": "UTC"}}
    ]
    c = make_constraint(compiler.compile(spec), PADDED_VOCAB, False)
    assert drive(c, ids + [eos]) is None and c.is_terminated()
    # get_weather is not the named tool; a second call breaks parallel_tool_calls=false.
    for bad in [WEATHER_CALL, TIME_CALL + TIME_CALL]:
        _, rejected = run_text(compiler, tokenizer, eos, spec, bad + "</｜DSML｜tool_calls>")
        assert rejected is not None


def test_anthropic_and_responses_tool_choice():
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in "fg"]
    body = {"model": MODEL, "max_tokens": 9, "messages": [], "tools": tools}
    spec = constraint_spec_from_request("messages", {**body, "tool_choice": {"type": "any"}})
    assert [t["name"] for t in json.loads(spec.text)["tools"]] == ["f", "g"]
    choice = {"type": "tool", "name": "g", "disable_parallel_tool_use": True}
    spec = json.loads(
        constraint_spec_from_request("messages", {**body, "tool_choice": choice}).text
    )
    assert [t["name"] for t in spec["tools"]] == ["g"] and spec["parallel"] is False
    assert (
        constraint_spec_from_request("messages", {**body, "tool_choice": {"type": "auto"}}) is None
    )
    # In thinking mode the recipe turns "any" into "auto" (the prompt opens no tool-call block):
    # with the converted request nothing is forced.
    any_body = {
        **body,
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "any"},
    }
    conv = dr.MessagesRequest(any_body).convert(dr.ConversionOptions())
    assert request_thinks(conv)
    assert constraint_spec_from_request("messages", any_body, conv) is None
    rbody = {
        "model": MODEL,
        "input": "x",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
    }
    spec = constraint_spec_from_request("responses", rbody)
    assert [t["name"] for t in json.loads(spec.text)["tools"]] == ["f"]


def test_tool_calls_after_thinking(compiler, tokenizer, eos):
    # A block the prompt did not open: thinking, then the block as the recipe renders it.
    spec = tool_call_spec(
        [{"name": "get_time", "parameters": TOOL_TIME["function"]["parameters"]}],
        block_opened=False,
    )
    text = "I should check the clock.</think>\n\n<｜DSML｜tool_calls>\n" + TIME_CALL
    c, rejected = run_text(
        compiler, tokenizer, eos, spec, text + "</｜DSML｜tool_calls>", thinking=True
    )
    assert rejected is None and c.is_terminated()
    _, rejected = run_text(compiler, tokenizer, eos, spec, "hm</think>The time is", thinking=True)
    assert rejected is not None


def test_missing_xgrammar_is_a_clear_error(monkeypatch, eos):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # makes `import xgrammar` fail
    with pytest.raises(ImportError, match=r"pip install 'deepinfer\[structured\]'"):
        StructuredCompiler(tokenizer_json_path(), PADDED_VOCAB, [eos])


# ----- offline LLM


def test_llm_structured_outputs(tiny_checkpoint):
    from deepinfer.config import SamplingParams
    from deepinfer.llm import LLM

    llm = LLM()
    pattern = "[a-c]{3}-[0-9]{2}"
    params = [
        SamplingParams(structured_outputs={"regex": pattern}, max_tokens=20, seed=1),
        SamplingParams(structured_outputs={"choice": ["yes", "no"]}, max_tokens=20),
        SamplingParams(max_tokens=4),
    ]
    outs = llm.generate(["Hello", "Hello", "Hello"], params, use_tqdm=False)
    assert re.fullmatch(pattern, outs[0].text) and outs[0].finish_reason == "stop"
    assert outs[1].text in ("yes", "no")
    assert outs[2].finish_reason == "length"
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        llm.generate("Hello", SamplingParams(structured_outputs={"regex": "("}), use_tqdm=False)
    assert not llm.engine.has_unfinished()
