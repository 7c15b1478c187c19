"""Structured-output requests: the one constraint a request asks for (an answer format, vLLM's
`structured_outputs` / `guided_*` fields, or a forced tool call), normalized into a ConstraintSpec
that deepinfer.structured compiles. Pure parsing: no xgrammar needed here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice", "tool_calls")

# DeepSeek V4's DSML marker (deepseek_recipe's default; a single token in the tokenizer).
DSML = "｜DSML｜"


@dataclass(frozen=True)
class ConstraintSpec:
    """One normalized constraint: `kind` (see KINDS) and its text. `field` names the request field
    it came from, for error messages; it is not part of equality or the cache key.

    text per kind: json_schema: the schema as JSON; json_object: ""; regex: the pattern; grammar:
    xgrammar EBNF (or Lark); choice: a JSON array of strings; tool_calls: JSON
    {"tools": [{"name", "parameters"}], "parallel": bool, "block_opened": bool}.
    """

    kind: str
    text: str
    field: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.text)


def _schema_text(schema: Any, where: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"'{where}' is not valid JSON: {e}") from e
    if not isinstance(schema, dict | bool):
        raise ValueError(f"'{where}' must be a JSON schema object")
    # Key order is kept: properties are generated in the schema's declared order.
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"'{where}' must be a non-empty string")
    return value


def _choice_text(choices: Any, where: str) -> str:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"'{where}' must be a non-empty list of strings")
    return json.dumps(choices, ensure_ascii=False)


def _format_spec(fmt: Any, where: str, flat: bool) -> ConstraintSpec | None:
    """OpenAI chat `response_format` (flat=False) or Responses `text.format` (flat=True)."""
    if not isinstance(fmt, dict):
        raise ValueError(f"'{where}' must be an object")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object", "", where)
    if kind == "json_schema":
        inner = fmt if flat else fmt.get("json_schema")
        inner_where = where if flat else f"{where}.json_schema"
        if not isinstance(inner, dict) or "schema" not in inner:
            raise ValueError(f"'{inner_where}.schema' is required for type 'json_schema'")
        where = f"{inner_where}.schema"
        return ConstraintSpec("json_schema", _schema_text(inner["schema"], where), where)
    if kind == "regex":  # the recipe's extension of response_format
        return ConstraintSpec("regex", _string(fmt.get("regex"), f"{where}.regex"), where)
    raise ValueError(f"unsupported '{where}.type': {json.dumps(kind)}")


def _vllm_spec(key: str, value: Any, where: str) -> ConstraintSpec | None:
    if key == "json":
        return ConstraintSpec("json_schema", _schema_text(value, where), where)
    if key == "json_object":
        return ConstraintSpec("json_object", "", where) if value else None
    if key == "regex":
        return ConstraintSpec("regex", _string(value, where), where)
    if key == "choice":
        return ConstraintSpec("choice", _choice_text(value, where), where)
    if key == "grammar":
        return ConstraintSpec("grammar", _string(value, where), where)
    raise AssertionError(key)


# vLLM's structured_outputs keys that select a constraint, and its legacy guided_* fields.
_VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def _format_specs(protocol_name: str, body: dict) -> list[ConstraintSpec]:
    specs: list[ConstraintSpec | None] = []
    if protocol_name == "chat" and body.get("response_format") is not None:
        specs.append(_format_spec(body["response_format"], "response_format", flat=False))
    if protocol_name == "responses" and body.get("text") is not None:
        text = body["text"]
        if not isinstance(text, dict):
            raise ValueError("'text' must be an object")
        if text.get("format") is not None:
            specs.append(_format_spec(text["format"], "text.format", flat=True))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise ValueError("'structured_outputs' must be an object")
        for key in _VLLM_KEYS:
            if so.get(key) is not None:
                specs.append(_vllm_spec(key, so[key], f"structured_outputs.{key}"))
    for name, key in _GUIDED.items():
        if body.get(name) is not None:
            specs.append(_vllm_spec(key, body[name], name))
    found = [s for s in specs if s is not None]
    if len(found) > 1:
        names = ", ".join(f"'{s.field}'" for s in found)
        raise ValueError(f"conflicting output constraints: {names} (give at most one)")
    return found


def _tool_entries(protocol_name: str, tools: Any) -> list[dict]:
    """[{"name", "parameters"}] for the request's function tools."""
    if not isinstance(tools, list):
        raise ValueError("'tools' must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"'tools[{i}]' must be an object")
        if protocol_name == "messages":
            name, params = tool.get("name"), tool.get("input_schema")
        elif protocol_name == "responses":
            if tool.get("type") != "function":
                continue
            name, params = tool.get("name"), tool.get("parameters")
        else:
            if tool.get("type", "function") != "function":
                continue
            fn = tool.get("function") or {}
            name, params = fn.get("name"), fn.get("parameters")
        if not isinstance(name, str) or not name:
            raise ValueError(f"'tools[{i}]' has no function name")
        out.append({"name": name, "parameters": params})
    return out


def _forced_tool(protocol_name: str, choice: Any) -> tuple[bool, str | None]:
    """(whether a tool call is forced, the one tool name or None for any of them)."""
    if choice is None or choice in ("auto", "none"):
        return False, None
    if choice == "required":
        return True, None
    if not isinstance(choice, dict):
        raise ValueError(f"unsupported 'tool_choice': {json.dumps(choice)}")
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return False, None
    if kind == "any":
        return True, None
    if kind == "tool":
        return True, _string(choice.get("name"), "tool_choice.name")
    if kind == "function":
        if protocol_name == "chat":
            name = (choice.get("function") or {}).get("name")
            return True, _string(name, "tool_choice.function.name")
        return True, _string(choice.get("name"), "tool_choice.name")
    raise ValueError(f"unsupported 'tool_choice': {json.dumps(choice)}")


def _parallel(body: dict) -> bool:
    """OpenAI `parallel_tool_calls`, Anthropic `tool_choice.disable_parallel_tool_use`."""
    if body.get("parallel_tool_calls") is False:
        return False
    choice = body.get("tool_choice")
    return not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True)


def tool_call_spec(
    tools: Sequence[dict], *, parallel: bool = True, block_opened: bool = True
) -> ConstraintSpec:
    """A forced tool-call spec over `tools` ([{"name", "parameters"}]): at least one call of one
    of them (exactly one when not `parallel`). `block_opened`: the prompt already ends with the
    opening `<｜DSML｜tool_calls>` line (the recipe does that for a forced tool choice)."""
    if not tools:
        raise ValueError("'tool_choice' forces a tool call but the request has no tools")
    entries = [
        {"name": t["name"], "parameters": t.get("parameters") or {"type": "object"}} for t in tools
    ]
    text = json.dumps(
        {"tools": entries, "parallel": parallel, "block_opened": block_opened},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return ConstraintSpec("tool_calls", text, "tools")


def _recipe_tools(output_constraint: Any) -> list[dict]:
    out = []
    for tool in json.loads(output_constraint.schema):
        fn = tool.get("function", tool)
        out.append({"name": fn["name"], "parameters": fn.get("parameters")})
    return out


def constraint_spec_from_request(
    protocol_name: str, body: dict, conversation: Any = None
) -> ConstraintSpec | None:
    """The one output constraint a request asks for, or None.

    protocol_name: "chat", "responses" or "messages". body: the request JSON. Reads chat
    `response_format`, Responses `text.format`, vLLM's `structured_outputs` and the legacy
    `guided_*` fields, and `tools` / `tool_choice` / `parallel_tool_calls`. A forced tool choice
    takes precedence over an answer format (the format then applies to a later turn).

    conversation: the recipe's ConversationRequest for this body; the server must pass it (the
    body-only reading is for offline use and tests). Its output constraint decides whether tool
    calls are forced (the recipe turns some forced choices into "auto" in thinking mode), gives
    the tools as rendered in the prompt (a named choice narrows them to that one) and the
    strict-normalized JSON schema, and its parsing options say whether the prompt opened the
    tool-call block.

    Raises ValueError naming the field when a field is invalid or constraints conflict.
    """
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    specs = _format_specs(protocol_name, body)
    spec = specs[0] if specs else None

    parallel = _parallel(body)
    if conversation is not None:
        oc = conversation.inference_options.output_constraint
        if oc is not None and oc.kind == "tool_call_required":
            opened = bool(conversation.parsing_options.starts_in_tool_calls)
            return tool_call_spec(_recipe_tools(oc), parallel=parallel, block_opened=opened)
        # The recipe normalizes strict schemas (every property required, no extras).
        recipe_schema = oc.schema if oc is not None and oc.kind == "json" else ""
        if spec is not None and spec.kind == "json_schema" and recipe_schema:
            spec = ConstraintSpec("json_schema", recipe_schema, spec.field)
        return spec

    forced, name = _forced_tool(protocol_name, body.get("tool_choice"))
    if forced:
        tools = _tool_entries(protocol_name, body.get("tools") or [])
        if name is not None:
            tools = [t for t in tools if t["name"] == name]
            if not tools:
                raise ValueError(f"'tool_choice' names an unknown tool {json.dumps(name)}")
        return tool_call_spec(tools, parallel=parallel)
    return spec


def request_thinks(conversation: Any) -> bool:
    """Whether the recipe's ConversationRequest generates in thinking mode: the prompt ends inside
    a thinking block, so the grammar applies only after the end-of-thinking token."""
    po = conversation.parsing_options
    stage = po.thinking_initial_stage
    return stage is not None and stage.starts_in_reasoning() and not po.starts_in_tool_calls
