"""Model-level benchmark on the GPU at DeepSeek-V4-Flash widths with a few layers and random bf16
weights: deepinfer's CUDA backend next to transformers' own DeepseekV4 (eager) on the same config,
in the same run, with the device rooflines measured first.

    python benchmarks/gpu_model_bench.py [--layers sliding,csa,hca] [--out results.json]
        [--kv-cache-dtypes f32,bf16,fp8] [--skip-eager] [--prefill-lengths 1024,4096]

Prefill: tokens/s for one sequence of S = 1024 and 4096 tokens (logits of the last token only).
Decode: ms per step for B sequences at context 4096 (one new token each), with CUDA graphs (the
default) and eagerly (decode_graph_max_batch=0). For deepinfer the decode
steps run over caches sized for the context but not filled by a prefill: a step's cost depends on
the lengths, not on the cached values. transformers decodes over a real 4096-token cache.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path

import torch
from v4_flash_config import decode_token, flash_config


def timed(fn, reps: int) -> float:
    """Mean seconds per call after one warm-up, synchronizing the GPU."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def rooflines() -> dict:
    a = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    copy_s = timed(lambda: b.copy_(a), 10)
    a = b = None  # free before the GEMM
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_s = timed(lambda: x @ y, 10)
    x = y = None
    return {
        "copy_GBps": 2 * 4 * (1 << 30) / copy_s / 1e9,
        "bf16_gemm_TFLOPs": 2 * 8192**3 / mm_s / 1e12,
    }


def bench_deepinfer(
    config_path: str,
    decode_batches: list[int],
    context: int,
    graphs: bool,
    kv_cache_dtype: str = "auto",
    prefill_lengths: tuple[int, ...] = (1024, 4096),
) -> dict:
    """Prefill tok/s and decode ms/step, with decode steps replayed as CUDA graphs or run eagerly
    (every kernel launched from the host). Both runs go through the same calls, so the caches
    (and the routing they lead to) are the same."""
    import deepinfer_core as dc

    max_b = max(decode_batches)
    blocks_per_seq = (context + 128) // 128 + 1
    runner = dc.ModelRunner.random(
        config_path,
        num_blocks=1 + max_b * blocks_per_seq,
        num_state_slots=max_b + 1,
        device="cuda",
        seed=1,
        decode_graph_max_batch=-1 if graphs else 0,
        kv_cache_dtype=kv_cache_dtype,
    )

    def table(slot: int) -> list[int]:
        return list(range(1 + slot * blocks_per_seq, 1 + (slot + 1) * blocks_per_seq))

    out: dict = {"kv_cache_dtype": kv_cache_dtype, "prefill_tok_s": {}, "decode_ms": {}}
    for s in prefill_lengths:
        tokens = [(7 * i) % 129000 + 2 for i in range(s)]
        sec = timed(
            lambda tokens=tokens: runner.forward(
                [dc.SequenceChunk(0, 0, tokens, table(0))], logits="last"
            ),
            3,
        )
        out["prefill_tok_s"][s] = s / sec
    for b in decode_batches:
        batch = [dc.SequenceChunk(i, context - 1, [decode_token(i)], table(i)) for i in range(b)]
        # greedy: the argmax is taken on the device, as an engine step samples there; forward
        # would add a [B, vocab] f32 copy to the host (16 MB at B = 32) to every step.
        sec = timed(lambda batch=batch: runner.greedy(batch), 20)
        out["decode_ms"][b] = 1000 * sec
    out["decode_graph_stats"] = runner.decode_graph_stats()
    runner = None
    gc.collect()
    return out


def bench_transformers(config: dict, decode_batches: list[int], context: int) -> dict:
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache

    cfg = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    with torch.device("cuda"):
        # Built directly in bf16 (fp32-kept modules stay fp32): 20B fp32 parameters would not fit.
        model = DeepseekV4ForCausalLM._from_config(
            DeepseekV4Config(**cfg, attn_implementation="eager"), dtype=torch.bfloat16
        )
    model.eval()
    out: dict = {"prefill_tok_s": {}, "decode_ms": {}}
    with torch.no_grad():
        for s in (1024, 4096):
            ids = torch.randint(2, 129000, (1, s), device="cuda")
            try:
                sec = timed(
                    lambda ids=ids: model(input_ids=ids, logits_to_keep=1, use_cache=False), 3
                )
                out["prefill_tok_s"][s] = s / sec
            except torch.OutOfMemoryError as e:
                out["prefill_tok_s"][s] = f"OOM ({str(e)[:80]})"
                torch.cuda.empty_cache()
        for b in decode_batches:
            try:
                cache = DynamicCache(config=model.config)
                ids = torch.randint(2, 129000, (b, context - 1), device="cuda")
                model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                step_ids = torch.randint(2, 129000, (b, 1), device="cuda")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                steps = 5
                for _ in range(steps):
                    model(input_ids=step_ids, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                out["decode_ms"][b] = 1000 * (time.perf_counter() - t0) / steps
                cache = None
            except torch.OutOfMemoryError as e:
                out["decode_ms"][b] = f"OOM ({str(e)[:80]})"
            gc.collect()
            torch.cuda.empty_cache()
    model = None
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layers", default="sliding,csa,hca", help="comma-separated: sliding, csa, hca"
    )
    parser.add_argument("--decode-batches", default="1,8,32,64")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-eager", action="store_true", help="graph-replayed decode only")
    parser.add_argument(
        "--kv-cache-dtypes",
        default="auto",
        help="comma-separated kv_cache_dtype values to run deepinfer with (auto: bf16 here)",
    )
    parser.add_argument("--prefill-lengths", default="1024,4096")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    layers = args.layers.split(",")
    batches = [int(b) for b in args.decode_batches.split(",")]
    prefill = tuple(int(s) for s in args.prefill_lengths.split(",") if s)
    config = flash_config(layers)
    results = {"device": torch.cuda.get_device_name(), "layers": layers, "rooflines": rooflines()}
    print(json.dumps(results["rooflines"]), flush=True)
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "config.json")
        Path(path).write_text(json.dumps(config))
        for kv in args.kv_cache_dtypes.split(","):
            suffix = "" if kv == "auto" else f"_{kv}"
            runs = [("", True)] if args.skip_eager else [("", True), ("_eager", False)]
            for eager, graphs in runs:
                key = f"deepinfer{eager}{suffix}"
                results[key] = bench_deepinfer(
                    path, batches, args.context, graphs, kv_cache_dtype=kv, prefill_lengths=prefill
                )
                print(key, json.dumps(results[key]), flush=True)
    if not args.skip_transformers:
        results["transformers"] = bench_transformers(config, batches, args.context)
        print("transformers", json.dumps(results["transformers"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
