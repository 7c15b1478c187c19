"""Kernel timeline of decode steps replayed from CUDA graphs: per kernel, its time per step.

    python benchmarks/gpu_trace_decode.py --batch 1                  # real formats, B = 1
    python benchmarks/gpu_trace_decode.py --batch 64 --bf16 --steps 3
    python benchmarks/gpu_trace_decode.py --batch 1 --sequence       # also the last step in order

Nsight Compute times each kernel alone, outside its graph; this records the graph replays as they
run (torch.profiler's CUPTI trace sees the kernels of any library in the process), so the idle
time between kernels and the step's span are the engine's own. Same model as gpu_profile_decode.py
(its decode_model: V4-Flash widths, 3 layers [sliding, CSA, HCA], context 4096; by default
DeepSeek's shipped formats, with --bf16 random bf16 weights). Needs torch with CUDA: a harness,
not the engine.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import tempfile
from pathlib import Path

from gpu_profile_decode import decode_model


def short_name(name: str) -> str:
    """A kernel's name without its argument list, return type and this project's namespaces."""
    name = name.replace("void ", "").replace("(anonymous namespace)::", "")
    name = re.sub(r"^deepinfer::cuda::", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += {"<": 1, ">": -1}.get(ch, 0)
        out.append(ch)
    return "".join(out)[:100]


def step_sequence(step: list[dict]) -> list[tuple[float, float, float, str, str]]:
    """One step's kernel events (in start order) as (start us within the step, us, idle us before
    it, "main" or "side", short name). Side branches run on a second stream, so the idle time is
    measured from the end of the kernel before on the same stream; the main stream is the one
    with the most kernels."""

    def stream_of(e: dict) -> object:
        return e.get("args", {}).get("stream")

    main_stream = collections.Counter(stream_of(e) for e in step).most_common(1)[0][0]
    t0 = step[0]["ts"]
    ends: dict[object, float] = {}
    rows = []
    for e in step:
        start = e["ts"] - t0
        idle = start - ends.get(stream_of(e), start)
        ends[stream_of(e)] = start + e["dur"]
        where = "main" if stream_of(e) == main_stream else "side"
        rows.append((start, e["dur"], idle, where, short_name(e["name"])))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5, help="steps traced (after 3 untraced ones)")
    p.add_argument("--bf16", action="store_true", help="random bf16 weights, not real formats")
    p.add_argument("--top", type=int, default=40, help="kernels listed, by time per step")
    p.add_argument(
        "--sequence",
        action="store_true",
        help="list the last step's kernels in order, with their stream and start",
    )
    p.add_argument("--trace", type=Path, help="keep the Chrome trace here")
    args = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    runner, batch, _ = decode_model(args.batch, args.context, real=not args.bf16, graphs=True)
    for _ in range(3):  # the graph is recorded on the first
        runner.greedy(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            runner.greedy(batch)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        trace = args.trace or Path(d) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not kernels:
        raise SystemExit("no kernels recorded: is this torch's CUDA profiler (CUPTI) available?")
    steps = args.steps
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    busy = sum(e["dur"] for e in kernels)
    print(
        json.dumps(
            {
                "batch": args.batch,
                "kernels_per_step": len(kernels) / steps,
                "span_us_per_step": span / steps,
                "kernel_us_per_step": busy / steps,
            }
        )
    )
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        entry = totals[short_name(e["name"])]
        entry[0] += 1
        entry[1] += e["dur"]
    for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[: args.top]:
        per_step, per_call = us / steps, us / calls
        print(f"{per_step:9.1f} us/step {calls / steps:6.1f} calls {per_call:8.2f} us/call  {name}")
    if args.sequence:
        last = kernels[-(len(kernels) // steps) :]
        print("--- the last step: start us, us, idle us before it on its stream, stream, kernel")
        for start, dur, idle, where, name in step_sequence(last):
            print(f"{start:9.2f} {dur:8.2f} {idle:6.2f}  {where}  {name}")


if __name__ == "__main__":
    main()
