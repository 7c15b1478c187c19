"""Where a decode step's time goes on the GPU: wall time per step next to the sum of its kernels.

    python benchmarks/gpu_profile_decode.py --batch 1 --steps 20            # wall time per step
    python benchmarks/gpu_profile_decode.py --prefill 4096 --steps 3        # one-chunk prefills
    ncu --csv --metrics gpu__time_duration.sum python benchmarks/gpu_profile_decode.py --steps 2

Run under Nsight Compute (ncu) the kernel durations of the last steps are listed; their sum,
against the wall time measured without ncu, tells kernel time from launch and host overhead.
Same model as gpu_model_bench.py (V4-Flash widths, 3 layers, random bf16 weights); with
--real-format the weights are DeepSeek's shipped formats instead (gpu_quant_bench.py's: FP8
128x128 block-scaled linears, MXFP4 routed experts).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import deepinfer_core as dc
from v4_flash_config import decode_token, flash_config, real_format


def decode_model(
    batch: int, context: int, real: bool, graphs: bool
) -> tuple[dc.ModelRunner, list[dc.SequenceChunk], int]:
    """The benchmarks' 3-layer V4-Flash-width model on the GPU (random weights: DeepSeek's formats
    with `real`, else bf16) sized for `batch` sequences of `context` tokens, the decode rows of
    those sequences (one distinct token each, so they route as real decoding does) and the KV
    blocks per sequence."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        config = flash_config(["sliding", "csa", "hca"])
        path.write_text(json.dumps(real_format(config) if real else config))
        blocks = context // 128 + 2
        runner = dc.ModelRunner.random(
            str(path),
            num_blocks=1 + batch * blocks,
            num_state_slots=batch + 1,
            device="cuda",
            seed=1,
            decode_graph_max_batch=-1 if graphs else 0,
        )
    rows = [
        dc.SequenceChunk(
            i, context - 1, [decode_token(i)], list(range(1 + i * blocks, 1 + (i + 1) * blocks))
        )
        for i in range(batch)
    ]
    return runner, rows, blocks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (one launch per kernel)")
    p.add_argument("--prefill", type=int, default=0, help="time prefills of this many tokens")
    p.add_argument(
        "--real-format",
        action="store_true",
        help="FP8 block-scaled weights, MXFP4 routed experts (as DeepSeek ships) instead of bf16",
    )
    args = p.parse_args()
    runner, batch, blocks = decode_model(
        args.batch, args.context, args.real_format, graphs=not args.eager
    )
    if args.prefill:
        tokens = [(7 * i) % 129000 + 2 for i in range(args.prefill)]
        table = list(range(1, 1 + blocks))
        chunk = dc.SequenceChunk(0, 0, tokens, table)
        runner.greedy([chunk])  # warm up
        t0 = time.perf_counter()
        for _ in range(args.steps):
            runner.greedy([chunk])
        ms = 1000 * (time.perf_counter() - t0) / args.steps
        rate = args.prefill / ms * 1e3
        print(json.dumps({"prefill": args.prefill, "wall_ms": ms, "tok_s": rate}))
        return
    runner.greedy(batch)  # warm up (and record the graph)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        runner.greedy(batch)  # argmax on the device: no [B, vocab] logits copy
    ms = 1000 * (time.perf_counter() - t0) / args.steps
    print(
        json.dumps(
            {
                "batch": args.batch,
                "context": args.context,
                "real_format": args.real_format,
                "wall_ms_per_step": ms,
            }
        )
    )


if __name__ == "__main__":
    main()
