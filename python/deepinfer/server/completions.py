"""OpenAI's legacy Completions (POST /v1/completions): raw prompts, no chat template.

A prompt is text (BOS, then the text tokenized with the full vocabulary) or token ids, or a list
of either: one choice per prompt, generated concurrently. Text is decoded token by token so a
streamed choice and its logprobs stay aligned; stop strings are searched in the decoded text,
the text is cut before the match and the engine request aborted at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import deepinfer_core
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from deepinfer.server.constraints import VLLM_FIELDS
from deepinfer.server.detokenize import IncrementalDecoder, decode, load_tokenizer
from deepinfer.server.errors import error_response
from deepinfer.server.routes_extra import BadRequest, encode_text, parse_object
from deepinfer.server.sampling import RequestError
from deepinfer.structured import ConstraintSpec, constraint_spec_from_request

if TYPE_CHECKING:
    from deepinfer.server.app import Server

PATH = "/v1/completions"
FIELDS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "logprobs",
        "echo",
        "user",
        "n",
        "best_of",
        "suffix",
        "presence_penalty",
        "frequency_penalty",
        # output constraints: vLLM's fields, and chat's response_format
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    }
)
# Accepted only with their no-op values (the engine has no other behaviour).
RESTRICTED: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "suffix": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
}
CONSTRAINT_FIELDS = ("response_format", *VLLM_FIELDS)
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


class ModelNotFound(Exception):
    pass


@dataclass
class Entry:
    """One output token for logprobs: its text, logprob, top alternatives, offset in the text."""

    token: str
    logprob: float
    top: dict[str, float]
    offset: int = 0


@dataclass
class Piece:
    """An update of one choice: new text, the tokens it came from, the finish once done."""

    index: int
    text: str
    entries: list[Entry] = field(default_factory=list)
    finish_reason: str | None = None


class StopText:
    """Output text with stop strings applied, released a whole token at a time. Text that could
    still be the start of a stop string is held back until the next token rules it out."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.emitted = 0  # text[:emitted] was released
        self.pending: list[tuple[int, int, Entry | None]] = []  # (start, end, entry)
        self.stopped = False

    def add(self, piece: str, entry: Entry | None) -> None:
        start = len(self.text)
        self.text += piece
        self.pending.append((start, len(self.text), entry))

    def take(self, final: bool) -> tuple[str, list[Entry]]:
        cut = None
        for s in self.stops:
            i = self.text.find(s, max(0, self.emitted - len(s) + 1))
            if i >= 0 and (cut is None or i < cut):
                cut = i
        if cut is not None:
            self.stopped = True
            self.text = self.text[:cut]
            limit = cut
        else:
            limit = len(self.text) if final else len(self.text) - self.hold
        entries: list[Entry] = []
        end = self.emitted
        while self.pending:
            start, stop, entry = self.pending[0]
            if stop > limit and not (cut is not None and start < cut):
                break
            self.pending.pop(0)
            end = max(end, min(stop, limit))
            if entry is not None:
                entry.offset = start
                entries.append(entry)
        if cut is not None:
            self.pending.clear()
        text = self.text[self.emitted : end]
        self.emitted = end
        return text, entries


@dataclass
class Parsed:
    model: str
    prompts: list[list[int] | str]
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stops: list[str]
    logprobs: int | None
    echo: bool
    stream: bool
    include_usage: bool
    constraint: ConstraintSpec | None = None


def parse(obj: dict[str, Any], served: list[str]) -> Parsed:
    for key in obj:
        if key not in FIELDS:
            raise BadRequest(f"unsupported field '{key}'")
        if key in RESTRICTED and obj[key] is not None and obj[key] != RESTRICTED[key]:
            raise BadRequest(
                f"unsupported value for '{key}': {json.dumps(obj[key])} "
                f"(only {json.dumps(RESTRICTED[key])} is supported)"
            )
    model = obj.get("model")
    if not isinstance(model, str):
        raise BadRequest("'model' is required")
    if model not in served:
        raise ModelNotFound(f"The model '{model}' does not exist")
    prompt = obj.get("prompt")
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)
    ):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise BadRequest("'prompt' must be a string, a list of token ids, or a non-empty list")
    for p in prompts:
        ok = isinstance(p, str) or (
            isinstance(p, list) and p and all(type(t) is int for t in p)  # no bools
        )
        if not ok:
            raise BadRequest("each prompt must be a string or a non-empty list of token ids")
    stop = obj.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("'stop' must be a non-empty string or a list of them")
    logprobs = obj.get("logprobs")
    if logprobs is not None and (type(logprobs) is not int or not 0 <= logprobs <= 20):
        raise BadRequest("'logprobs' must be an integer in [0, 20]")
    echo = bool(obj.get("echo"))
    if echo and logprobs is not None:
        raise BadRequest("'echo' with 'logprobs' is not supported (no prompt logprobs)")
    max_tokens = obj.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise BadRequest("'max_tokens' must be a positive integer")
    stream_options = obj.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object")
    number = (int, float)
    for name in ("temperature", "top_p"):
        value = obj.get(name)
        if value is not None and (not isinstance(value, number) or isinstance(value, bool)):
            raise BadRequest(f"'{name}' must be a number")
    seed = obj.get("seed")
    if seed is not None and type(seed) is not int:
        raise BadRequest("'seed' must be an integer")
    constraint_fields = {k: obj[k] for k in CONSTRAINT_FIELDS if k in obj}
    try:  # read as chat reads them (response_format included)
        constraint = constraint_spec_from_request("chat", constraint_fields)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return Parsed(
        constraint=constraint,
        model=model,
        prompts=prompts,
        max_tokens=max_tokens,
        temperature=1.0 if obj.get("temperature") is None else float(obj["temperature"]),
        top_p=1.0 if obj.get("top_p") is None else float(obj["top_p"]),
        seed=seed,
        stops=stops,
        logprobs=logprobs,
        echo=echo,
        stream=bool(obj.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )


def logprobs_body(entries: list[Entry], base: int) -> dict[str, Any]:
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [e.top for e in entries],
        "text_offset": [base + e.offset for e in entries],
    }


async def merge(streams: list[AsyncIterator[Piece]]) -> AsyncIterator[Piece]:
    """The pieces of every choice as they come; closing this closes (aborts) every choice."""
    if len(streams) == 1:
        async for piece in streams[0]:
            yield piece
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[Piece]) -> None:
        try:
            async for piece in stream:
                queue.put_nowait(piece)
        except Exception as e:
            queue.put_nowait(e)
        finally:
            await stream.aclose()
            queue.put_nowait(done)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def register_completions(app: FastAPI, server: Server) -> None:
    tokenizer = load_tokenizer(server.config.model_path)
    metrics = server.metrics

    def token_text(token_id: int) -> str:
        return decode(tokenizer, [token_id], skip_special_tokens=False)

    def engine_params(p: Parsed, prompt_len: int) -> deepinfer_core.SamplingParams:
        left = server.context_limit - prompt_len
        max_tokens = p.max_tokens if p.max_tokens is not None else max(1, left)
        if max_tokens > left:
            raise BadRequest(
                f"This model's maximum context length is {server.context_limit} tokens; "
                f"the prompt has {prompt_len} tokens and max_tokens is {max_tokens}"
            )
        return deepinfer_core.SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            max_tokens=max_tokens,
            logprobs=max(1, p.logprobs) if p.logprobs is not None else 0,
        )

    async def choice(
        index: int, rid: int, queue: Any, p: Parsed, counts: list[int]
    ) -> AsyncIterator[Piece]:
        assert server.engine is not None
        decoder = IncrementalDecoder(tokenizer)
        text = StopText(p.stops)
        outcome = "aborted"
        outputs = server.engine.outputs(rid, queue)
        try:
            async for out in outputs:
                if out.ready:
                    metrics.prompt_tokens.inc(out.num_prompt_tokens)
                    metrics.cache_hit_tokens.inc(out.prompt_cache_hit_tokens)
                metrics.generation_tokens.inc(len(out.tokens))
                counts[index] += len(out.tokens)
                for i, t in enumerate(out.tokens):
                    if t in server.eos_ids:  # a finish reason, not text
                        continue
                    entry = None
                    if p.logprobs is not None:
                        lp, top = out.logprobs[i]
                        alts = {token_text(a): b for a, b in top[: p.logprobs]}
                        entry = Entry(token_text(t), lp, alts)
                    text.add(decoder.push(t), entry)
                final = out.finish is not None
                if out.finish == "rejected":
                    raise BadRequest(out.finish_detail)
                if final:
                    text.add(decoder.flush(), None)
                piece_text, entries = text.take(final)
                reason = "stop" if text.stopped else out.finish
                if text.stopped or final:
                    yield Piece(index, piece_text, entries, reason)
                    outcome = "ok"
                    return  # closing outputs aborts an engine request a stop string ended
                if piece_text or entries:
                    yield Piece(index, piece_text, entries)
        finally:
            await outputs.aclose()
            metrics.requests.labels("completions", outcome).inc()

    @app.post(PATH)
    async def completions(request: Request) -> Response:
        try:
            p = parse(parse_object(await request.body()), server.config.served_model_names)
            prompts = [
                q if isinstance(q, list) else await server.off_loop(encode_text, server, q)
                for q in p.prompts
            ]
            params = [engine_params(p, len(q)) for q in prompts]
            if p.constraint is not None:
                compiled = await server.constraints.compile(server, p.constraint)
                for sp in params:  # one constraint per engine request; raw prompts: no thinking
                    sp.constraint = server.constraints.make(compiled, False)
        except RequestError as e:
            metrics.requests.labels("completions", "rejected").inc()
            return error_response(PATH, e.status, e.message)
        except ModelNotFound as e:
            metrics.requests.labels("completions", "rejected").inc()
            body = {"error": {"message": str(e), "type": "invalid_request_error"}}
            body["error"] |= {"param": "model", "code": "model_not_found"}
            return JSONResponse(body, status_code=404)
        except (BadRequest, ValueError) as e:
            metrics.requests.labels("completions", "rejected").inc()
            return error_response(PATH, 400, str(e))
        echoes = [""] * len(prompts)
        if p.echo:
            echoes = [
                q if isinstance(q, str) else await server.off_loop(decode, tokenizer, q)
                for q in p.prompts
            ]

        assert server.engine is not None
        added: list[tuple[int, Any]] = []
        try:
            for q, sp in zip(prompts, params, strict=True):
                added.append(server.engine.add(q, sp))
        except ValueError as e:  # the engine names the bad field
            for rid, _ in added:
                server.engine.abort(rid)
                server.engine.release(rid)
            metrics.requests.labels("completions", "rejected").inc()
            return error_response(PATH, 400, str(e))
        completion_tokens = [0] * len(prompts)
        pieces = merge(
            [choice(i, rid, q, p, completion_tokens) for i, (rid, q) in enumerate(added)]
        )

        def release_all() -> None:
            """Every engine request ends with the response, even one whose generator never
            started (a client gone before the first byte)."""
            assert server.engine is not None
            for rid, _ in added:
                server.engine.abort(rid)
                server.engine.release(rid)

        cid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        usage_prompt = sum(len(q) for q in prompts)

        def body(choices: list[dict]) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": p.model,
                "choices": choices,
            }

        def usage() -> dict[str, int]:
            n = sum(completion_tokens)
            return {
                "prompt_tokens": usage_prompt,
                "completion_tokens": n,
                "total_tokens": usage_prompt + n,
            }

        if p.stream:

            async def sse() -> AsyncIterator[str]:
                try:
                    for i, e in enumerate(echoes):
                        if e:
                            c = {"index": i, "text": e, "logprobs": None, "finish_reason": None}
                            yield f"data: {json.dumps(body([c]))}\n\n"
                    async for piece in pieces:
                        c = {
                            "index": piece.index,
                            "text": piece.text,
                            "logprobs": logprobs_body(piece.entries, 0)
                            if p.logprobs is not None
                            else None,
                            "finish_reason": piece.finish_reason,
                        }
                        yield f"data: {json.dumps(body([c]))}\n\n"
                    if p.include_usage:
                        yield f"data: {json.dumps(body([]) | {'usage': usage()})}\n\n"
                except BadRequest as e:
                    error = {"error": {"message": str(e), "type": "invalid_request_error"}}
                    yield f"data: {json.dumps(error)}\n\n"
                finally:
                    await pieces.aclose()
                    release_all()
                yield "data: [DONE]\n\n"

            return StreamingResponse(
                sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )

        async def collect() -> list[dict[str, Any]]:
            choices = [
                {"index": i, "text": e, "logprobs": None, "finish_reason": None}
                for i, e in enumerate(echoes)
            ]
            entries: list[list[Entry]] = [[] for _ in prompts]
            async for piece in pieces:
                c = choices[piece.index]
                c["text"] += piece.text
                entries[piece.index] += piece.entries
                c["finish_reason"] = piece.finish_reason or c["finish_reason"]
            if p.logprobs is not None:
                for c, es in zip(choices, entries, strict=True):
                    c["logprobs"] = logprobs_body(es, 0)
            return choices

        task = asyncio.ensure_future(collect())
        try:
            while not task.done():  # a client that went away aborts its requests (as in app.py)
                finished, _ = await asyncio.wait({task}, timeout=0.25)
                if not finished and await request.is_disconnected():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    return Response(status_code=499)
            choices = task.result()
        except BadRequest as e:
            return error_response(PATH, 400, str(e))
        finally:
            release_all()
        return JSONResponse(body(choices) | {"usage": usage()})
