"""The paged KV cache sized from the GPU's memory (num_kv_blocks 0, gpu_memory_utilization)."""

from __future__ import annotations

import deepinfer_core as dc
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


def test_kv_cache_is_sized_from_device_memory() -> None:
    path = str(ensure_tiny_checkpoint())
    engine = dc.Engine(path, device="cuda", max_num_seqs=4)
    k = engine.kv_capacity
    print(f"\nKV-SIZING {k}")
    assert k.sized_from_memory
    # The tiny model's weights are a few MB: 90% of an H200 holds far more than 4 sequences.
    assert k.max_seqs_at_max_model_len > 100
    assert engine.config.cache.num_kv_blocks == k.num_blocks + 1
    engine.add_request([0, 5, 6, 7], dc.SamplingParams(max_tokens=3, ignore_eos=True))
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.tokens
    assert len(tokens) == 3
    with pytest.raises(OSError, match="not enough device memory for the KV cache"):
        dc.Engine(path, device="cuda", gpu_memory_utilization=0.001)
