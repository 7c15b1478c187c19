"""tool_choice auto on Anthropic Messages and OpenAI Responses (chat: test_server_structured.py):
a DSML tool-call block that does not parse, or that the token limit cuts off, comes back as the
model's text with a stop reason / status that says so, streamed or not, through the official SDKs.
The x-deepinfer-forced-output test hook makes the tiny model write the markup.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_process import server_process

MODEL = "deepseek-v4-tiny"
FORCE = "x-deepinfer-forced-output"
D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
}


def _call(value: str, string: str) -> str:
    return (
        f'Checking.\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
        f'<{D}parameter name="city" string="{string}">{value}</{D}parameter>\n</{D}invoke>\n'
        f"</{D}tool_calls>"
    )


GOOD = _call("Paris", "true")
BROKEN = _call("Paris", "false")  # a bare Paris is no JSON value: arguments are not an object
TRUNCATED = (
    f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="city" string="true">Pa'
)
CUT_AT = 27  # tokens: ends inside the parameter value (TRUNCATED is 29)
EARLY = "Hi" + TRUNCATED
THOUGHT = "Let me see.</think>"
EARLY_CUT = 5  # Hi, newlines, "<", the DSML marker, "tool": no whole tool_calls marker yet


@pytest.fixture(scope="module")
def server(tiny_checkpoint) -> Iterator[str]:
    with server_process("--test-hooks") as (_, url):
        yield url


def forced(text: str) -> dict:
    return {FORCE: json.dumps(text)}


def message(claude: anthropic.Anthropic, text: str, max_tokens: int, stream: bool, think=False):
    kw = dict(
        model=MODEL,
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"name": "get_weather", "input_schema": CITY}],
        tool_choice={"type": "auto"},
        thinking={"type": "enabled", "budget_tokens": 1024} if think else {"type": "disabled"},
        extra_headers=forced(THOUGHT + text if think else text),
    )
    if not stream:
        return claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    # Block indices stay gapless: each block starts and stops once, in order.
    starts = [e.index for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(final.content)))
    # The stream ends with message_delta then message_stop, also when tool blocks were held.
    assert [e.type for e in events][-2:] == ["message_delta", "message_stop"]
    return final


def response(oai: openai.OpenAI, text: str, max_tokens: int, stream: bool):
    kw = dict(
        model=MODEL,
        input="Weather in Paris?",
        max_output_tokens=max_tokens,
        tools=[{"type": "function", "name": "get_weather", "parameters": CITY, "strict": False}],
        tool_choice="auto",
        reasoning={"effort": "none"},
        extra_headers=forced(text),
    )
    if not stream:
        return oai.responses.create(**kw)
    # Not responses.stream(): its helper insists on response.completed, and a cut-off response
    # ends with response.incomplete.
    events = list(oai.responses.create(**kw, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == list(range(len(final.output)))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done == final.output  # the streamed items are the final ones
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == response_text(final)
    return final


def chat(oai: openai.OpenAI, text: str, max_tokens: int, stream: bool) -> tuple[str, list, str]:
    """(content, tool calls as (name, arguments), finish reason)."""
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=max_tokens,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}],
        tool_choice="auto",
        extra_body={"thinking": {"type": "disabled"}},
        extra_headers=forced(text),
        stream=stream,
    )
    if not stream:
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        return m.content or "", calls, r.choices[0].finish_reason
    content, finish, calls = "", "", {}
    for c in r:
        for choice in c.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                name, args = calls.get(d.index, ("", ""))
                calls[d.index] = (
                    name + (d.function.name or ""),
                    args + (d.function.arguments or ""),
                )
    return content, list(calls.values()), finish


def message_text(m) -> str:
    return "".join(b.text for b in m.content if b.type == "text")


def response_text(r) -> str:
    return "".join(
        part.text for item in r.output if item.type == "message" for part in item.content
    )


STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


# ---- Anthropic Messages -------------------------------------------------------------------------


@STREAM
def test_messages_tool_call_that_does_not_parse_comes_back_as_text(claude, stream) -> None:
    m = message(claude, BROKEN + EOS, 80, stream)
    assert [b.type for b in m.content] == ["text", "text"]
    assert message_text(m) == BROKEN  # the markup as the model wrote it
    # No stop reason means "malformed tool call"; end_turn: the turn ended, with text only.
    assert m.stop_reason == "end_turn"


@STREAM
def test_messages_tool_call_that_does_not_parse_after_thinking(claude, stream) -> None:
    m = message(claude, BROKEN + EOS, 300, stream, think=True)
    # The thinking block stays; the text block takes the tool_use block's index.
    assert [b.type for b in m.content] == ["thinking", "text", "text"]
    assert m.content[0].thinking == "Let me see."
    assert message_text(m) == BROKEN and m.stop_reason == "end_turn"


@STREAM
def test_messages_truncated_tool_call_comes_back_as_text(claude, stream) -> None:
    m = message(claude, TRUNCATED, CUT_AT, stream)
    assert [b.type for b in m.content] == ["text"]
    assert m.stop_reason == "max_tokens"
    text = message_text(m)
    assert TRUNCATED.startswith(text) and "get_weather" in text


@STREAM
def test_messages_block_cut_before_its_first_call_is_not_dropped(claude, stream) -> None:
    m = message(claude, EARLY, EARLY_CUT, stream)
    assert m.stop_reason == "max_tokens"
    assert message_text(m) == f"Hi\n\n<{D}tool"


@STREAM
def test_messages_valid_tool_call_stays_a_tool_call(claude, stream) -> None:
    m = message(claude, GOOD + EOS, 80, stream)
    assert [b.type for b in m.content] == ["text", "tool_use"]
    assert m.content[1].name == "get_weather" and m.content[1].input == {"city": "Paris"}
    assert m.stop_reason == "tool_use"


# ---- OpenAI Responses ---------------------------------------------------------------------------


@STREAM
def test_responses_tool_call_that_does_not_parse_comes_back_as_text(oai, stream) -> None:
    r = response(oai, BROKEN + EOS, 80, stream)
    assert [item.type for item in r.output] == ["message", "message"]
    assert response_text(r) == BROKEN
    assert r.status == "completed" and r.incomplete_details is None


@STREAM
def test_responses_truncated_tool_call_comes_back_as_text(oai, stream) -> None:
    r = response(oai, TRUNCATED, CUT_AT, stream)
    assert [item.type for item in r.output] == ["message"]
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"
    text = response_text(r)
    assert TRUNCATED.startswith(text) and "get_weather" in text


@STREAM
def test_responses_block_cut_before_its_first_call_is_not_dropped(oai, stream) -> None:
    r = response(oai, EARLY, EARLY_CUT, stream)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert response_text(r) == f"Hi\n\n<{D}tool"


@STREAM
def test_responses_valid_tool_call_stays_a_tool_call(oai, stream) -> None:
    r = response(oai, GOOD + EOS, 80, stream)
    assert [item.type for item in r.output] == ["message", "function_call"]
    assert r.output[1].name == "get_weather"
    assert json.loads(r.output[1].arguments) == {"city": "Paris"}
    assert r.status == "completed"


# ---- chat (the rest of its cases are in test_server_structured.py) -------------------------------


@STREAM
def test_chat_block_cut_before_its_first_call_is_not_dropped(oai, stream) -> None:
    content, calls, finish = chat(oai, EARLY, EARLY_CUT, stream)
    assert not calls and finish == "length"
    assert content == f"Hi\n\n<{D}tool"


@STREAM
def test_chat_valid_tool_call_stays_a_tool_call(oai, stream) -> None:
    content, calls, finish = chat(oai, GOOD + EOS, 80, stream)
    assert content == "Checking."
    assert calls == [("get_weather", json.dumps({"city": "Paris"}))]
    assert finish == "tool_calls"


def test_unsent_text_never_repeats_what_was_sent() -> None:
    from deepinfer.server.usage import TOOL_BLOCK, unsent_text

    answer = "Checking. " + TOOL_BLOCK + "\n..."
    assert unsent_text(answer, "Checking. ") == TOOL_BLOCK + "\n..."
    assert unsent_text(answer, "") == answer
    # The parser sent normalised text (not a prefix of the answer): resume at the tool block.
    assert unsent_text(answer, "Checking.  ") == TOOL_BLOCK + "\n..."
