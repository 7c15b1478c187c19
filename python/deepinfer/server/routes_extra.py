"""GET /v1/models/{id}, POST /tokenize and /detokenize (vLLM's shapes) and Anthropic's
POST /v1/messages/count_tokens. Prompts are converted and encoded exactly as the generating
routes do, so a count here is the count a generation request is charged."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import deepseek_recipe as dr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from deepinfer.server.detokenize import decode, load_tokenizer
from deepinfer.server.errors import error_response
from deepinfer.server.protocols import CHAT, MESSAGES, Protocol

if TYPE_CHECKING:
    from deepinfer.server.app import Server

# Messages fields count_tokens accepts (https://docs.anthropic.com/en/api/messages-count-tokens).
COUNT_TOKENS_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
# /tokenize: vLLM's completion form (prompt) or chat form (messages, with the chat options that
# change the rendered prompt).
TOKENIZE_FIELDS = frozenset(
    {"model", "prompt", "add_special_tokens", "messages", "tools", "thinking", "reasoning_effort"}
)


class BadRequest(Exception):
    pass


def parse_object(body: bytes, fields: frozenset[str] | None = None) -> dict[str, Any]:
    """The JSON object of a request body; BadRequest names what is wrong with it."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"invalid request body: {e}") from None
    if not isinstance(obj, dict):
        raise BadRequest("invalid request body: expected a JSON object")
    if fields is not None:
        for key in obj:
            if key not in fields:
                raise BadRequest(f"unsupported field '{key}'")
    return obj


def token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise BadRequest(f"'{name}' must be a list of token ids")
    return value


def register_extra_routes(app: FastAPI, server: Server) -> None:
    config = server.config
    vocab_size = server.core.model_config.vocab_size
    tokenizer = load_tokenizer(config.model_path)

    def conversion_error(protocol: Protocol, e: dr.ConversionError) -> JSONResponse:
        body = protocol.error_from_recipe(e.status_code, e.body)
        return JSONResponse(body, status_code=e.status_code)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        if model_id not in config.served_model_names:
            return error_response("/v1/models", 404, f"The model '{model_id}' does not exist")
        return JSONResponse(
            {
                "id": model_id,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "deepinfer",
                "max_model_len": server.context_limit,
            }
        )

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        path = request.url.path
        try:
            obj = parse_object(await request.body(), COUNT_TOKENS_FIELDS)
            conversation = MESSAGES.request_cls(obj).convert(server.options)
        except BadRequest as e:
            return error_response(path, 400, str(e))
        except dr.ConversionError as e:
            return conversion_error(MESSAGES, e)
        prompt = await server.off_loop(server.encode, conversation)
        return JSONResponse({"input_tokens": len(prompt)})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        path = request.url.path
        try:
            obj = parse_object(await request.body(), TOKENIZE_FIELDS)
            if ("prompt" in obj) == ("messages" in obj):
                raise BadRequest("give exactly one of 'prompt' and 'messages'")
            if "prompt" in obj:
                if not isinstance(obj["prompt"], str):
                    raise BadRequest("'prompt' must be a string")
                bos = obj.get("add_special_tokens", True)
                tokens = await server.off_loop(encode_text, server, obj["prompt"], bos)
            else:
                if "add_special_tokens" in obj:
                    raise BadRequest("'add_special_tokens' applies to 'prompt' only")
                chat = {"model": config.served_model_names[0], **obj}
                conversation = CHAT.request_cls(chat).convert(server.options)
                tokens = await server.off_loop(server.encode, conversation)
        except BadRequest as e:
            return error_response(path, 400, str(e))
        except dr.ConversionError as e:
            return conversion_error(CHAT, e)
        return JSONResponse(
            {"tokens": tokens, "count": len(tokens), "max_model_len": server.context_limit}
        )

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        path = request.url.path
        try:
            obj = parse_object(await request.body(), frozenset({"model", "tokens"}))
            tokens = token_ids(obj.get("tokens"), "tokens")
            bad = next((t for t in tokens if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise BadRequest(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
        except BadRequest as e:
            return error_response(path, 400, str(e))
        # Special tokens stay spelled out, so tokenize -> detokenize shows the whole prompt.
        text = await server.off_loop(decode, tokenizer, tokens, False)
        return JSONResponse({"prompt": text})


def encode_text(server: Server, text: str, bos: bool = True) -> list[int]:
    """A raw text prompt as the legacy completions route feeds it: BOS first (as the offline LLM
    does), then the text with the full vocabulary (special-token spellings are special tokens:
    a raw prompt is the caller's own rendering of a template)."""
    ids = server.tokenizer.encode(text)
    bos_id = server.core.model_config.bos_token_id
    if bos and (not ids or ids[0] != bos_id):
        ids = [bos_id, *ids]
    return ids
