"""KV tiers on an agent trace (issue 15 item 6): prefill throughput counting cache hits against
uncached prefill, TTFT, and the bytes read from the host tier and the store, then the same after an
engine restart (the store's hits survive it).

    python benchmarks/gpu_agent_trace_bench.py [--sessions 2] [--start 8192] [--end 77824]
        [--growth 1.04] [--output 16] [--gpu-tokens 98304] [--kv-window-state exact] [--out f]
    python benchmarks/gpu_agent_trace_bench.py --smoke      # the tiny model on the CPU
    # A loaded prefill card (benchmarks/RESULTS.md, session 10: 21.6x): 32 agents at once, the GPU
    # holding 16 contexts, so most hits still come from the host tier.
    python benchmarks/gpu_agent_trace_bench.py --phase trace --uncached-tok-s RATE --concurrent \
        --sessions 32 --gpu-tokens 1310720 --output 1

The trace: `--sessions` agents take turns; each turn resends its session's whole context (the
previous context, the previous turn's output, and new tokens: the context grows by --growth per
turn, 4% by default, i.e. ~96% of a turn's prompt was seen before, as in the seed's agent traffic)
from --start to --end tokens (8K to 76K by default, the seed's average request being 77K input
tokens). The GPU's KV cache holds --gpu-tokens tokens of context, about one session, so a session
whose turn comes back finds its blocks evicted to the host tier (and written through to the
store directory on this machine's local disk) and fetches them. The model: V4-Flash widths, the
layers of --layers, random weights in the shipped formats (load_format dummy), fp8 KV. A hit's
window state is restored as --kv-window-state says: `exact` (the stored snapshot) or
`bounded_replay` (the last window of tokens before the hit recomputed; docs/kv_store.md).

Reported: the uncached prefill rate of one cold context of --end tokens (prefix cache off); over
the trace, prompt tokens / sum of TTFT ("prefill counting hits") and its ratio to the uncached
rate (the seed: 25x at production scale; the goal here: >= 20x); TTFT p50/p99; tokens hit per
tier; store and host bytes and the store's read rate (bytes over the fetches' wall time). Then a
new engine on the same store (host tier empty) replays one more turn per session: the same
figures after a restart.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import deepinfer_core as dc

TIER_KEYS = (
    "prompt_tokens_cached",
    "host_hit_tokens",
    "store_hit_tokens",
    "store_bytes_read",
    "store_bytes_written",
    "kv_fetches",
    "kv_fetch_seconds_total",
)


def grow(context: list[int], rng: random.Random, target: int) -> list[int]:
    return context + [rng.randrange(2, 129000) for _ in range(max(1, target - len(context)))]


def turn(engine: dc.Engine, prompt: list[int], output: int) -> tuple[list[int], float, int]:
    """Runs one request alone; returns its tokens, TTFT in seconds and its cache-hit tokens."""
    params = dc.SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)
    start = time.perf_counter()
    rid = engine.add_request(prompt, params)
    tokens: list[int] = []
    ttft, hit = None, 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.id != rid:
                continue
            if o.ready:
                hit = o.prompt_cache_hit_tokens
            if o.tokens and ttft is None:
                ttft = time.perf_counter() - start
            tokens += o.tokens
    engine.step()
    if ttft is None:
        raise RuntimeError(f"a {len(prompt)}-token turn produced no token (rejected?)")
    return tokens, ttft, hit


def concurrent_trace(
    engine: dc.Engine, contexts: list[list[int]], rngs: list[random.Random], args
) -> tuple[list[float], int, int, float]:
    """Every session keeps one turn in flight: when a session's turn ends, its context grows and
    its next turn is added, until every session has reached --end. Returns the TTFTs, the prompt
    and hit tokens and the wall time of the whole trace (the throughput a loaded prefill card
    sees: suffixes of several sessions share a step, as production prefill batches do)."""
    params = dc.SamplingParams(temperature=0.0, max_tokens=args.output, ignore_eos=True)
    live: dict[int, tuple[int, float]] = {}  # request id -> (session, start)
    out_tokens: dict[int, list[int]] = {}
    ttft_of: dict[int, float] = {}
    ttfts: list[float] = []
    prompts = hits = 0

    def submit(s: int) -> None:
        nonlocal prompts
        rid = engine.add_request(contexts[s], params)
        live[rid] = (s, time.perf_counter())
        out_tokens[rid] = []
        prompts += len(contexts[s])

    start = time.perf_counter()
    for s in range(len(contexts)):
        submit(s)
    while live:
        for o in engine.step():
            if o.id not in live:
                continue
            s, began = live[o.id]
            if o.ready:
                hits += o.prompt_cache_hit_tokens
            if o.tokens and o.id not in ttft_of:
                ttft_of[o.id] = time.perf_counter() - began
                ttfts.append(ttft_of[o.id])
            out_tokens[o.id] += o.tokens
            if o.finish is None:
                continue
            del live[o.id]
            if o.id not in ttft_of:
                raise RuntimeError(
                    f"a {len(contexts[s])}-token turn produced no token ({o.finish})"
                )
            grown = contexts[s] + out_tokens.pop(o.id)
            contexts[s] = grow(grown, rngs[s], int(len(grown) * args.growth))
            if len(contexts[s]) < args.end:
                submit(s)
    while engine.has_unfinished():
        engine.step()
    return ttfts, prompts, hits, time.perf_counter() - start


@contextlib.contextmanager
def torch_profile(path: Path):
    """Profiles the block with torch.profiler (CUPTI sees every kernel and CUDA call of the
    process, the engine's included) and writes a summary: the share of the wall time the GPU
    was busy (union of kernel and copy intervals), the top kernels, and the CUDA API calls by
    host time."""
    import torch  # a harness-only dependency: only this option needs it

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    begin = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        yield
    wall_us = (time.perf_counter() - begin) * 1e6
    gpu, api = [], collections.defaultdict(lambda: [0, 0.0])
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu.append((e.time_range.start, e.time_range.end))
            k = kernels[e.name[:90]]
            k[0] += 1
            k[1] += e.time_range.elapsed_us()
        elif e.name.startswith("cuda"):
            a = api[e.name]
            a[0] += 1
            a[1] += e.time_range.elapsed_us()
    gpu.sort()
    busy, end = 0.0, -1.0
    for a, b in gpu:
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:40]
    summary = {
        "wall_ms": wall_us / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "gpu_busy_share": busy / wall_us,
        "kernels": [{"name": n, "calls": c, "ms": t / 1e3} for n, (c, t) in top],
        "cuda_api": [
            {"name": n, "calls": c, "ms": t / 1e3}
            for n, (c, t) in sorted(api.items(), key=lambda kv: -kv[1][1])
        ],
    }
    path.write_text(json.dumps(summary, indent=1))
    print(
        f"profile: wall {summary['wall_ms']:.0f} ms, GPU busy {summary['gpu_busy_ms']:.0f} ms "
        f"({summary['gpu_busy_share']:.2f}); details in {path}",
        flush=True,
    )


def tiers(engine: dc.Engine) -> dict:
    s = engine.stats()
    return {k: s[k] for k in TIER_KEYS}


def summary(
    name: str,
    ttfts: list[float],
    prompts: int,
    hits: int,
    before: dict,
    after: dict,
    uncached_tok_s: float,
    wall: float | None = None,
) -> dict:
    d = {k: after[k] - before[k] for k in TIER_KEYS}
    # One turn at a time: the prefill time is the TTFTs' sum; concurrent: the trace's wall time.
    total = sum(ttfts) if wall is None else wall
    rate = prompts / total
    ordered = sorted(ttfts)
    return {
        "phase": name,
        "turns": len(ttfts),
        "prompt_tokens": prompts,
        "hit_tokens": hits,
        "hit_share": hits / prompts,
        "prefill_tok_s_counting_hits": rate,
        "vs_uncached": rate / uncached_tok_s,
        "ttft_p50_ms": 1000 * statistics.median(ordered),
        "ttft_p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "host_hit_tokens": d["host_hit_tokens"],
        "store_hit_tokens": d["store_hit_tokens"],
        "store_bytes_read": d["store_bytes_read"],
        "store_bytes_written": d["store_bytes_written"],
        "store_read_gb_s": (
            d["store_bytes_read"] / d["kv_fetch_seconds_total"] / 1e9
            if d["kv_fetch_seconds_total"] > 0
            else None
        ),
        "fetches": d["kv_fetches"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="sliding,csa,hca")
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--start", type=int, default=8192)
    parser.add_argument("--end", type=int, default=77824)
    parser.add_argument("--growth", type=float, default=1.04)
    parser.add_argument("--output", type=int, default=16)
    parser.add_argument("--gpu-tokens", type=int, default=98304)
    parser.add_argument("--host-gib", type=float, default=16.0)
    parser.add_argument(
        "--kv-window-state",
        choices=("exact", "bounded_replay"),
        default="exact",
        help="how a hit's sliding-window state comes back: stored snapshot or bounded replay",
    )
    parser.add_argument(
        "--phase",
        choices=("all", "cold", "trace"),
        default="all",
        help="cold: only the uncached prefill; trace: skip it (the ratio then uses "
        "--uncached-tok-s); for profiling one phase at a time",
    )
    parser.add_argument(
        "--uncached-tok-s",
        type=float,
        default=0.0,
        help="the uncached rate the trace's ratio is taken against when --phase trace",
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="all --sessions run at once (each keeps one turn in flight) and the rate is prompt "
        "tokens over the trace's wall time; default: one turn at a time, rate over the TTFTs' sum",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="with --concurrent: profile the trace (torch.profiler, CUPTI) and write where the "
        "time went (GPU busy share, kernels, CUDA API calls) to this JSON file",
    )
    parser.add_argument("--smoke", action="store_true", help="the tiny model on the CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.profile and not args.concurrent:
        parser.error("--profile profiles the concurrent trace: add --concurrent")
    if args.smoke:
        args.start, args.end, args.gpu_tokens, args.host_gib = 200, 700, 1024, 0.25
        args.growth = 1.25

    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as store:
        if args.smoke:
            from deepinfer.tiny import ensure_tiny_checkpoint

            model = str(ensure_tiny_checkpoint())
            common = {"device": "cpu"}
        else:
            from v4_flash_config import flash_config, real_format

            model = tmp
            config = real_format(flash_config(args.layers.split(",")))
            (Path(tmp) / "config.json").write_text(json.dumps(config))
            common = {"device": "cuda", "load_format": "dummy", "seed": 1}
        common |= {
            "max_num_seqs": max(2, args.sessions if args.concurrent else 2),
            "max_num_batched_tokens": 8192,
            # The last turn's context grows past --end by one step.
            "max_model_len": int(args.end * args.growth) + 2 * args.output + 1024,
            "kv_cache_dtype": "fp8" if not args.smoke else "auto",
        }
        uncached = args.uncached_tok_s
        if args.phase != "trace":
            # Uncached: one cold context of --end tokens, prefix cache off.
            cold = dc.Engine(model, enable_prefix_cache=False, **common)
            rng = random.Random(0)
            long_prompt = [rng.randrange(2, 129000) for _ in range(args.end)]
            turn(cold, long_prompt[:1024], 2)  # warm-up
            _, cold_ttft, _ = turn(cold, long_prompt, 2)
            uncached = args.end / cold_ttft
            del cold
            print(f"uncached prefill: {uncached:,.0f} tok/s ({args.end} tokens cold)", flush=True)
            if args.phase == "cold":
                return
        elif uncached <= 0:
            parser.error("--phase trace needs --uncached-tok-s")

        tiered = {
            "num_kv_blocks": args.gpu_tokens // 128 + 1,
            "kv_host_cache_bytes": int(args.host_gib * (1 << 30)),
            "kv_store_path": store,
            "kv_window_state": args.kv_window_state,
        }
        engine = dc.Engine(model, **common, **tiered)
        print(f"KV bytes per token: {engine.kv_capacity.bytes_per_token}", flush=True)
        # The host tier's arena: pinned on CUDA (direct copies), 0 when it is pageable (the CPU).
        pinned_bytes = engine.stats()["kv_host_pinned_bytes"]
        print(f"host tier: {pinned_bytes / (1 << 30):.2f} GiB pinned", flush=True)
        contexts = [grow([], random.Random(100 + s), args.start) for s in range(args.sessions)]
        rngs = [random.Random(200 + s) for s in range(args.sessions)]
        ttfts, prompts, hits, wall = [], 0, 0, None
        before = tiers(engine)
        if args.concurrent and args.profile:
            with torch_profile(args.profile):
                ttfts, prompts, hits, wall = concurrent_trace(engine, contexts, rngs, args)
        elif args.concurrent:
            ttfts, prompts, hits, wall = concurrent_trace(engine, contexts, rngs, args)
        while not args.concurrent and all(len(c) < args.end for c in contexts):
            for s in range(args.sessions):
                out, ttft, hit = turn(engine, contexts[s], args.output)
                ttfts.append(ttft)
                prompts += len(contexts[s])
                hits += hit
                contexts[s] = grow(contexts[s] + out, rngs[s], int(len(contexts[s]) * args.growth))
        engine.flush_kv_tiers()
        rows = [summary("trace", ttfts, prompts, hits, before, tiers(engine), uncached, wall)]
        del engine

        # Restart: a new engine on the same store, host tier empty; one more turn per session.
        engine = dc.Engine(model, **common, **tiered)
        ttfts, prompts, hits = [], 0, 0
        before = tiers(engine)
        for s in range(args.sessions):
            _, ttft, hit = turn(engine, contexts[s], args.output)
            ttfts.append(ttft)
            prompts += len(contexts[s])
            hits += hit
        rows.append(summary("after restart", ttfts, prompts, hits, before, tiers(engine), uncached))
        # Its write-through must end before the store directory is removed with the block.
        engine.flush_kv_tiers()
        del engine

    measured = f"{args.end} tokens cold" if args.phase == "all" else "given by --uncached-tok-s"
    print(f"uncached prefill: {uncached:,.0f} tok/s ({measured})")
    print(f"window state on a hit: {args.kv_window_state}")
    mode = f"{args.sessions} sessions at once" if args.concurrent else "one turn at a time"
    print(
        f"trace: {mode}; rate = prompt tokens / "
        + ("wall time" if args.concurrent else "sum of TTFTs")
    )
    print(
        "| phase | turns | prompt tok | hit share | prefill tok/s counting hits | vs uncached "
        "| TTFT p50 ms | TTFT p99 ms | host hit tok | store hit tok | store MB read | "
        "store GB/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        gbs = f"{r['store_read_gb_s']:.2f}" if r["store_read_gb_s"] else "-"
        print(
            f"| {r['phase']} | {r['turns']} | {r['prompt_tokens']} | {r['hit_share']:.3f} | "
            f"{r['prefill_tok_s_counting_hits']:,.0f} | {r['vs_uncached']:.1f}x | "
            f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['host_hit_tokens']} | "
            f"{r['store_hit_tokens']} | {r['store_bytes_read'] / 1e6:.1f} | {gbs} |"
        )
    result = {
        "uncached_tok_s": uncached,
        "host_pinned_bytes": pinned_bytes,
        "settings": vars(args) | {"out": None},
        "rows": rows,
    }
    print("AGENT-TRACE-BENCH " + json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
