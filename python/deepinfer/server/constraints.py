"""Structured outputs and forced tool calls for the server routes, around deepinfer.structured.

Reads the request's constraint (response_format, text.format, vLLM's structured_outputs /
guided_*, tool_choice), compiles it off the event loop with one lazily built StructuredCompiler
(xgrammar pulls in torch: a server that never sees a constraint never loads it) and makes one
TokenConstraint per engine request.

The recipe refuses (chat) or downgrades to "auto" (Messages) a forced tool choice in thinking
mode. plan() then converts the request with tool_choice "auto" and enforces the call itself with a
grammar that opens the tool-call block after the thinking, so thinking comes first.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepinfer.server.sampling import RequestError
from deepinfer.structured import (
    CompiledConstraint,
    ConstraintSpec,
    StructuredCompiler,
    constraint_spec_from_request,
    make_constraint,
    request_thinks,
    tool_call_spec,
)

if TYPE_CHECKING:
    from deepinfer.server.app import Server

# vLLM's fields; the recipe does not know them, so they are taken out of the body it converts.
VLLM_FIELDS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)

_QUOTED = re.compile(r"'([^']+)'")


def bad_spec(e: ValueError) -> RequestError:
    """A 400 whose param is the field the message names first."""
    m = _QUOTED.search(str(e))
    param = m.group(1).split(".")[0].split("[")[0] if m else None
    return RequestError(400, str(e), param)


def pop_vllm_fields(body: dict) -> dict:
    return {k: body.pop(k) for k in VLLM_FIELDS if k in body}


def _auto_choice(protocol_name: str) -> Any:
    return {"type": "auto"} if protocol_name == "messages" else "auto"


@dataclass
class Plan:
    """What the route converts (`body`) and the constraint to enforce once it has converted."""

    body: dict
    # The body-only spec: a forced tool call's is replaced from the conversation (see spec()).
    body_spec: ConstraintSpec | None
    lookup: dict  # the body with the vLLM fields, for constraint_spec_from_request
    auto_tools: bool  # converted with tool_choice "auto" (the constraint forces the call)

    def spec(self, protocol_name: str, conversation: Any) -> ConstraintSpec | None:
        try:
            spec = constraint_spec_from_request(protocol_name, self.lookup, conversation)
        except ValueError as e:
            raise bad_spec(e) from e
        forced = self.body_spec is not None and self.body_spec.kind == "tool_calls"
        if forced and (self.auto_tools or spec is None or spec.kind != "tool_calls"):
            # The recipe did not force the call (thinking mode; Messages' "any" and "tool"
            # become "auto"): the prompt has no open block, the grammar opens it.
            assert self.body_spec is not None
            data = json.loads(self.body_spec.text)
            return tool_call_spec(data["tools"], parallel=data["parallel"], block_opened=False)
        return spec


def plan(protocol_name: str, body: dict, convert: Any) -> tuple[Plan, Any]:
    """(the plan, the recipe's ConversationRequest). `body` has been through prepare_request;
    `convert(body)` converts a body with the recipe. Raises RequestError (400) for an invalid
    constraint field; the recipe's own errors pass through."""
    extra = pop_vllm_fields(body)
    lookup = {**body, **extra}
    try:
        body_spec = constraint_spec_from_request(protocol_name, lookup)
    except ValueError as e:
        raise bad_spec(e) from e
    if body_spec is not None and body_spec.kind == "tool_calls":
        auto = {**body, "tool_choice": _auto_choice(protocol_name)}
        conversation = convert(auto)
        if request_thinks(conversation):
            return Plan(auto, body_spec, lookup, True), conversation
    return Plan(body, body_spec, lookup, False), convert(body)


class Constraints:
    """The server's compiler, built on first use (thread-safe)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int]) -> None:
        self._args = (tokenizer_json, vocab_size, eos_ids)
        self.vocab_size = vocab_size
        self._compiler: StructuredCompiler | None = None
        self._lock = threading.Lock()

    def compiler(self) -> StructuredCompiler:
        with self._lock:
            if self._compiler is None:
                self._compiler = StructuredCompiler(*self._args)
            return self._compiler

    def _compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        return self.compiler().compile(spec)

    async def compile(self, server: Server, spec: ConstraintSpec) -> CompiledConstraint:
        """Compiled in a worker thread; RequestError: 400 naming the field (or xgrammar
        missing)."""
        try:
            return await server.off_loop(self._compile, spec)
        except ImportError as e:
            raise RequestError(400, str(e), spec.field.split(".")[0] or None) from e
        except ValueError as e:
            raise RequestError(400, str(e), spec.field.split(".")[0] or None) from e

    def make(self, compiled: CompiledConstraint, thinking: bool) -> Any:
        """A fresh per-request constraint: each engine request (each of n samples) needs its own."""
        return make_constraint(compiled, self.vocab_size, thinking)
