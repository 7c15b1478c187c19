"""Offline generation from the command line.

    python -m deepinfer.run [--config CONFIG] [--model DIR] [--device DEVICE]
                            [--prompts FILE] [--max-tokens N]

--model takes a checkpoint directory as DeepSeek publishes it (FP8 weights, MXFP4 experts) or as
transformers saves it; without --config the engine defaults and a few example prompts are used.

Prints every completion, then a summary: the model and the device it ran on, requests/s, prompt
and output tokens/s, mean time to first token and mean time per output token.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from deepinfer.config import (
    ConfigError,
    RunConfig,
    add_override_arguments,
    add_parallel_arguments,
    apply_override_arguments,
    load_config,
)
from deepinfer.llm import LLM, CompletionOutput, describe_kv_cache
from deepinfer.ranks import serve_torchrun_rank

# Prompts for a run without a config or --prompts (as vLLM's offline example has).
EXAMPLE_PROMPTS = (
    "Hello, my name is",
    "The capital of France is",
    "The future of AI is",
)


def read_prompts(path: Path) -> list[str]:
    """One prompt per non-empty line, or for *.jsonl one JSON object with a "prompt" per line."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return lines
    prompts = []
    for n, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{n}: invalid JSON: {e}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise ConfigError(f"{path}:{n}: expected an object with a string 'prompt'")
        prompts.append(obj["prompt"])
    return prompts


def summarize(outputs: list[CompletionOutput], elapsed: float) -> str:
    n = len(outputs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    cached = sum(o.prompt_cache_hit_tokens for o in outputs)
    output_tokens = sum(len(o.token_ids) for o in outputs)
    ttfts = [o.metrics.ttft for o in outputs if o.metrics.ttft is not None]
    tpots = [t for o in outputs if (t := o.metrics.tpot(len(o.token_ids))) is not None]

    def mean_ms(values: list[float]) -> str:
        return f"{1000 * sum(values) / len(values):.2f} ms" if values else "n/a"

    return "\n".join(
        [
            f"requests:       {n} in {elapsed:.3f} s ({n / elapsed:.2f} requests/s)",
            f"prompt tokens:  {prompt_tokens} ({cached} from the prefix cache), "
            f"{prompt_tokens / elapsed:.1f} tok/s",
            f"output tokens:  {output_tokens}, {output_tokens / elapsed:.1f} tok/s",
            f"mean TTFT:      {mean_ms(ttfts)}",
            f"mean TPOT:      {mean_ms(tpots)}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deepinfer.run",
        description="Generate completions for a batch of prompts with the deepinfer engine and "
        "print them with throughput and latency figures.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="YAML run config (model, engine, sampling, prompts), or a checkpoint directory; "
        "configs/tiny.yaml runs the embedded tiny model (default: the engine defaults with "
        "the tiny model, or --model)",
    )
    add_override_arguments(parser)
    add_parallel_arguments(parser)
    parser.add_argument(
        "--prompts",
        type=Path,
        help="file of prompts, one per line (or .jsonl with a 'prompt' field); "
        "default: the config's prompts",
    )
    parser.add_argument(
        "--max-tokens", type=int, help="tokens to generate per prompt (overrides the config)"
    )
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature, 0 = greedy (overrides the config)"
    )
    parser.add_argument(
        "--seed", type=int, help="sampling seed for every request (overrides the config)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    args = parser.parse_args(argv)

    try:
        if args.config is None:
            base = RunConfig()
        elif args.config.is_dir():
            base = RunConfig(model=str(args.config.expanduser().absolute()))
        else:
            base = load_config(args.config)
        config = apply_override_arguments(base, args)
        prompts = read_prompts(args.prompts) if args.prompts else config.prompts
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not prompts and args.config is not None and not args.config.is_dir():
        print(
            f"error: no prompts: {args.config} has none and --prompts was not given",
            file=sys.stderr,
        )
        return 2
    prompts = prompts or list(EXAMPLE_PROMPTS)
    sampling = config.sampling
    overrides = {
        k: v
        for k, v in (
            ("max_tokens", args.max_tokens),
            ("temperature", args.temperature),
            ("seed", args.seed),
        )
        if v is not None
    }
    sampling = dataclasses.replace(sampling, **overrides)

    if serve_torchrun_rank(config):  # a rank other than 0 of a torchrun launch: its work is done
        return 0
    try:
        llm = LLM(config)
        for note in llm.engine.load_notes:
            print(f"note: {note}", file=sys.stderr)
        print(describe_kv_cache(llm.engine), file=sys.stderr)
        start = time.perf_counter()
        outputs = llm.generate(prompts, sampling, use_tqdm=not args.no_progress)
        elapsed = time.perf_counter() - start
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if not args.quiet:
        for i, o in enumerate(outputs):
            print(f"--- [{i}] prompt ({len(o.prompt_token_ids)} tokens): {o.prompt!r}")
            print(f"    output ({len(o.token_ids)} tokens, finish: {o.finish_reason}): {o.text!r}")
    print("=== summary ===")
    print(f"model:          {llm.model_path}")
    print(f"device:         {llm.engine.device}")
    parallel = llm.engine.config.parallel
    if parallel.data_parallel_size > 1:
        experts = (
            "the routed experts split across them"
            if parallel.expert_parallel_size > 1
            else "every rank holds every expert"
        )
        print(f"parallel:       {parallel.data_parallel_size} data-parallel ranks, {experts}")
    print(summarize(outputs, elapsed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
