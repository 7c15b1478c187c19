"""DeepSeek-V4.1 next to V4 at V4.1-Flash widths on one GPU (issue 16, item 8): random weights in
the shipped formats (FP8 GEMM weights, MXFP4 routed experts), a few layers of every V4.1 layer
role, prefill tok/s and decode ms/step, and the paged KV bytes per token, in one run.

    python benchmarks/gpu_v41_bench.py [--contexts 32768,131072] [--decode-batches 1,64,256]

The V4.1 model has 7 layers that cover every role of model.md C.2: 0 sliding; 1 sliding with
Engram; 2 C2 kv / index / index-K source; 3 C2 reader sharing 2's top-k; 4 the YOCO boundary,
C1 kv source and candidate source; 5 C1 reader and index source inside 4's candidates; 6 C1
reader sharing 5's top-k. The Engram table is cut to a small vocabulary (the lookup costs the
same per token; V4.1-Flash's 384M-row tables do not fit next to the rest). The V4 model has 7
layers (2 sliding, 3 CSA, 2 HCA) at the same widths (hidden 5120, 64 heads of 512, q rank 1280,
384 experts of 2304, 32 index heads), FP8 128x128 and MXFP4 experts.

Decode runs one token per sequence at `context` (each sequence's blocks are its own), V4 only:
V4.1's Engram layers need each sequence's earlier tokens, which the runner has only for what it
was fed (decode at 32K would need the 32K-token prefill of every sequence first; not done yet).
Prefill is one sequence of 4096 tokens, last-row logits. KV bytes per token come from the
engine's KV capacity (`Engine.kv_capacity.bytes_per_token`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch
from gpu_quant_bench import QUANT, decode_ms, prefill_tok_s
from v4_flash_config import flash_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import v41_reference as ref

V41_LAYERS = 7


def v41_config() -> dict:
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


def v4_config() -> dict:
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


def kv_capacity(config_path: str, kv_cache_dtype: str) -> tuple[int, int]:
    """(paged KV bytes per token, paged blocks that fit next to the weights) of an engine with
    random weights on this GPU, its KV sized from the free memory."""
    import deepinfer_core as dc

    engine = dc.Engine(
        str(Path(config_path).parent),
        device="cuda",
        load_format="dummy",
        kv_cache_dtype=kv_cache_dtype,
    )
    cap = engine.kv_capacity
    out = (cap.bytes_per_token, cap.num_blocks)
    del engine
    gc.collect()
    return out


def measure(
    name: str, config: dict, contexts: list[int], batches: list[int], kv_cache_dtype: str, emit
) -> dict:
    import deepinfer_core as dc

    out: dict = {"decode_ms": {}, "prefill_tok_s": {}}
    with tempfile.TemporaryDirectory() as d:
        path = write_config(config, d)
        out["kv_bytes_per_token"], capacity = kv_capacity(path, kv_cache_dtype)
        # The runner holds fewer sequences' rings than the engine did: 90% of its blocks leaves
        # room for the prefill activations.
        blocks = int(0.9 * capacity)
        emit({"model": name, "kv_bytes_per_token": out["kv_bytes_per_token"], "blocks": blocks})
        runner = dc.ModelRunner.random(
            path,
            num_blocks=blocks,
            num_state_slots=max(batches) + 1,
            device="cuda",
            seed=1,
            kv_cache_dtype=kv_cache_dtype,
        )
        # V4.1's Engram layers hash each position's previous tokens, which ModelRunner keeps per
        # slot from what it was fed: a decode at a context it was not fed is refused, and feeding
        # B x 32K tokens first is not done here (not measured; the H200 run said so).
        v41 = config.get("model_type") == "deepseek_v41"
        for ctx in contexts if not v41 else []:
            per_seq = (ctx + 128) // 128 + 1
            for b in batches:
                if 1 + b * per_seq > blocks:
                    emit({"model": name, "context": ctx, "batch": b, "skipped": "KV does not fit"})
                    continue
                ms = decode_ms(runner, per_seq, b, ctx, reps=10)
                out["decode_ms"][f"{ctx}/{b}"] = ms
                emit({"model": name, "context": ctx, "batch": b, "decode_ms": ms})
        if v41:
            emit({"model": name, "decode": "not measured (Engram history: feed the context first)"})
        tokens = 4096
        out["prefill_tok_s"][tokens] = prefill_tok_s(runner, (tokens + 128) // 128 + 1, tokens)
        emit({"model": name, "prefill": tokens, "tok_s": out["prefill_tok_s"][tokens]})
        del runner
        gc.collect()
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="32768,131072")
    parser.add_argument("--decode-batches", default="1,64,256")
    parser.add_argument(
        "--kv-cache-dtype",
        default="f32",
        help="KV dtype of both models (f32, bf16 or fp8: V4's fp8 records, V4.1's FP8 / FP4 ones)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.decode_batches.split(",")]
    results: dict = {"device": torch.cuda.get_device_name()}

    def emit(record: dict) -> None:
        print(json.dumps(record), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))

    kv = args.kv_cache_dtype
    results["v41"] = measure("v4.1", v41_config(), contexts, batches, kv, emit)
    results["v4"] = measure("v4", v4_config(), contexts, batches, kv, emit)
    for key, ms in results["v41"]["decode_ms"].items():
        if key in results["v4"]["decode_ms"]:
            emit({"context/batch": key, "v41_over_v4_decode": ms / results["v4"]["decode_ms"][key]})
    emit(
        {
            "v41_over_v4_prefill_tok_s": results["v41"]["prefill_tok_s"][4096]
            / results["v4"]["prefill_tok_s"][4096]
        }
    )
    emit({"done": True})


if __name__ == "__main__":
    main()
