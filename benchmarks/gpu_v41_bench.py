"""DeepSeek-V4.1 next to V4 at V4.1-Flash widths on one GPU (issue 16, item 8): random weights in
the shipped formats (FP8 GEMM weights, MXFP4 routed experts), a few layers of every V4.1 layer
role; decode ms/step at each context and batch, prefill tok/s and the paged KV bytes per token,
printed as one table at the end (JSON lines as it goes; --out writes the JSON).

    python benchmarks/gpu_v41_bench.py [--contexts 32768,131072] [--decode-batches 1,64,256]
        [--reps 10] [--prefill-tokens 4096] [--out results.json]
    python benchmarks/gpu_v41_bench.py --tiny --device cpu   # smoke run: tiny widths, on the CPU

The V4.1 model has 7 layers that cover every role of model.md C.2: 0 sliding; 1 sliding with
Engram; 2 C2 kv / index / index-K source; 3 C2 reader sharing 2's top-k; 4 the YOCO boundary,
C1 kv source and candidate source; 5 C1 reader and index source inside 4's candidates; 6 C1
reader sharing 5's top-k. The Engram table is cut to a small vocabulary (the lookup costs the
same per token; V4.1-Flash's 384M-row tables do not fit next to the rest). The V4 model has 7
layers (2 sliding, 3 CSA, 2 HCA) at the same widths (hidden 5120, 64 heads of 512, q rank 1280,
384 experts of 2304, 32 index heads), FP8 128x128 and MXFP4 experts.

What is synthetic: the weights are random, and decode does not prefill its context. Each of the B
sequences has its own blocks for `context` tokens and runs one token at position context - 1 over
caches that no prefill wrote (a step's cost depends on the lengths, not on the cached values, as
in gpu_model_bench.py). V4.1's Engram layers read each sequence's earlier tokens: every sequence
gets a random history of context - 1 tokens through ModelRunner.set_history, so its n-gram lookups
are real table reads at real row ids; the attention caches stay unwritten. Prefill is one
sequence of --prefill-tokens tokens, last-row logits. KV bytes per token come from an engine with
the same config (`Engine.kv_capacity.bytes_per_token`); on a GPU its KV capacity (sized from free
memory) also decides which (context, batch) cases fit.

--tiny swaps in tiny widths (v41_reference's config A and the embedded tiny V4 model) for a smoke
run on the CPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from v4_flash_config import QUANT, decode_token, flash_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import v41_reference as ref

V41_LAYERS = 7
BLOCK = 128


def v41_config(tiny: bool) -> dict:
    if tiny:
        return ref.TINY_A.to_hf_config()
    cfg = dataclasses.replace(
        ref.V41_FLASH,
        num_hidden_layers=V41_LAYERS,
        compress_ratios=(0, 0, 2, 2, 1, 1, 1, 0, 0, 0),
        kv_source_layer_ids=(2, 4),
        index_source_layer_ids=(2, 4, 5),
        candidate_source_layer_id=4,
        engram_layer_ids=(1,),
        engram_vocab_size=50_000,
        engram_num_embeddings=(0,),
        dspark_target_layer_ids=(4, 5, 6),
    )
    primes, _ = ref.engram_primes(cfg)
    cfg = dataclasses.replace(cfg, engram_num_embeddings=tuple(int(p.sum()) for p in primes))
    cfg.validate()
    return cfg.to_hf_config()


def v4_config(tiny: bool) -> dict:
    if tiny:
        from deepinfer.tiny import TINY_CONFIG

        return dict(TINY_CONFIG)
    config = flash_config(["sliding", "sliding", "csa", "csa", "hca", "csa", "hca"])
    config.update(
        hidden_size=5120,
        q_lora_rank=1280,
        n_routed_experts=384,
        moe_intermediate_size=2304,
        index_n_heads=32,
        quantization_config=dict(QUANT),
        expert_dtype="fp4",
    )
    return config


def write_config(config: dict, directory: str) -> str:
    path = Path(directory) / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def timed(fn: Callable[[], object], reps: int, device: str) -> float:
    """Mean seconds per call after one warm-up (on a GPU: synchronized around the timed calls)."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def kv_capacity(config_path: str, kv_cache_dtype: str, device: str) -> tuple[int, int | None]:
    """(paged KV bytes per token, paged blocks that fit next to the weights; None on the CPU,
    where the engine does not size its KV from free memory) of an engine with the config's
    random weights."""
    import deepinfer_core as dc

    engine = dc.Engine(
        str(Path(config_path).parent),
        device=device,
        load_format="dummy",
        kv_cache_dtype=kv_cache_dtype,
    )
    cap = engine.kv_capacity
    out = (cap.bytes_per_token, cap.num_blocks if device == "cuda" else None)
    del engine
    gc.collect()
    return out


def synthetic_history(length: int, vocab: int, seq: int) -> list[int]:
    """A random history of `length` token ids (never 0 or 1: BOS and EOS), distinct per sequence."""
    rng = np.random.default_rng(1000 + seq)
    return rng.integers(2, vocab, size=length, dtype=np.int64).tolist()


def measure(
    name: str,
    config: dict,
    contexts: list[int],
    batches: list[int],
    prefill_tokens: int,
    reps: int,
    kv_cache_dtype: str,
    device: str,
    emit: Callable[[dict], None],
) -> dict:
    import deepinfer_core as dc

    v41 = config.get("model_type") == "deepseek_v41"
    vocab = int(config.get("text_config", config)["vocab_size"])
    out: dict = {"decode_ms": {}, "prefill_tok_s": {}}
    with tempfile.TemporaryDirectory() as d:
        path = write_config(config, d)
        out["kv_bytes_per_token"], capacity = kv_capacity(path, kv_cache_dtype, device)
        need = 1 + max(
            [b * ((c + BLOCK) // BLOCK + 1) for c in contexts for b in batches]
            + [(prefill_tokens + BLOCK) // BLOCK + 1]
        )
        # On a GPU the runner holds fewer sequences' rings than the engine did: 90% of its blocks
        # leaves room for the prefill activations. The cases that do not fit are skipped.
        blocks = need if capacity is None else min(need, int(0.9 * capacity))
        emit({"model": name, "kv_bytes_per_token": out["kv_bytes_per_token"], "blocks": blocks})
        runner = dc.ModelRunner.random(
            path,
            num_blocks=blocks,
            num_state_slots=max(batches) + 1,
            device=device,
            seed=1,
            kv_cache_dtype=kv_cache_dtype,
        )
        for ctx in contexts:
            per_seq = (ctx + BLOCK) // BLOCK + 1
            fitting = [b for b in batches if 1 + b * per_seq <= blocks]
            for b in batches:
                if b not in fitting:
                    emit({"model": name, "context": ctx, "batch": b, "skipped": "KV does not fit"})
            if not fitting:
                continue
            if v41:  # the Engram n-grams of position ctx - 1 read the tokens before it
                t0 = time.perf_counter()
                for seq in range(max(fitting)):
                    runner.set_history(seq, synthetic_history(ctx - 1, vocab, seq))
                emit({"model": name, "context": ctx, "histories_s": time.perf_counter() - t0})
            for b in fitting:

                def table(seq: int, per_seq: int = per_seq) -> list[int]:
                    return list(range(1 + seq * per_seq, 1 + (seq + 1) * per_seq))

                rows = [
                    dc.SequenceChunk(i, ctx - 1, [decode_token(i) % vocab], table(i))
                    for i in range(b)
                ]
                # greedy: the argmax on the device, as an engine step samples there.
                ms = 1000 * timed(lambda rows=rows: runner.greedy(rows), reps, device)
                out["decode_ms"][f"{ctx}/{b}"] = ms
                emit({"model": name, "context": ctx, "batch": b, "decode_ms": ms})
        ids = [(7 * i) % (vocab - 2) + 2 for i in range(prefill_tokens)]
        chunk = dc.SequenceChunk(0, 0, ids, list(range(1, 1 + (prefill_tokens + BLOCK) // BLOCK)))
        sec = timed(lambda: runner.forward([chunk], logits="last"), 2, device)
        out["prefill_tok_s"][prefill_tokens] = prefill_tokens / sec
        emit({"model": name, "prefill": prefill_tokens, "tok_s": prefill_tokens / sec})
        runner = None  # frees the caches before the next model
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def table(results: dict, contexts: list[int], batches: list[int], prefill_tokens: int) -> str:
    """The V4.1 / V4 comparison as a text table."""
    v41, v4 = results["v41"], results["v4"]
    rows: list[tuple[str, float | None, float | None]] = [
        ("KV bytes/token", v41["kv_bytes_per_token"], v4["kv_bytes_per_token"]),
        (
            f"prefill tok/s ({prefill_tokens})",
            v41["prefill_tok_s"].get(prefill_tokens),
            v4["prefill_tok_s"].get(prefill_tokens),
        ),
    ]
    for ctx in contexts:
        for b in batches:
            key = f"{ctx}/{b}"
            length = f"{ctx // 1024}K" if ctx % 1024 == 0 else str(ctx)
            label = f"decode ms/step ctx {length} B {b}"
            rows.append((label, v41["decode_ms"].get(key), v4["decode_ms"].get(key)))

    def cell(v: float | None) -> str:
        if v is None:
            return "skipped"
        return f"{v:,.0f}" if v >= 100 else f"{v:.3f}"

    lines = [f"{'':32} {'V4.1':>12} {'V4':>12} {'V4.1/V4':>8}"]
    for label, a, b in rows:
        ratio = f"{a / b:.2f}" if a is not None and b else ""
        lines.append(f"{label:32} {cell(a):>12} {cell(b):>12} {ratio:>8}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contexts", default="32768,131072", help="decode contexts (tokens)")
    parser.add_argument("--decode-batches", default="1,64,256", help="decode batch sizes")
    parser.add_argument("--reps", type=int, default=10, help="timed decode steps per case")
    parser.add_argument("--prefill-tokens", type=int, default=4096)
    parser.add_argument(
        "--kv-cache-dtype",
        default="f32",
        help="KV dtype of both models (f32, bf16 or fp8: V4's fp8 records, V4.1's FP8 / FP4 ones)",
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a --tiny smoke run")
    parser.add_argument("--tiny", action="store_true", help="tiny widths (a CPU smoke run)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.decode_batches.split(",")]
    device = args.device
    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "tiny": args.tiny,
        "synthetic": "random weights; decode over unfilled caches; V4.1 Engram histories random",
    }

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))

    common = (contexts, batches, args.prefill_tokens, args.reps, args.kv_cache_dtype, device, emit)
    results["v41"] = measure("v4.1", v41_config(args.tiny), *common)
    results["v4"] = measure("v4", v4_config(args.tiny), *common)
    text = table(results, contexts, batches, args.prefill_tokens)
    results["table"] = text.splitlines()
    emit({"done": True})
    print(text, flush=True)


if __name__ == "__main__":
    main()
