"""Structured outputs and enforced tool calls: grammars compiled by xgrammar, applied per token.

How the server uses it (one `StructuredCompiler` per server / LLM, built at startup):

    compiler = StructuredCompiler(tokenizer_json_path(model_path), engine.vocab_size,
                                  engine.eos_token_ids)
    ...
    conversation = req.convert(options)                       # the recipe's ConversationRequest
    spec = constraint_spec_from_request(protocol.name, body_dict, conversation)  # ValueError: 400
    if spec is not None:
        compiled = await asyncio.to_thread(compiler.compile, spec)               # ValueError: 400
        constraint = make_constraint(compiled, engine.vocab_size, request_thinks(conversation))
        params = deepinfer_core.SamplingParams(..., constraint=constraint)       # one per request

`compile` may take a while for a large schema and is cached (LRU keyed by the spec's kind and
text), so it runs in a worker thread, never on the event loop or the engine's step path. The
constraint is the engine's `TokenConstraint`: `fill_allowed` writes the next-token bitmask,
`accept` advances the matcher (False: the engine ends the request with "grammar_error"),
`is_terminated` says the output is complete. In thinking mode tokens pass unconstrained until the
end-of-thinking token, after which the grammar applies.

Forced tool calls (`tool_choice` "required" or a named tool, Anthropic "any"/"tool") compile a
grammar over DeepSeek V4's DSML markup. The recipe only forces tools outside thinking mode, and
then the prompt already ends with the opening `<｜DSML｜tool_calls>` line, so the grammar starts
at the first invoke. With `tool_choice` "auto" nothing is enforced.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

XGRAMMAR_MISSING = "structured outputs need xgrammar: pip install 'deepinfer[structured]'"

# Whitespace characters allowed between JSON tokens: enough for indented output, yet bounded, so a
# model that prefers whitespace cannot spend its whole budget there.
JSON_MAX_WHITESPACE = 16

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice", "tool_calls")

# DeepSeek V4 spellings (deepseek_recipe's defaults; they are single tokens in the tokenizer).
THINK_END = "</think>"
DSML = "｜DSML｜"


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as e:  # torch comes with it, hence optional
        raise ImportError(XGRAMMAR_MISSING) from e
    return xgrammar


# ---------------------------------------------------------------------------------------------
# Specs


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


# ---------------------------------------------------------------------------------------------
# Compilation


def _dsml_structural_tag(spec_text: str) -> Any:
    """xgrammar structural tag for DeepSeek V4 tool calls, as deepseek_recipe renders them:

        <｜DSML｜tool_calls>
        <｜DSML｜invoke name="NAME">
        <｜DSML｜parameter name="P" string="true">raw text</｜DSML｜parameter>
        <｜DSML｜parameter name="Q" string="false">JSON value</｜DSML｜parameter>
        </｜DSML｜invoke>
        </｜DSML｜tool_calls>

    Parameters follow each tool's JSON schema (xgrammar's "deepseek_xml" style); the end of the
    block leaves only the stop token."""
    st = _xgr().structural_tag
    data = json.loads(spec_text)
    tags = [
        st.TagFormat(
            begin=f'<{DSML}invoke name="{tool["name"]}">\n',
            content=st.JSONSchemaFormat(
                json_schema=tool["parameters"],
                style="deepseek_xml",
                max_whitespace_cnt=JSON_MAX_WHITESPACE,
            ),
            end=f"</{DSML}invoke>\n",
        )
        for tool in data["tools"]
    ]
    elements = []
    if not data["block_opened"]:
        elements.append(st.ConstStringFormat(value=f"\n\n<{DSML}tool_calls>\n"))
    elements.append(
        st.TagsWithSeparatorFormat(
            tags=tags, separator="", at_least_one=True, stop_after_first=not data["parallel"]
        )
    )
    elements.append(st.ConstStringFormat(value=f"</{DSML}tool_calls>"))
    return st.StructuralTag(format=st.SequenceFormat(elements=elements))


def _choice_ebnf(text: str) -> str:
    # JSON string escapes are also xgrammar EBNF literal escapes.
    alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in json.loads(text))
    return f"root ::= {alts}"


_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def _clean(e: Exception) -> str:
    return _LOG_PREFIX.sub("", str(e).strip()).splitlines()[0] if str(e).strip() else repr(e)


@dataclass(frozen=True)
class CompiledConstraint:
    """A compiled grammar plus what a per-request constraint needs."""

    spec: ConstraintSpec
    grammar: Any  # xgrammar.CompiledGrammar
    vocab_size: int  # the TokenizerInfo's (model) vocabulary size
    think_end_id: int | None
    # Bitmask allowing every token the tokenizer has (used while thinking).
    allow_all: np.ndarray


def _load_encoded_vocab(tokenizer_json: str) -> list[str]:
    """Token strings by id as tokenizer.json stores them: byte-level encoded for the BPE vocabulary,
    literal text for added tokens (what transformers' get_vocab gives xgrammar)."""
    with open(tokenizer_json, encoding="utf-8") as f:
        data = json.load(f)
    model = data.get("model", {})
    if model.get("type") != "BPE":
        raise ValueError(f"{tokenizer_json}: expected a byte-level BPE tokenizer")
    pairs = list(model["vocab"].items()) + [
        (t["content"], t["id"]) for t in data.get("added_tokens", [])
    ]
    vocab = [""] * (max(i for _, i in pairs) + 1)
    for text, i in pairs:
        vocab[i] = text
    return vocab


class StructuredCompiler:
    """Compiles specs against the checkpoint tokenizer; one per server / LLM. Thread-safe."""

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        *,
        cache_size: int = 256,
        max_threads: int = 1,
    ) -> None:
        xgr = _xgr()
        encoded = _load_encoded_vocab(tokenizer_json)
        if vocab_size < len(encoded):
            # Only ids the model can emit matter; trailing added tokens beyond it are dropped.
            encoded = encoded[:vocab_size]
        stops = [int(t) for t in stop_token_ids]
        if not stops:
            raise ValueError("stop_token_ids must not be empty")
        self.vocab_size = vocab_size
        self.tokenizer_info = xgr.TokenizerInfo(
            encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size, stop_token_ids=stops
        )
        self.think_end_id = encoded.index(THINK_END) if THINK_END in encoded else None
        allow = np.zeros((vocab_size + 31) // 32 * 32, dtype=bool)
        allow[: len(encoded)] = True  # ids past the tokenizer stay disallowed
        self.allow_all = np.packbits(allow, bitorder="little").view(np.uint32)
        self.allow_all.flags.writeable = False
        # Our own LRU (keyed by kind and text), so xgrammar's unbounded cache is off.
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=max_threads, cache_enabled=False
        )
        self._cache: OrderedDict[tuple[str, str], CompiledConstraint] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """The compiled grammar for `spec`, from the cache when it is there. Slow for big
        grammars: call it from a worker thread. Raises ValueError naming `spec.field`."""
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                self._cache.move_to_end(spec.key)
                return hit
        grammar = self._compile_grammar(spec)
        compiled = CompiledConstraint(
            spec, grammar, self.vocab_size, self.think_end_id, self.allow_all
        )
        with self._lock:
            # A concurrent compile of the same key may have won; keep the first.
            compiled = self._cache.setdefault(spec.key, compiled)
            self._cache.move_to_end(spec.key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile_grammar(self, spec: ConstraintSpec) -> Any:
        c = self._compiler
        where = spec.field or spec.kind
        try:
            if spec.kind == "json_schema":
                return c.compile_json_schema(
                    spec.text, strict_mode=True, max_whitespace_cnt=JSON_MAX_WHITESPACE
                )
            if spec.kind == "json_object":
                return c.compile_json_schema(
                    '{"type":"object"}', strict_mode=False, max_whitespace_cnt=JSON_MAX_WHITESPACE
                )
            if spec.kind == "regex":
                return c.compile_regex(spec.text)
            if spec.kind == "choice":
                return c.compile_grammar(_choice_ebnf(spec.text))
            if spec.kind == "tool_calls":
                return c.compile_structural_tag(_dsml_structural_tag(spec.text))
        except Exception as e:
            what = {
                "json_schema": "JSON schema",
                "json_object": "JSON object grammar",
                "regex": "regular expression",
                "choice": "choice list",
                "tool_calls": "tool parameter schema",
            }[spec.kind]
            raise ValueError(f"invalid {what} in '{where}': {_clean(e)}") from e
        # grammar: xgrammar EBNF (needs a root rule), else Lark (vLLM accepts both).
        try:
            return c.compile_grammar(spec.text)
        except Exception as ebnf_error:
            try:
                return c.compile_grammar(_xgr().Grammar.from_lark(spec.text))
            except Exception:
                pass
            raise ValueError(f"invalid grammar in '{where}': {_clean(ebnf_error)}") from ebnf_error


# ---------------------------------------------------------------------------------------------
# The per-request constraint


@cache
def _constraint_base() -> type:
    """deepinfer_core.TokenConstraint when the core has it, else object (unit tests, old core)."""
    try:
        import deepinfer_core
    except ImportError:
        return object
    return getattr(deepinfer_core, "TokenConstraint", object)


def _constraint_class() -> type:
    return _make_constraint_class(_constraint_base())


@cache
def _make_constraint_class(base: type) -> type:
    class GrammarConstraint(base):  # type: ignore[misc, valid-type]
        """The engine's TokenConstraint over an xgrammar GrammarMatcher. In thinking mode every
        tokenizer token is allowed until the end-of-thinking token; then the grammar applies."""

        def __init__(self, compiled: CompiledConstraint, vocab_size: int, thinking: bool) -> None:
            super().__init__()
            if vocab_size < compiled.vocab_size:
                raise ValueError(
                    f"vocab_size {vocab_size} is smaller than the grammar's {compiled.vocab_size}"
                )
            if thinking and compiled.think_end_id is None:
                raise ValueError(f"the tokenizer has no {THINK_END} token for thinking mode")
            self.compiled = compiled
            self.vocab_size = vocab_size
            self._words = compiled.allow_all.shape[0]
            self._matcher = _xgr().GrammarMatcher(compiled.grammar)
            self._stops = frozenset(self._matcher.stop_token_ids)
            self._thinking = thinking
            # Rollback bookkeeping: tokens accepted so far, and the index of the end-of-thinking
            # token among them (None while thinking or when not in thinking mode).
            self._n = 0
            self._think_end_at: int | None = None if thinking else -1
            self._stopped_in_thinking = False

        def fill_allowed(self, mask: np.ndarray) -> None:
            if self._thinking:
                mask[: self._words] = self.compiled.allow_all
                return
            self._matcher.fill_next_token_bitmask(mask[: self._words].view(np.int32).reshape(1, -1))

        def accept(self, token: int) -> bool:
            if self._thinking:
                allow = self.compiled.allow_all
                if self._stopped_in_thinking or not 0 <= token < 32 * self._words:
                    return False
                if not (int(allow[token >> 5]) >> (token & 31)) & 1:
                    return False
                self._n += 1
                if token == self.compiled.think_end_id:
                    self._thinking = False
                    self._think_end_at = self._n - 1
                elif token in self._stops:  # ended while thinking: nothing left to constrain
                    self._stopped_in_thinking = True
                return True
            if not self._matcher.accept_token(token):
                return False
            self._n += 1
            return True

        def is_terminated(self) -> bool:
            return self._stopped_in_thinking or self._matcher.is_terminated()

        def rollback(self, n: int) -> None:
            """Undo the last n accepted tokens (speculative decoding)."""
            if not 0 <= n <= self._n:
                raise ValueError(f"cannot roll back {n} of {self._n} tokens")
            start = self._n - n
            if self._think_end_at is not None and self._think_end_at >= 0:
                in_grammar = self._n - max(start, self._think_end_at + 1)
                if in_grammar > 0:
                    self._matcher.rollback(in_grammar)
                if start <= self._think_end_at:
                    self._thinking = True
                    self._think_end_at = None
            elif self._think_end_at == -1 and n:
                self._matcher.rollback(n)
            if n:
                self._stopped_in_thinking = False
            self._n = start

        @property
        def thinking(self) -> bool:
            return self._thinking

    return GrammarConstraint


def make_constraint(compiled: CompiledConstraint, vocab_size: int, thinking: bool) -> Any:
    """A fresh per-request constraint (a deepinfer_core.TokenConstraint when the core has it).
    vocab_size: the model's (engine.vocab_size); thinking: request_thinks(conversation)."""
    return _constraint_class()(compiled, vocab_size, thinking)
