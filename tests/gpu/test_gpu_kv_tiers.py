"""KV tiers on the CUDA backend: a prompt whose blocks come back from the host tier (after the GPU
evicted them) or from the store (after an engine restart) gives the same greedy tokens as the
cold run. The host tier's blocks live in a pinned arena that the exports and imports copy to and
from directly. The imports go layer by layer on the backend's copy stream, and each layer's forward
waits for its own copies (docs/kv_store.md); this is where that path runs on a GPU.
"""

from __future__ import annotations

import random

import deepinfer_core as dc
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


def generate(engine: dc.Engine, prompt: list[int]) -> tuple[list[int], int]:
    params = dc.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    rid = engine.add_request(prompt, params)
    tokens, hit = [], 0
    while engine.has_unfinished():
        for o in engine.step():
            if o.id == rid:
                tokens += o.tokens
                hit = o.prompt_cache_hit_tokens if o.ready else hit
    engine.step()
    return tokens, hit


@pytest.mark.parametrize("kv", ["f32", "bf16", "fp8"])
def test_gpu_tier_hits_equal_the_cold_run(tmp_path, kv: str) -> None:
    path = str(ensure_tiny_checkpoint())
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 129000) for _ in range(700)] for _ in range(3)]
    options = {
        "device": "cuda",
        "kv_cache_dtype": kv,
        "max_num_seqs": 2,
        "num_kv_blocks": 9,
        "max_model_len": 1024,
    }
    cold = dc.Engine(path, enable_prefix_cache=False, **options)
    want = [generate(cold, p)[0] for p in prompts]
    tiers = {"kv_host_cache_bytes": 1 << 28, "kv_store_path": str(tmp_path / "store")}
    engine = dc.Engine(path, **options, **tiers)
    for p in prompts:  # written through; the 8-block cache keeps about one prompt
        generate(engine, p)
    engine.flush_kv_tiers()
    host = [generate(engine, p) for p in prompts]
    host_hits = engine.stats()["host_hit_tokens"]
    # The host tier's arena is page-locked on CUDA: its copies to and from the device skip the
    # staging buffer (the hits above went through it).
    assert engine.stats()["kv_host_pinned_bytes"] == tiers["kv_host_cache_bytes"]
    engine.flush_kv_tiers()
    del engine
    again = dc.Engine(path, **options, **tiers)  # a restart: the host tier is empty
    store = [generate(again, p) for p in prompts]
    stats = again.stats()
    print(
        f"KV-TIERS-GPU {kv}: host hits {[h for _, h in host]} ({host_hits} tokens), "
        f"store hits {[h for _, h in store]} ({stats['store_hit_tokens']} tokens)"
    )
    assert host_hits > 0 and stats["store_hit_tokens"] > 0
    assert [t for t, _ in host] == want
    assert [t for t, _ in store] == want
