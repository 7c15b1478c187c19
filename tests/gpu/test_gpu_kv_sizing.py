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


@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
def test_a_destroyed_engine_gives_its_memory_back(zero_overhead: bool) -> None:
    """Engines sized from memory one after another in one process: each takes ~90% of the
    device, so the next one starts only if the last one's KV cache went back when it was
    dropped (no garbage collection asked for). (A GPU test once saw an engine fail to start with
    the previous engine's memory in use: it built the new engine with `engine = dc.Engine(...)`
    while `engine` still held the old one, test_gpu_verify_graphs.py.)"""
    path = str(ensure_tiny_checkpoint())
    params = dc.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for _ in range(3):
        engine = dc.Engine(
            path,
            device="cuda",
            max_num_seqs=8,
            max_num_batched_tokens=1024,
            zero_overhead=zero_overhead,
        )
        assert engine.kv_capacity.sized_from_memory
        for prompt in ([5, 6, 7], list(range(2, 300))):
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
        engine.step()
        del engine
