"""python -m deepinfer {serve,run} ...: the HTTP server and offline generation."""

from __future__ import annotations

import sys

USAGE = """usage: python -m deepinfer {serve,run} [options]

  serve   serve a model over HTTP (OpenAI and Anthropic APIs); serve --help for the options
  run     offline generation from the command line; run --help for the options
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from deepinfer.serve import main as serve

        return serve(rest)
    if command == "run":
        from deepinfer.run import main as run

        return run(rest)
    print(f"unknown command '{command}'\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
