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
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

# Request parsing lives in structured_specs; its public names are part of this module's API.
from deepinfer.structured_specs import (
    DSML,
    KINDS,
    ConstraintSpec,
    constraint_spec_from_request,
    request_thinks,
    tool_call_spec,
)

__all__ = [
    "DSML",
    "KINDS",
    "CompiledConstraint",
    "ConstraintSpec",
    "StructuredCompiler",
    "constraint_spec_from_request",
    "make_constraint",
    "request_thinks",
    "tool_call_spec",
]

XGRAMMAR_MISSING = "structured outputs need xgrammar: pip install 'deepinfer[structured]'"

# Whitespace characters allowed between JSON tokens: enough for indented output, yet bounded, so a
# model that prefers whitespace cannot spend its whole budget there.
JSON_MAX_WHITESPACE = 16

# DeepSeek V4's end of thinking (deepseek_recipe's default; a single token in the tokenizer).
THINK_END = "</think>"


def _xgr() -> Any:
    try:
        import xgrammar
    except ImportError as e:  # torch comes with it, hence optional
        raise ImportError(XGRAMMAR_MISSING) from e
    return xgrammar


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

        def can_rollback(self) -> bool:
            return True

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
