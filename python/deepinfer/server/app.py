"""The FastAPI application: OpenAI Chat Completions (/v1/chat/completions) and Responses
(/v1/responses), Anthropic Messages (/v1/messages), /v1/models, /health and /metrics.

Every request goes through deepseek-recipe: the protocol request is converted to a conversation,
the checkpoint's encoding (V4 or V4.1 by its config.json model_type, encoding.py) renders and
tokenizes it (user-typed special-token text stays plain
text), the engine generates, and the recipe's StreamProcessor turns the engine's
ready -> tokens -> finish stream into the protocol's chunks, streamed as SSE or accumulated into
one response. When the parser finishes early (a stop sequence) or the client goes away, the engine
request is aborted at once so its KV blocks are freed.

What the recipe does not do (sampling fields in thinking mode, n > 1, logit_bias and penalties,
model-name and image checks) is in sampling.py; usage from token ids and the JSON edits it needs
(n choices merged) in usage.py; Messages and Responses tool calls that did not parse or were cut
off, returned as text, in tool_failures.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deepinfer_core
import deepseek_recipe as dr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from deepinfer.llm import load_engine
from deepinfer.server.async_engine import AsyncEngine
from deepinfer.server.completions import register_completions
from deepinfer.server.constraints import Constraints, plan
from deepinfer.server.encoding import new_encoding, packaged_tokenizer_json, prompt_tokenizer
from deepinfer.server.errors import install_error_handlers
from deepinfer.server.metrics import ServerMetrics
from deepinfer.server.protocols import CHAT, MESSAGES, RESPONSES, Protocol, unsupported_field
from deepinfer.server.routes_extra import register_extra_routes
from deepinfer.server.safeguards import install_safeguards
from deepinfer.server.sampling import RequestError, RequestSampling, core_params, prepare_request
from deepinfer.server.tool_failures import ToolCallGuard, tool_call_guard
from deepinfer.server.usage import (
    ChunkEditor,
    OutputTokens,
    dumps,
    edit_response,
    merge_choices,
    token_byte_table,
)
from deepinfer.structured import request_thinks

FORCED_OUTPUT_HEADER = "x-deepinfer-forced-output"
log = logging.getLogger("deepinfer.server")


@dataclass
class ServerConfig:
    model_path: Path
    # Engine options (its model_path is model_path above).
    engine: deepinfer_core.EngineConfig = field(default_factory=deepinfer_core.EngineConfig)
    served_model_names: list[str] = field(default_factory=lambda: ["deepseek-v4"])
    # Test hook: honour the x-deepinfer-forced-output header (forced output text). Off in serving.
    test_hooks: bool = False
    # Safeguards (safeguards.py). api_key: required on every route but /health (and /metrics
    # with public_metrics); allowed_origins: CORS, off when empty.
    api_key: str | None = None
    public_metrics: bool = False
    allowed_origins: list[str] = field(default_factory=list)
    enable_debug_endpoints: bool = False
    max_body_bytes: int = 8 << 20
    # Seconds in-flight requests get after SIGTERM before they are aborted.
    shutdown_timeout: float = 30.0


def tokenizer_json_path(model_path: Path | None = None) -> str:
    """The checkpoint directory's tokenizer.json when it has one, else the packaged V4 one."""
    if model_path is not None and (model_path / "tokenizer.json").is_file():
        return str(model_path / "tokenizer.json")
    return str(packaged_tokenizer_json())


class Server:
    """State shared by the routes: engine, recipe objects, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        engine = copy.copy(config.engine)
        engine.model_path = str(config.model_path)
        # The model type (hence the prompt encoding and the special tokens the tokenizer must
        # have) is checked before the weights load, which takes minutes for a real checkpoint.
        model_path = Path(config.model_path)
        model_config = deepinfer_core.ModelConfig.from_file(str(model_path / "config.json"))
        model_type = model_config.model_type
        chosen = prompt_tokenizer(model_path, model_type)
        self.tokenizer_note = chosen.note
        log.info("%s", chosen.note)
        self.core = load_engine(engine)
        # Prompt plus output tokens a request may have (resolved: at most the model's positions).
        self.context_limit = self.core.config.scheduler.max_model_len
        tokenizer_json = str(chosen.path)
        self.tokenizer = dr.Tokenizer.from_file(tokenizer_json)
        self.token_bytes = token_byte_table(tokenizer_json)
        self.model_version = chosen.version
        self.encodings = {
            chosen.version: new_encoding(chosen.version).with_tokenizer(self.tokenizer)
        }
        # Every served name is the checkpoint: its model version's prompt encoding.
        self.options = dr.ConversionOptions().with_model_versions_by_name(
            {name: chosen.version for name in config.served_model_names}
        )
        self.eos_ids = set(self.core.eos_token_ids)
        self.constraints = Constraints(
            tokenizer_json, self.core.vocab_size, list(self.core.eos_token_ids)
        )
        think_end = self.tokenizer.encode(
            self.options.special_tokens.token(dr.SpecialToken.ThinkingEnd)
        )
        self.thinking_end_id = think_end[0] if len(think_end) == 1 else None
        self.metrics = ServerMetrics()
        self.engine: AsyncEngine | None = None
        # Tokenizing a long prompt takes milliseconds; the event loop must keep serving meanwhile.
        self.tokenize_pool = ThreadPoolExecutor(4, thread_name_prefix="deepinfer-tokenize")

    def encode(self, conversation_request: Any) -> list[int]:
        encoding = self.encodings[conversation_request.model_version]
        return encoding.encode(conversation_request.conversation)

    async def off_loop(self, fn: Any, *args: Any) -> Any:
        """fn(*args) on the tokenizer threads (the recipe's tokenizer releases the GIL)."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, fn, *args)


def _error(
    protocol: Protocol, status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    body = protocol.error_body(status, message, param=param, code=code)
    return JSONResponse(body, status_code=status)


def _sse(name: str | None, data: str) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n"


def _json_object(body: bytes) -> dict | None:
    """The body as a JSON object, or None: other bodies are left to the recipe to report."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def _first(*values: float | None) -> float:
    return next(v for v in values if v is not None)


@dataclass
class _Sample:
    """One of a request's n samples: its engine request and its output parsing."""

    rid: int
    queue: asyncio.Queue
    processor: Any
    tokens: OutputTokens
    # Messages and Responses: tool calls that cannot be returned as calls come back as text.
    guard: ToolCallGuard | None = None


_DONE = object()


async def _merge(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """(stream index, item) from several streams as the items come; closing it closes them all."""
    if len(streams) == 1:
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
            await queue.put((i, _DONE))
        except Exception as e:
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            i, item = await queue.get()
            if item is _DONE:
                live -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:  # cancelling a pump closes its stream, which aborts its engine request
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _finish_reason(finish: str) -> Any:
    if finish == "length":
        return dr.InferenceFinishReason.Length
    return dr.InferenceFinishReason.Stop


def create_app(config: ServerConfig) -> FastAPI:
    server = Server(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.engine = AsyncEngine(server.core, asyncio.get_running_loop())
        server.engine.start()
        yield
        server.engine.shutdown()
        server.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="deepinfer", lifespan=lifespan)
    app.state.server = server
    install_error_handlers(app)
    app.state.drainer = install_safeguards(app, config)

    async def handle(request: Request, protocol: Protocol) -> Response:
        metrics = server.metrics
        body = await request.body()
        problem = unsupported_field(protocol, body)
        if problem:
            metrics.requests.labels(protocol.name, "rejected").inc()
            return _error(protocol, 400, problem)
        try:
            obj = _json_object(body)
            sampling = RequestSampling()
            if obj is not None:
                sampling = prepare_request(
                    protocol.name, obj, config.served_model_names, server.core.vocab_size
                )
            spec = None
            extra: dict[str, Any] = {}

            def convert(b: Any) -> Any:
                # Converting consumes the request: read what else it gives first.
                req = protocol.request_cls(b)
                extra["model"] = req.model
                if protocol is RESPONSES:
                    extra["namespace_tool_map"] = req.namespace_tool_map(server.options)
                    extra["echo"] = req.echo()
                return req.convert(server.options)

            if obj is not None:
                # The constraint may change what is converted (a forced tool call in thinking mode).
                output_plan, conversation = plan(protocol.name, obj, convert)
                spec = output_plan.spec(protocol.name, conversation)
            else:
                conversation = convert(body)
            model = extra["model"]
            compiled = None
            if spec is not None:
                compiled = await server.constraints.compile(server, spec)
            prompt = await server.off_loop(server.encode, conversation)
            max_tokens = conversation.resolve_max_tokens(len(prompt), server.context_limit)
        except RequestError as e:
            metrics.requests.labels(protocol.name, "rejected").inc()
            return _error(protocol, e.status, e.message, e.param, e.code)
        except dr.ConversionError as e:
            metrics.requests.labels(protocol.name, "rejected").inc()
            return JSONResponse(
                protocol.error_from_recipe(e.status_code, e.body), status_code=e.status_code
            )
        except ValueError as e:  # malformed JSON or a body that is not an object
            metrics.requests.labels(protocol.name, "rejected").inc()
            return _error(protocol, 400, f"invalid request body: {e}")

        io = conversation.inference_options
        top_logprobs = io.top_logprobs or 0
        forced: list[int] = []
        if config.test_hooks and FORCED_OUTPUT_HEADER in request.headers:
            forced = server.tokenizer.encode(json.loads(request.headers[FORCED_OUTPUT_HEADER]))
        added: list[tuple[int, asyncio.Queue]] = []
        try:
            # The recipe resets temperature and top_p to 1.0 in thinking mode; the request's own
            # values apply (the recipe has range-checked them).
            params = core_params(
                sampling,
                io.seed,
                temperature=_first(sampling.temperature, io.temperature, 1.0),
                top_p=_first(sampling.top_p, io.top_p, 1.0),
                max_tokens=max_tokens,
                logprobs=max(1, top_logprobs) if io.logprobs or top_logprobs else 0,
                forced_tokens=forced,
            )
            if compiled is not None:
                thinks = request_thinks(conversation)
                for p in params:
                    p.constraint = server.constraints.make(compiled, thinks)
            assert server.engine is not None
            # n samples share the prompt's KV through the prefix cache (add_samples).
            added.extend(server.engine.add_samples(prompt, params))
        except (RequestError, ValueError) as e:
            for rid, _ in added:
                server.engine.abort(rid)
                server.engine.release(rid)
            metrics.requests.labels(protocol.name, "rejected").inc()
            if isinstance(e, RequestError):
                return _error(protocol, e.status, e.message, e.param, e.code)
            return _error(protocol, 400, str(e))

        response_id = {"chat": "chatcmpl-", "responses": "resp_", "messages": "msg_"}[protocol.name]
        response_id += uuid.uuid4().hex
        parsing = conversation.parsing_options
        stage = parsing.thinking_initial_stage
        starts_in_reasoning = (
            stage is not None and stage.starts_in_reasoning() and not parsing.starts_in_tool_calls
        )

        def sample(rid: int, queue: asyncio.Queue) -> _Sample:
            generator = protocol.request_cls.chunk_generator(conversation, response_id, model)
            if protocol is RESPONSES:
                generator = generator.with_namespace_tool_map(extra["namespace_tool_map"])
                generator = generator.with_echo(extra["echo"])
            tokens = OutputTokens(
                server.token_bytes,
                server.eos_ids,
                server.thinking_end_id,
                starts_in_reasoning,
                as_text=spec is not None and spec.kind == "tool_calls",
            )
            processor = dr.StreamProcessor(generator, parsing, server.tokenizer)
            return _Sample(rid, queue, processor, tokens, tool_call_guard(protocol.name))

        samples = [sample(rid, queue) for rid, queue in added]
        started = time.perf_counter()
        want_logprobs = io.logprobs or top_logprobs > 0

        async def chunks(index: int) -> AsyncIterator[tuple[str, Any]]:
            """("ready", hit tokens) once, then protocol chunks; aborts the engine request when the
            parser finishes first (stop sequence) or the consumer stops (client gone)."""
            s = samples[index]
            processor = s.processor
            first_token = None
            n_tokens = 0
            outcome = "aborted"
            outputs = server.engine.outputs(s.rid, s.queue)
            try:
                async for out in outputs:
                    pushed: list = []
                    if out.ready:
                        metrics.prompt_tokens.inc(out.num_prompt_tokens)
                        metrics.cache_hit_tokens.inc(out.prompt_cache_hit_tokens)
                        yield ("ready", out.prompt_cache_hit_tokens)
                        usage = dr.PromptUsage(
                            prompt_tokens=out.num_prompt_tokens,
                            prompt_cache_hit_tokens=out.prompt_cache_hit_tokens,
                        )
                        pushed += processor.push(dr.InferenceChunk.ready(prompt_usage=usage))
                    if out.tokens:
                        if first_token is None:
                            first_token = time.perf_counter()
                            metrics.ttft.observe(first_token - started)
                        n_tokens += len(out.tokens)
                        metrics.generation_tokens.inc(len(out.tokens))
                        lps = None
                        if want_logprobs:
                            lps = [(lp[0], lp[1][:top_logprobs]) for lp in out.logprobs]
                        # Counts every token; the parser gets those ending on a character
                        # boundary, without EOS (the protocols report it as a finish reason).
                        chunk = s.tokens.push(out.tokens, lps)
                        if chunk is not None:
                            # Detokenizing and parsing run on the tokenizer threads, so a
                            # large chunk never holds up other streams or /health.
                            pushed += await server.off_loop(processor.push, chunk)
                    if out.finish is not None and not processor.finished:
                        if out.finish == "rejected":
                            raise ValueError(out.finish_detail)
                        if out.finish == "grammar_error":
                            # Only this request ends; the client gets the text so far.
                            log.warning(
                                "request %s: output constraint failed: %s",
                                response_id,
                                out.finish_detail,
                            )
                        tail = s.tokens.flush()
                        if tail is not None:
                            pushed += processor.push(tail)
                        pushed += processor.push(
                            dr.InferenceChunk.finish(_finish_reason(out.finish))
                        )
                        pushed += processor.finish()
                    for c in pushed:
                        yield ("chunk", c)
                    if processor.finished:
                        outcome = "ok"
                        return  # the outputs() generator aborts a request still running
                outcome = "ok"
            finally:
                await outputs.aclose()  # aborts the engine request if it is still running
                if first_token is not None and n_tokens > 1:
                    metrics.tpot.observe((time.perf_counter() - first_token) / (n_tokens - 1))
                if index == 0:  # one count per HTTP request
                    metrics.requests.labels(protocol.name, outcome).inc()
                if not processor.finished:
                    processor.close()

        streams = [chunks(i) for i in range(len(samples))]

        if conversation.stream:
            editor = ChunkEditor(len(samples))

            async def sse() -> AsyncIterator[str]:
                async with aclosing(_merge(streams)) as merged:
                    async for i, (kind, item) in merged:
                        if kind == "chunk":
                            name = protocol.response_cls.sse_event_name(item)
                            data = item.to_json()
                            if protocol is CHAT:  # holds tool-call chunks until they parse
                                for edited in editor.edit_all(data, i, samples[i].tokens):
                                    yield _sse(name, edited)
                            else:  # holds tool-call events until the message ends
                                guard = samples[i].guard
                                assert guard is not None
                                for ev_name, ev in guard.feed(name, data, samples[i].tokens):
                                    edited = editor.edit(ev, i, samples[i].tokens)
                                    if edited is not None:
                                        yield _sse(ev_name, edited)
                usage = editor.usage_chunk()
                if usage is not None:
                    yield _sse(None, usage)
                done = protocol.response_cls.sse_done_data()
                if done is not None:
                    yield f"data: {done}\n\n"

            return StreamingResponse(
                sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )

        # Non-streamed: accumulate the same chunks; a client that disconnects aborts the request.
        async def collect() -> list[Any]:
            responses: list[Any] = [None] * len(samples)
            async with aclosing(_merge(streams)) as merged:
                async for i, (kind, item) in merged:
                    if kind == "ready":
                        responses[i] = protocol.response_cls(
                            response_id, model, int(time.time()), len(prompt), item
                        )
                    else:
                        guard = samples[i].guard
                        if guard is not None:
                            guard.observe(item)
                        responses[i].accumulate(item)
            return responses

        task = asyncio.ensure_future(collect())
        # Polls for a client that went away (FastAPI gives a non-streamed handler no other signal).
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if not done and await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
        try:
            responses = task.result()
        except ValueError as e:
            return _error(protocol, 400, str(e))
        if any(r is None for r in responses):
            return _error(protocol, 500, "the engine finished the request without accepting it")
        edited = [
            edit_response(r.to_json(), s.tokens, s.guard)
            for r, s in zip(responses, samples, strict=True)
        ]
        merged = edited[0] if len(edited) == 1 else merge_choices(edited)
        return Response(dumps(merged), media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(request, CHAT)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await handle(request, RESPONSES)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await handle(request, MESSAGES)

    @app.get("/v1/models")
    async def models() -> dict:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "deepinfer"}
                for name in config.served_model_names
            ],
        }

    @app.get("/health")
    async def health() -> Response:
        ok = server.engine is not None and server.engine.healthy
        return JSONResponse(
            {"status": "ok" if ok else "engine stopped"}, status_code=200 if ok else 503
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        assert server.engine is not None
        return Response(
            server.metrics.render(server.engine.stats),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.get("/debug/engine")
    async def debug_engine() -> dict:
        """Engine counters (running/waiting requests, free and cached KV blocks, state slots)."""
        assert server.engine is not None
        return dict(server.engine.stats)

    register_completions(app, server)
    register_extra_routes(app, server)
    return app
