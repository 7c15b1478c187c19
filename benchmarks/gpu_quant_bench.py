"""Model-level benchmark of DeepSeek's shipped formats on one GPU: V4-Flash widths with random
weights in the real formats (FP8 e4m3 128x128 block-scaled GEMM weights, MXFP4 routed experts),
next to the same model with bf16 weights and to the bytes-read roofline, in one run.

    python benchmarks/gpu_quant_bench.py [--out results.json] [--skip-truncated]

1. Rooflines measured first: copy bandwidth (1 GiB device copy), bf16 and FP8 dense GEMM peaks
   at 8192^3 (torch matmul and torch._scaled_mm).
2. Three layers (sliding, CSA, HCA) with all 256 experts: decode ms/step at B = 1 .. 256
   (context 4096, CUDA graphs) with the real-format bytes a step must read and the time that
   takes at the measured copy bandwidth; prefill tok/s at 4096 and 16384 tokens. The same for
   bf16 weights.
3. A truncated V4-Flash: as many of the 43 layers (real layer pattern, real formats) as fit
   with KV for 64 sequences of 8K, plus the head: TPOT at B = 1 and output tok/s at B = 64 and
   128 (context 8192), and the per-layer cost (from the difference to the 3-layer model) that
   extrapolates the step to 43 layers.

Bytes per decode step count every weight byte a step reads once (experts: the expected number
of distinct experts uniform top-6 routing touches per layer, 256 (1 - (1 - 6/256)^B)) plus the
KV each sequence reads (window, CSA top-k entries and the indexer's scan, HCA entries) in the
cache format the model runs with: the fp8 records (584 bytes per main entry, 132 per index key)
for the real formats, bf16 for the bf16 checkpoint (what kv_cache_dtype "auto" takes on a GPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from pathlib import Path

import torch
from gpu_model_bench import rooflines as dense_rooflines
from gpu_model_bench import timed
from v4_flash_config import LAYER_TYPES, decode_token, flash_config, real_format


def rooflines() -> dict:
    """Copy bandwidth and the bf16 peak (gpu_model_bench), plus the FP8 peak (torch._scaled_mm,
    per-tensor scales) at 8192^3."""
    out = dense_rooflines()
    x = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    y = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.ones((), device="cuda")  # y column-major above: the layout _scaled_mm wants
    fp8_s = timed(lambda: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16), 10)
    out["fp8_gemm_TFLOPs"] = 2 * 8192**3 / fp8_s / 1e12
    return out


# The KV cache format each model runs with (kv_cache_dtype "auto" on a GPU takes the same).
KV_DTYPE = {True: "fp8", False: "bf16"}


def kv_entry_bytes(kv_dtype: str, dim: int, rope_dim: int) -> int:
    """Bytes of one cache row of `dim` channels (kv_record.h's row formats): f32 or bf16 values,
    or fp8 records, the main one (rope_dim > 0: e4m3 non-RoPE channels, bf16 RoPE channels, one
    power-of-two scale byte per 64, padded to 8 bytes) or the index key's (e4m3, one f32 scale)."""
    if kv_dtype == "f32":
        return 4 * dim
    if kv_dtype == "bf16":
        return 2 * dim
    if rope_dim == 0:
        return dim + 4
    nope = dim - rope_dim
    return (nope + 2 * rope_dim + (nope + 63) // 64 + 7) // 8 * 8


def step_bytes(config: dict, batch: int, context: int, quantized: bool) -> float:
    """Bytes one decode step of `batch` sequences at `context` must read (see the module doc)."""
    h, q, nh, d = config["hidden_size"], config["q_lora_rank"], 64, config["head_dim"]
    g, og, i_size, e = config["o_groups"], config["o_lora_rank"], 2048, 256
    hi, di, topk = config["index_n_heads"], config["index_head_dim"], config["index_topk"]
    rope = int(d * config["partial_rotary_factor"])
    main = kv_entry_bytes(KV_DTYPE[quantized], d, rope)
    index = kv_entry_bytes(KV_DTYPE[quantized], di, 0)
    gemm = 1.0 if quantized else 2.0  # FP8 (scales are 1/16384 of it) or bf16 per parameter
    expert = 3 * i_size * h * (0.5 + 1 / 32) if quantized else 3 * i_size * h * 2.0
    touched = e * (1 - (1 - 6 / e) ** batch)
    total = 0.0
    for kind in config["layer_types"]:
        attn = q * h + nh * d * q + d * h + g * og * (nh * d // g) + h * g * og
        total += attn * gemm + 3 * i_size * h * gemm + touched * expert
        total += e * h * 2 + 2 * 24 * 4 * h * 4  # router (bf16), mHC fn (f32)
        kv = 128 * main  # the sliding window's keys
        if kind == LAYER_TYPES["csa"]:
            total += 2 * (2 * d) * h * 2 + 2 * (2 * di) * h * 2 + hi * di * q * gemm + hi * h * 2
            kv += min(topk, context // 4) * main + (context // 4) * index
        elif kind == LAYER_TYPES["hca"]:
            total += 2 * d * h * 2
            kv += (context // 128) * main
        total += batch * kv
    return total + config["vocab_size"] * h * 2  # the bf16 head


def make_runner(config: dict, max_b: int, context: int, kv_cache_dtype: str):
    import deepinfer_core as dc

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "config.json")
        Path(path).write_text(json.dumps(config))
        blocks_per_seq = (context + 128) // 128 + 1
        runner = dc.ModelRunner.random(
            path,
            num_blocks=1 + max_b * blocks_per_seq,
            num_state_slots=max_b + 1,
            device="cuda",
            seed=1,
            kv_cache_dtype=kv_cache_dtype,
        )
    return runner, blocks_per_seq


def decode_ms(runner, blocks_per_seq: int, batch: int, context: int, reps: int = 20) -> float:
    import deepinfer_core as dc

    def table(slot: int) -> list[int]:
        return list(range(1 + slot * blocks_per_seq, 1 + (slot + 1) * blocks_per_seq))

    rows = [dc.SequenceChunk(i, context - 1, [decode_token(i)], table(i)) for i in range(batch)]
    return 1000 * timed(lambda: runner.greedy(rows), reps)


def prefill_tok_s(runner, blocks_per_seq: int, tokens: int) -> float:
    import deepinfer_core as dc

    ids = [(7 * i) % 129000 + 2 for i in range(tokens)]
    chunk = dc.SequenceChunk(0, 0, ids, list(range(1, 1 + blocks_per_seq)))
    return tokens / timed(lambda: runner.forward([chunk], logits="last"), 2)


def three_layers(quantized: bool, batches: list[int], copy_gbps: float, emit) -> dict:
    config = flash_config(["sliding", "csa", "hca"])
    if quantized:
        config = real_format(config)
    context = 4096
    runner, bps = make_runner(config, max(batches), 16384, KV_DTYPE[quantized])
    out: dict = {"kv_cache_dtype": KV_DTYPE[quantized], "decode": {}, "prefill_tok_s": {}}
    for b in batches:
        ms = decode_ms(runner, bps, b, context)
        nbytes = step_bytes(config, b, context, quantized)
        roof_ms = 1000 * nbytes / (copy_gbps * 1e9)
        out["decode"][b] = {
            "ms": ms,
            "bytes_GB": nbytes / 1e9,
            "roofline_ms": roof_ms,
            "ratio_to_roofline": ms / roof_ms,
        }
        emit({"three_layers": "real" if quantized else "bf16", "batch": b, **out["decode"][b]})
    for s in (4096, 16384):
        out["prefill_tok_s"][s] = prefill_tok_s(runner, bps, s)
        emit(
            {
                "three_layers": "real" if quantized else "bf16",
                "prefill": s,
                "tok_s": out["prefill_tok_s"][s],
            }
        )
    runner = None
    gc.collect()
    return out


def flash_layer_pattern(n: int) -> list[str]:
    """V4-Flash's first n layers: two sliding, then CSA and HCA alternating."""
    return [("sliding" if i < 2 else ("csa" if i % 2 == 0 else "hca")) for i in range(n)]


def truncated(three: dict, emit) -> dict:
    context, seqs = 8192, 128
    # Real-format bytes per layer (weights, experts all resident) and the resident head/embed.
    h = 4096
    layer_bytes = 256 * 3 * 2048 * h * (0.5 + 1 / 32) + 180e6
    free, _ = torch.cuda.mem_get_info()
    # A CSA layer's entries and index keys in the fp8 records the runner keeps.
    kv_per_layer = (
        seqs * (context // 4) * (kv_entry_bytes("fp8", 512, 64) + kv_entry_bytes("fp8", 128, 0))
    )
    fixed = 2 * 129280 * h * 2 + 12e9  # embed + head (bf16) + activations, graphs and slack
    n = int((free - fixed) // (layer_bytes + kv_per_layer))
    n = max(3, min(43, n))
    config = real_format(flash_config(flash_layer_pattern(n)))
    emit({"truncated_layers": n, "free_GB": free / 1e9})
    runner, bps = make_runner(config, seqs, context, KV_DTYPE[True])
    out: dict = {"layers": n}
    for b in (1, 64, 128):
        ms = decode_ms(runner, bps, b, context, reps=10)
        out[b] = {"step_ms": ms, "output_tok_s": 1000 * b / ms}
        emit({"truncated": n, "batch": b, **out[b]})
    runner = None
    gc.collect()
    # Per-layer cost from the 3-layer model at the same batch (context 4096 there: the KV part
    # of a layer is small next to its weights).
    for b in (1, 64, 128):
        if b in three["decode"]:
            per_layer = (out[b]["step_ms"] - three["decode"][b]["ms"]) / (n - 3)
            full = out[b]["step_ms"] + (43 - n) * per_layer
            out[b]["per_layer_ms"] = per_layer
            out[b]["extrapolated_43_layer_step_ms"] = full
            out[b]["extrapolated_43_layer_tok_s"] = 1000 * b / full
            emit(
                {
                    "truncated": n,
                    "batch": b,
                    "per_layer_ms": per_layer,
                    "extrapolated_43_layer_step_ms": full,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decode-batches", default="1,8,32,64,128,256")
    parser.add_argument("--skip-bf16", action="store_true")
    parser.add_argument("--skip-truncated", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    batches = [int(b) for b in args.decode_batches.split(",")]
    results: dict = {"device": torch.cuda.get_device_name()}

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))

    results["rooflines"] = rooflines()
    emit(results["rooflines"])
    copy = results["rooflines"]["copy_GBps"]
    results["real"] = three_layers(True, batches, copy, emit)
    if not args.skip_bf16:
        results["bf16"] = three_layers(False, batches, copy, emit)
    if not args.skip_truncated:
        results["truncated"] = truncated(results["real"], emit)
    emit({"done": True})


if __name__ == "__main__":
    main()
