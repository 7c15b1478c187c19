"""The HTTP server.

    python -m deepinfer serve --config configs/tiny.yaml [--model DIR] [--device DEVICE]
                              [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...

Serves OpenAI Chat Completions (POST /v1/chat/completions), Completions (POST /v1/completions)
and Responses (POST /v1/responses), Anthropic Messages (POST /v1/messages and
/v1/messages/count_tokens), GET /v1/models[/{id}], POST /tokenize and /detokenize, GET /health
and GET /metrics (Prometheus). SIGTERM drains: see --shutdown-timeout.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from deepinfer.config import (
    ConfigError,
    add_override_arguments,
    add_parallel_arguments,
    apply_override_arguments,
    load_config,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deepinfer serve",
        description="Serve a DeepSeek-V4 model over HTTP: OpenAI Chat Completions, Completions "
        "and Responses, Anthropic Messages, with streaming (SSE), /v1/models, /tokenize, "
        "/detokenize, /health and /metrics.",
    )
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        help="YAML run config (model, engine options, served_model_names)",
    )
    add_override_arguments(parser)
    add_parallel_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--served-model-name",
        action="append",
        dest="names",
        help="model name clients use (repeatable; overrides the config's list)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    parser.add_argument(
        "--test-hooks",
        action="store_true",
        help="honour the x-deepinfer-forced-output header (tests only: it makes "
        "the model emit the given text)",
    )
    safety = parser.add_argument_group("operational safeguards")
    safety.add_argument(
        "--api-key",
        help="require this key on every route but /health: 'Authorization: Bearer KEY' "
        "(OpenAI clients) or 'x-api-key: KEY' (Anthropic clients); others get 401",
    )
    safety.add_argument(
        "--public-metrics",
        action="store_true",
        help="serve /metrics without the API key (for a Prometheus scraper)",
    )
    safety.add_argument(
        "--allowed-origins",
        nargs="+",
        default=[],
        metavar="ORIGIN",
        help="enable CORS for these browser origins ('*' for any); off by default",
    )
    safety.add_argument(
        "--max-body-bytes",
        type=int,
        default=8 << 20,
        help="largest request body accepted; larger ones get 413 without being read "
        "(default 8 MiB)",
    )
    safety.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, new requests get 503 while in-flight ones get this long to finish; "
        "the rest are then aborted, each response ending with its finish (default 30; 0 "
        "stops at once)",
    )
    safety.add_argument(
        "--enable-debug-endpoints",
        action="store_true",
        help="serve /debug/* (engine counters); 404 otherwise",
    )
    args = parser.parse_args(argv)

    import uvicorn

    from deepinfer.llm import describe_kv_cache
    from deepinfer.server import ServerConfig, create_app

    try:
        run = apply_override_arguments(load_config(args.config), args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from deepinfer.ranks import serve_torchrun_rank

    if serve_torchrun_rank(run):  # a rank other than 0 of a torchrun launch: its work is done
        return 0
    try:
        config = ServerConfig(
            model_path=run.model_path(),
            engine=run.engine,
            served_model_names=args.names or run.served_model_names,
            test_hooks=args.test_hooks,
            api_key=args.api_key,
            public_metrics=args.public_metrics,
            allowed_origins=args.allowed_origins,
            max_body_bytes=args.max_body_bytes,
            shutdown_timeout=args.shutdown_timeout,
            enable_debug_endpoints=args.enable_debug_endpoints,
        )
        app = create_app(config)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    core = app.state.server.core
    print(f"prompts: {app.state.server.tokenizer_note}", file=sys.stderr)
    for note in core.load_notes:
        print(f"note: {note}", file=sys.stderr)
    print(describe_kv_cache(core), file=sys.stderr)
    # One line per request with its X-Request-Id replaces uvicorn's access log.
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from deepinfer.server.shutdown import DrainingServer

    uv = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False
    )
    # The engine starts with the lifespan, inside uvicorn's loop: look it up when draining.
    DrainingServer(uv, app.state.drainer, lambda: app.state.server.engine.abort_all()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
