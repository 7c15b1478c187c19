"""Tool-call blocks that cannot be returned as calls, on Anthropic Messages and OpenAI Responses.

As for chat (usage.fix_tool_calls), a DSML tool-call block whose arguments are not a JSON object,
or that the token limit cut off, comes back as the text the model wrote (markup included), never
as a call with invalid arguments and never dropped. Streams hold the tool-call events from the
first one to the end of the message, when the arguments can be checked, then release them or send
one text block / message item in their place (block indices and sequence numbers stay gapless).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from deepinfer.server.usage import (
    OutputTokens,
    arguments_parse,
    dropped_markup,
    dumps,
    unsent_text,
)

Event = tuple[str | None, str]  # (SSE event name, data)


class ToolCallGuard(Protocol):
    def feed(self, name: str | None, data: str, tokens: OutputTokens) -> list[Event]:
        """The stream events to send for one event: none while tool calls are held."""

    def observe(self, event: Any) -> None:
        """Non-streamed: sees each recipe event before it is accumulated."""

    def fix(self, obj: dict, tokens: OutputTokens) -> None:
        """Non-streamed: edits the accumulated response."""


def tool_call_guard(protocol_name: str) -> ToolCallGuard | None:
    if protocol_name == "messages":
        return MessagesGuard()
    if protocol_name == "responses":
        return ResponsesGuard()
    return None  # chat: usage.ChunkEditor.edit_all and usage.fix_tool_calls


# ---- Anthropic Messages ------------------------------------------------------------------------


def _stop_reason(stop: str | None) -> str:
    # Anthropic has no stop reason for a malformed tool call, and the SDK types stop_reason as a
    # closed Literal that clients switch on, so no custom value. "end_turn" is the truth once the
    # block is text: the model ended its turn and the message holds no tool_use to answer.
    # A cut-off block keeps "max_tokens" (and a stop sequence its own reason).
    return stop if stop in ("max_tokens", "stop_sequence") else "end_turn"


def _text_block_events(index: int, text: str) -> list[Event]:
    events = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        },
        {"type": "content_block_stop", "index": index},
    ]
    return [(e["type"], dumps(e)) for e in events]


class MessagesGuard:
    """The recipe reports a tool_use whose input did not parse with input {} (and stop_reason
    tool_use); only the streamed input_json_delta pieces show what the model wrote, so they are
    recorded in both modes."""

    def __init__(self) -> None:
        self._inputs: dict[int, str] = {}  # tool_use block index -> its input JSON as streamed
        self._sent = ""  # text sent before the first tool_use block
        self._blocks = 0  # content blocks started
        self._first_tool: int | None = None
        self._held: list[Event] = []
        self._ended = False  # message_delta seen: the rest (message_stop) is not held

    def _record(self, obj: dict) -> None:
        kind, index = obj.get("type"), obj.get("index", 0)
        if kind == "content_block_start":
            self._blocks = max(self._blocks, index + 1)
            if (obj.get("content_block") or {}).get("type") == "tool_use":
                self._inputs[index] = ""
                if self._first_tool is None:
                    self._first_tool = index
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            if delta.get("type") == "input_json_delta" and index in self._inputs:
                self._inputs[index] += delta.get("partial_json") or ""
            elif delta.get("type") == "text_delta" and self._first_tool is None:
                self._sent += delta.get("text") or ""

    def observe(self, event: Any) -> None:
        data = event.to_json()
        if '"tool_use"' in data or '"input_json_delta"' in data:
            self._record(json.loads(data))

    def _broken(self, stop: str | None, sent: str, rest: str) -> bool:
        if not self._inputs:
            return dropped_markup(rest, sent)
        return stop == "max_tokens" or not all(arguments_parse(v) for v in self._inputs.values())

    def feed(self, name: str | None, data: str, tokens: OutputTokens) -> list[Event]:
        obj = json.loads(data)
        if self._ended:  # message_stop and anything after the decision pass through
            return [(name, data)]
        self._record(obj)
        if obj.get("type") != "message_delta":
            if self._first_tool is None:
                return [(name, data)]
            self._held.append((name, data))
            return []
        # The message's end: release the held blocks, or one text block in their place.
        self._ended = True
        held, self._held = self._held, []
        delta = obj.get("delta") or {}
        rest = unsent_text(tokens.answer_text(), self._sent)
        if not self._broken(delta.get("stop_reason"), self._sent, rest):
            return [*held, (name, data)]
        delta["stop_reason"] = _stop_reason(delta.get("stop_reason"))
        index = self._blocks if self._first_tool is None else self._first_tool
        return [*_text_block_events(index, rest), (name, dumps(obj))]

    def fix(self, obj: dict, tokens: OutputTokens) -> None:
        content = obj.get("content") or []
        first = next((k for k, b in enumerate(content) if b.get("type") == "tool_use"), None)
        before = content if first is None else content[:first]
        sent = "".join(b.get("text") or "" for b in before if b.get("type") == "text")
        rest = unsent_text(tokens.answer_text(), sent)
        if self._broken(obj.get("stop_reason"), sent, rest):
            obj["content"] = [*before, {"type": "text", "text": rest}]
            obj["stop_reason"] = _stop_reason(obj.get("stop_reason"))


# ---- OpenAI Responses --------------------------------------------------------------------------

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def fix_responses_output(resp: dict, tokens: OutputTokens) -> tuple[int, dict] | None:
    """Replaces function_call items that cannot be returned as calls (arguments that are not a
    JSON object, or cut off) by one message item with the text; returns its output index and the
    item, or None when nothing changed. A cut-off response stays "incomplete" (max_output_tokens);
    one whose arguments did not parse stays "completed": the model finished, with text."""
    output = resp.get("output") or []
    calls = [k for k, item in enumerate(output) if item.get("type") == "function_call"]
    first = calls[0] if calls else len(output)
    sent = "".join(
        part.get("text") or ""
        for item in output[:first]
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    )
    rest = unsent_text(tokens.answer_text(), sent)
    truncated = (resp.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    if calls:
        broken = truncated or not all(
            output[k].get("status") != "incomplete" and arguments_parse(output[k].get("arguments"))
            for k in calls
        )
    else:
        broken = dropped_markup(rest, sent)
    if not broken:
        return None
    message = {
        "type": "message",
        "id": f"msg_{resp.get('id', '')}_{first}",
        "status": "incomplete" if truncated else "completed",
        "role": "assistant",
        "phase": "final_answer",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": rest}],
    }
    resp["output"] = [*output[:first], message]
    return first, message


def _message_item_events(index: int, message: dict, seq: int) -> list[Event]:
    text = message["content"][0]["text"]
    ids = {"item_id": message["id"], "output_index": index}
    part = {"type": "output_text", "annotations": [], "logprobs": []}
    events = [
        {
            "type": "response.output_item.added",
            "item": {**message, "status": "in_progress", "content": []},
            "output_index": index,
        },
        {
            "type": "response.content_part.added",
            "content_index": 0,
            **ids,
            "part": {**part, "text": ""},
        },
        {
            "type": "response.output_text.delta",
            "content_index": 0,
            "delta": text,
            **ids,
            "logprobs": [],
        },
        {
            "type": "response.output_text.done",
            "content_index": 0,
            **ids,
            "logprobs": [],
            "text": text,
        },
        {
            "type": "response.content_part.done",
            "content_index": 0,
            **ids,
            "part": {**part, "text": text},
        },
        {"type": "response.output_item.done", "item": message, "output_index": index},
    ]
    return [(e["type"], dumps({**e, "sequence_number": seq + k})) for k, e in enumerate(events)]


class ResponsesGuard:
    """function_call items carry their raw arguments and status in the final response, so the
    decision is made on it; the stream only holds the items' events until then."""

    def __init__(self) -> None:
        self._held: list[Event] | None = None
        self._first_seq = 0  # sequence number of the first held event

    def feed(self, name: str | None, data: str, tokens: OutputTokens) -> list[Event]:
        obj = json.loads(data)
        kind = obj.get("type")
        if kind in _TERMINAL and isinstance(obj.get("response"), dict):
            held, self._held = self._held or [], None
            fixed = fix_responses_output(obj["response"], tokens)
            if fixed is None:
                return [*held, (name, data)]
            seq = self._first_seq if held else obj.get("sequence_number", 0)
            events = _message_item_events(*fixed, seq)
            obj["sequence_number"] = seq + len(events)
            return [*events, (name, dumps(obj))]
        if self._held is None:
            item = obj.get("item") or {}
            if kind == "response.output_item.added" and item.get("type") == "function_call":
                self._held, self._first_seq = [], obj.get("sequence_number", 0)
            else:
                return [(name, data)]
        self._held.append((name, data))
        return []

    def observe(self, event: Any) -> None:
        pass

    def fix(self, obj: dict, tokens: OutputTokens) -> None:
        fix_responses_output(obj, tokens)
