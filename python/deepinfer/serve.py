"""The HTTP server.

    python -m deepinfer.serve --config configs/tiny.yaml [--model DIR] [--device DEVICE]
                              [--host 127.0.0.1] [--port 8000]

Serves OpenAI Chat Completions (POST /v1/chat/completions), OpenAI Responses (POST /v1/responses),
Anthropic Messages (POST /v1/messages), GET /v1/models, GET /health and GET /metrics (Prometheus).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepinfer.config import (
    ConfigError,
    add_override_arguments,
    apply_override_arguments,
    load_config,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deepinfer.serve",
        description="Serve a DeepSeek-V4 model over HTTP: OpenAI Chat Completions and Responses, "
        "Anthropic Messages, with streaming (SSE), /v1/models, /health and /metrics.",
    )
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        help="YAML run config (model, engine options, served_model_names)",
    )
    add_override_arguments(parser)
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
    args = parser.parse_args(argv)

    import uvicorn

    from deepinfer.llm import describe_kv_cache
    from deepinfer.server import ServerConfig, create_app

    try:
        run = apply_override_arguments(load_config(args.config), args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        config = ServerConfig(
            model_path=run.model_path(),
            engine=run.engine,
            served_model_names=args.names or run.served_model_names,
            test_hooks=args.test_hooks,
        )
        app = create_app(config)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    core = app.state.server.core
    for note in core.load_notes:
        print(f"note: {note}", file=sys.stderr)
    print(describe_kv_cache(core), file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
