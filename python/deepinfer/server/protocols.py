"""The three protocols behind one request path: what differs is the recipe request and response
classes, the chunk generator, the accepted fields, and the error body shape."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import deepseek_recipe as dr

# Where each protocol carries the answer's JSON schema (for the recipe's schema errors).
SCHEMA_FIELDS = {"chat": "response_format.json_schema.schema", "responses": "text.format.schema"}


@dataclass(frozen=True)
class Protocol:
    name: str  # "chat", "responses", "messages"
    request_cls: Any
    response_cls: Any
    anthropic_errors: bool
    # Top-level fields a request may carry; anything else is rejected as unsupported.
    fields: frozenset[str] = field(default_factory=frozenset)
    # Fields accepted only with these values (the engine has no other behaviour).
    restricted: dict[str, Any] = field(default_factory=dict)

    def error_body(
        self,
        status: int,
        message: str,
        kind: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> dict:
        kind = kind or ("invalid_request_error" if status < 500 else "api_error")
        if self.anthropic_errors:
            if status == 404:
                kind = "not_found_error"
            return {"type": "error", "error": {"type": kind, "message": message}}
        return {"error": {"message": message, "type": kind, "param": param, "code": code or kind}}

    def error_from_recipe(self, status: int, body: str) -> dict:
        """The recipe writes OpenAI-shaped errors; Messages clients expect Anthropic's shape.
        The recipe's answer-schema errors get the field they are about."""
        if not self.anthropic_errors:
            try:
                obj = json.loads(body)
            except json.JSONDecodeError:
                return self.error_body(status, body)
            error = obj.get("error") if isinstance(obj, dict) else None
            schema_field = SCHEMA_FIELDS.get(self.name)
            if isinstance(error, dict) and schema_field and error.get("param") is None:
                message = str(error.get("message", ""))
                if message.lower().startswith("invalid json schema"):
                    error["param"] = schema_field
                    error["message"] = (
                        f"invalid JSON schema in '{schema_field}': "
                        + message.split(":", 1)[-1].strip()
                    )
            return obj
        try:
            message = json.loads(body)["error"]["message"]
        except (json.JSONDecodeError, KeyError, TypeError):
            message = body
        return self.error_body(status, message)


CHAT = Protocol(
    "chat",
    dr.ChatCompletionRequest,
    dr.ChatCompletionResponse,
    anthropic_errors=False,
    fields=frozenset(
        {
            "model",
            "kv_retention",
            "messages",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "seed",
            "stop",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "response_format",
            "logprobs",
            "top_logprobs",
            "thinking",
            "reasoning_effort",
            "user",
            "metadata",
            "store",
            "service_tier",
            "n",
            "logit_bias",
            "frequency_penalty",
            "presence_penalty",
            # vLLM's structured outputs (constraints.py)
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
        }
    ),
)

RESPONSES = Protocol(
    "responses",
    dr.ResponsesRequest,
    dr.ResponsesResponse,
    anthropic_errors=False,
    fields=frozenset(
        {
            "model",
            "kv_retention",
            "input",
            "instructions",
            "stream",
            "stream_options",
            "max_output_tokens",
            "temperature",
            "top_p",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "reasoning",
            "text",
            "store",
            "metadata",
            "user",
            "truncation",
            "include",
            "top_logprobs",
            "service_tier",
            "previous_response_id",
            "background",
        }
    ),
    # Stateless: no stored responses to continue from or to poll.
    restricted={"previous_response_id": None, "background": False},
)

MESSAGES = Protocol(
    "messages",
    dr.MessagesRequest,
    dr.MessagesResponse,
    anthropic_errors=True,
    fields=frozenset(
        {
            "model",
            "kv_retention",
            "messages",
            "max_tokens",
            "system",
            "stream",
            "temperature",
            "top_p",
            "top_k",
            "stop_sequences",
            "tools",
            "tool_choice",
            "thinking",
            "metadata",
            "service_tier",
        }
    ),
)


def unsupported_field(protocol: Protocol, body: bytes) -> str | None:
    """A message naming the first unsupported field of a JSON object body, or None. Bodies that
    are not JSON objects are left to the recipe, which reports them in the protocol's terms."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    for key in obj:
        if key not in protocol.fields:
            return f"unsupported field '{key}'"
        if key in protocol.restricted and obj[key] != protocol.restricted[key]:
            want = json.dumps(protocol.restricted[key])
            return (
                f"unsupported value for '{key}': {json.dumps(obj[key])} (only {want} is supported)"
            )
    return None
