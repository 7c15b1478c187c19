"""Equivalence on the real tiny model: a request's greedy tokens do not depend on what it is
batched with, on zero-overhead scheduling, on prefill chunking, on prefix-cache hits or on
preemption-recompute; seeded sampling does not depend on batch composition.

The CPU backend computes every row independently and in a fixed order, so these hold bitwise.
"""

from __future__ import annotations

import random

import deepinfer_core as dc
import pytest
from engine_helpers import KV_DTYPES, cpu_engine, run_all

GREEDY = dc.SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(3)
    lengths = [3, 17, 64, 127, 128, 129, 200, 256, 300, 380, 420, 500, 600, 700, 150, 90]
    return [[rng.randrange(2, 129000) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def batched(tiny_checkpoint, prompts) -> list[list[int]]:
    return run_all(cpu_engine(tiny_checkpoint, max_num_seqs=16), prompts, GREEDY)[0]


def test_equivalence_alone_vs_batch_of_16(tiny_checkpoint, prompts, batched) -> None:
    assert len({tuple(t) for t in batched}) == len(batched), "prompts should give distinct outputs"
    for i in (0, 5, 11):
        alone = run_all(cpu_engine(tiny_checkpoint), [prompts[i]], GREEDY)[0][0]
        assert alone == batched[i], f"prompt {i} alone differs from the batch"


def test_equivalence_zero_overhead_on_off(tiny_checkpoint, prompts, batched) -> None:
    off = run_all(
        cpu_engine(tiny_checkpoint, max_num_seqs=16, zero_overhead=False), prompts, GREEDY
    )[0]
    assert off == batched


def test_equivalence_chunked_vs_unchunked_prefill(tiny_checkpoint, prompts, batched) -> None:
    chunked = run_all(
        cpu_engine(tiny_checkpoint, max_num_seqs=16, max_num_batched_tokens=48), prompts, GREEDY
    )[0]
    whole = run_all(
        cpu_engine(
            tiny_checkpoint,
            max_num_seqs=16,
            max_num_batched_tokens=4096,
            enable_chunked_prefill=False,
        ),
        prompts,
        GREEDY,
    )[0]
    assert chunked == batched and whole == batched


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_equivalence_prefix_hit_vs_cold(tiny_checkpoint, prompts, kv_cache_dtype) -> None:
    shared = prompts[13][:600]
    variants = [shared + [11, 12, 13], shared + [21, 22], shared[:300] + [5]]
    kv = {"kv_cache_dtype": kv_cache_dtype}
    cold = [run_all(cpu_engine(tiny_checkpoint, **kv), [p], GREEDY)[0][0] for p in variants]
    warm_engine = cpu_engine(tiny_checkpoint, **kv)
    run_all(warm_engine, [shared + [99]], GREEDY)
    warm, trace = run_all(warm_engine, variants, GREEDY)
    hits = [trace.ready(rid).prompt_cache_hit_tokens for rid in sorted(trace.outputs)]
    assert hits[0] == 512 and hits[1] == 512, hits  # 600 shared tokens: 4 full blocks restore
    assert warm == cold


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_equivalence_with_and_without_preemption_recompute(tiny_checkpoint, kv_cache_dtype) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(2, 129000) for _ in range(rng.randrange(100, 126))] for _ in range(8)]
    params = dc.SamplingParams(temperature=0.0, max_tokens=30)
    kv = {"kv_cache_dtype": kv_cache_dtype}
    roomy = run_all(cpu_engine(tiny_checkpoint, **kv), prompts, params)[0]
    tight_engine = cpu_engine(tiny_checkpoint, num_kv_blocks=7, **kv)
    tight = run_all(tight_engine, prompts, params)[0]
    assert tight_engine.stats()["num_preemptions"] > 0
    assert tight == roomy


def test_equivalence_seeded_sampling_across_batch_compositions(tiny_checkpoint, prompts) -> None:
    params = dc.SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_tokens=24, seed=1234)
    together = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=16), prompts, params)[0]
    subset = [prompts[i] for i in (9, 2, 14)]
    apart = run_all(
        cpu_engine(tiny_checkpoint, max_num_seqs=2, max_num_batched_tokens=64), subset, params
    )[0]
    assert apart == [together[i] for i in (9, 2, 14)]
    greedy = run_all(cpu_engine(tiny_checkpoint), [prompts[9]], GREEDY)[0][0]
    assert together[9] != greedy, "temperature 0.9 should not reproduce the greedy tokens"


@pytest.mark.parametrize("zero_overhead", [True, False])
def test_equivalence_decode_graphs_on_off(tiny_checkpoint, prompts, batched, zero_overhead) -> None:
    # 16 prompts with a graph limit of 6: decode batches of up to 6 replay recorded graphs (with
    # tokens carried on the device under zero-overhead scheduling), larger ones run eagerly.
    graph_engine = cpu_engine(
        tiny_checkpoint, max_num_seqs=16, zero_overhead=zero_overhead, decode_graph_max_batch=6
    )
    graphs = run_all(graph_engine, prompts, GREEDY)[0]
    stats = graph_engine.stats()
    assert 0 < stats["num_graph_steps"] < stats["num_steps"] - stats["num_prefill_steps"]
    assert graphs == batched
    seeded = dc.SamplingParams(temperature=0.9, top_k=50, max_tokens=24, seed=77)
    subset = prompts[:6]
    eager_engine = cpu_engine(tiny_checkpoint, decode_graph_max_batch=0)
    eager = run_all(eager_engine, subset, seeded)[0]
    assert eager_engine.stats()["num_graph_steps"] == 0
    replayed = run_all(cpu_engine(tiny_checkpoint, decode_graph_max_batch=8), subset, seeded)[0]
    assert replayed == eager


@pytest.mark.parametrize("kv_cache_dtype", [d for d in KV_DTYPES if d != "f32"])
def test_equivalence_quantized_kv_cache(tiny_checkpoint, prompts, batched, kv_cache_dtype) -> None:
    # With a bf16 / fp8 KV cache the tokens still do not depend on batching, zero-overhead
    # scheduling, prefill chunking or decode graphs: every row is quantized the same way wherever
    # it is written or read. (Prefix hits: test_equivalence_prefix_hit_vs_cold.)
    picks = (0, 2, 5, 8, 11, 13)  # 3 to 600 tokens
    subset = [prompts[i] for i in picks]
    kv = {"kv_cache_dtype": kv_cache_dtype}
    together = run_all(cpu_engine(tiny_checkpoint, max_num_seqs=6, **kv), subset, GREEDY)[0]
    for i in (1, 4):
        alone = run_all(cpu_engine(tiny_checkpoint, **kv), [subset[i]], GREEDY)[0][0]
        assert alone == together[i], f"prompt {picks[i]} alone differs from the batch"
    variants = {
        "zero_overhead off": dict(zero_overhead=False),
        "chunks of 48": dict(max_num_batched_tokens=48),
        "decode graphs": dict(decode_graph_max_batch=4),
    }
    for name, options in variants.items():
        engine = cpu_engine(tiny_checkpoint, max_num_seqs=6, **kv, **options)
        assert run_all(engine, subset, GREEDY)[0] == together, name
    # Reported, not held: how the quantized cache moves logits is test_kv_cache_dtypes' job.
    f32 = [batched[i] for i in picks]
    same = sum(
        a == b for x, y in zip(together, f32, strict=True) for a, b in zip(x, y, strict=False)
    )
    total = sum(len(x) for x in f32)
    print(f"{kv_cache_dtype}: {same}/{total} greedy tokens equal to the f32 KV cache's")
