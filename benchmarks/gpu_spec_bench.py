"""Cost of a speculative verify step next to a plain decode step on the GPU, at DeepSeek-V4-Flash
widths with a few layers and random bf16 weights (ModelRunner.random, no checkpoint on disk).

    python benchmarks/gpu_spec_bench.py [--layers sliding,csa,hca] [--batches 1,8,64] [--out f]

A verify row of d drafts is a (1 + d)-token chunk at the end of a 4096-token context; the step is
timed through ModelRunner.greedy (argmax on the device) with logits="all", so every position of the
chunk gets its lm_head row and argmax, as an engine verify step scores them. Each step is timed
eager (decode_graph_max_batch 0) and replayed from a recorded graph (the default limit: verify
steps of up to 64 rows replay, cpp/src/model/decode_graphs.h), so the rows with "graphs": true
next to "graphs": false give graph vs eager verify step ms ("graph_speedup" on the graph rows).
The extra lm_head rows alone are printed too (one [B * d, 4096] x [4096, 129280] bf16 GEMM,
measured with torch).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from gpu_model_bench import timed
from v4_flash_config import decode_token, flash_config


def main() -> None:
    import deepinfer_core as dc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="sliding,csa,hca")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = flash_config(args.layers.split(","))
    ctx = args.context
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        blocks_per_seq = (ctx + 128) // 128 + 1
        results: dict = {"layers": args.layers, "context": ctx, "rows": []}
        for graphs in (True, False):
            runner = dc.ModelRunner.random(
                str(path),
                num_blocks=1 + max(batches) * blocks_per_seq,
                num_state_slots=max(batches) + 1,
                device="cuda",
                seed=1,
                decode_graph_max_batch=-1 if graphs else 0,
            )

            def table(slot: int) -> list[int]:
                return list(range(1 + slot * blocks_per_seq, 1 + (slot + 1) * blocks_per_seq))

            for b in batches:
                for d in (0, 1, 2, 3, 4):
                    batch = [
                        dc.SequenceChunk(
                            i, ctx - 1, [decode_token(i + j) for j in range(1 + d)], table(i)
                        )
                        for i in range(b)
                    ]
                    ms = 1000 * timed(
                        lambda batch=batch, r=runner: r.greedy(batch, logits="all"), 20
                    )
                    row = {"B": b, "drafts": d, "graphs": graphs, "ms": ms}
                    results["rows"].append(row)
                    print(json.dumps(row), flush=True)
            runner = None
    head = torch.randn(129280, 4096, dtype=torch.bfloat16, device="cuda")
    for b in batches:
        for d in (1, 2, 3, 4):
            x = torch.randn(b * d, 4096, dtype=torch.bfloat16, device="cuda")
            ms = 1000 * timed(lambda x=x: x @ head.T, 20)
            row = {"B": b, "drafts": d, "extra_lm_head_ms": ms}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    base = {
        r["B"]: r["ms"]
        for r in results["rows"]
        if r.get("drafts") == 0 and not r.get("graphs", True)
    }
    eager = {
        (r["B"], r["drafts"]): r["ms"] for r in results["rows"] if "ms" in r and not r["graphs"]
    }
    for r in results["rows"]:
        if "ms" in r and not r["graphs"] and r["drafts"] > 0:
            r["relative_to_eager_decode"] = r["ms"] / base[r["B"]]
        if "ms" in r and r["graphs"]:
            r["graph_speedup"] = eager[(r["B"], r["drafts"])] / r["ms"]
    print("SPEC-BENCH " + json.dumps(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
