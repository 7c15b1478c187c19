"""The GPU model benchmark's bytes roofline counts KV in the cache format the model runs with
(benchmarks/gpu_quant_bench.py): its row sizes must be the engine's. Checked against the paged
KV bytes per block (and per token, rounded up) an engine reports, for every kv_cache_dtype, on the
CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import deepinfer_core as dc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_quant_bench import kv_entry_bytes

BLOCK = 128


@pytest.mark.parametrize("kv_cache_dtype", ["f32", "bf16", "fp8"])
def test_kv_entry_bytes_are_the_engines(tiny_checkpoint, kv_cache_dtype: str) -> None:
    engine = dc.Engine(
        str(tiny_checkpoint),
        device="cpu",
        max_num_seqs=1,
        max_model_len=256,
        kv_cache_dtype=kv_cache_dtype,
    )
    model = engine.model_config
    raw = json.loads((Path(tiny_checkpoint) / "config.json").read_text())
    main = kv_entry_bytes(kv_cache_dtype, model.head_dim, model.rope_head_dim)
    index = kv_entry_bytes(kv_cache_dtype, raw["index_head_dim"], 0)
    # A paged block holds block / ratio entries of every compressed layer, and as many index keys
    # in a CSA layer; the sliding window lives in the state slots.
    expected = 0
    for kind in model.layer_types:
        if kind == "compressed_sparse_attention":
            expected += BLOCK // model.csa_compress_rate * (main + index)
        elif kind == "heavily_compressed_attention":
            expected += BLOCK // model.hca_compress_rate * main
    assert expected > 0, "the tiny checkpoint has compressed layers"
    k = engine.kv_capacity
    assert k.bytes_per_block == expected
    assert k.bytes_per_token == -(-expected // BLOCK)  # rounded up: an estimate never falls short
