"""Prefix cache on the real tiny model: hits are reported per request, full 128-token blocks only,
never the whole prompt, and a hit resumes from the state snapshot with the same logits as a cold
run (compared through the top-20 log-probabilities of every generated token)."""

from __future__ import annotations

import random

import deepinfer_core as dc
import pytest
from engine_helpers import KV_DTYPES, cpu_engine, run_all


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 129000) for _ in range(n)]


def test_prefix_resend_1000_token_prompt(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint)
    p = prompt(1000, 1)
    params = dc.SamplingParams(temperature=0.0, max_tokens=8)
    first, t1 = run_all(engine, [p], params)
    second, t2 = run_all(engine, [p], params)
    assert t1.ready(next(iter(t1.outputs))).prompt_cache_hit_tokens == 0
    hit = t2.ready(next(iter(t2.outputs))).prompt_cache_hit_tokens
    assert hit >= 896, hit
    assert second == first
    assert engine.stats()["prompt_tokens_cached"] >= 896


def test_prefix_differs_at_token_0_reports_no_hit(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint)
    p = prompt(1000, 2)
    params = dc.SamplingParams(temperature=0.0, max_tokens=4)
    run_all(engine, [p], params)
    q = [p[0] + 1, *p[1:]]
    _, trace = run_all(engine, [q], params)
    assert trace.ready(next(iter(trace.outputs))).prompt_cache_hit_tokens == 0


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_prefix_hit_gives_the_same_logits_as_a_cold_run(tiny_checkpoint, kv_cache_dtype) -> None:
    # Within one KV dtype a hit is bit-identical to a cold run: the snapshot holds the same
    # records the cold run's ring holds, and attention reads this chunk's keys through the format.
    p = prompt(700, 3)
    params = dc.SamplingParams(temperature=0.0, max_tokens=6, logprobs=20)
    kv = {"kv_cache_dtype": kv_cache_dtype}
    cold_engine = cpu_engine(tiny_checkpoint, enable_prefix_cache=False, **kv)
    _, cold = run_all(cold_engine, [p], params)
    warm_engine = cpu_engine(tiny_checkpoint, **kv)
    run_all(warm_engine, [p[:650] + [17]], params)  # caches 5 blocks and the snapshot at 640
    _, warm = run_all(warm_engine, [p], params)
    (cold_id,), (warm_id,) = list(cold.outputs), list(warm.outputs)
    assert warm.ready(warm_id).prompt_cache_hit_tokens == 640
    cold_lp = [lp for o in cold.outputs[cold_id] for lp in o.logprobs]
    warm_lp = [lp for o in warm.outputs[warm_id] for lp in o.logprobs]
    assert len(cold_lp) == 6 and len(cold_lp[0][1]) == 20
    assert warm_lp == cold_lp


def test_prefix_partial_block_is_never_shared(tiny_checkpoint) -> None:
    engine = cpu_engine(tiny_checkpoint)
    p = prompt(200, 4)
    params = dc.SamplingParams(temperature=0.0, max_tokens=2)
    run_all(engine, [p], params)
    _, trace = run_all(engine, [p[:127] + [3, 4]], params)  # shares 127 tokens: no full block
    assert trace.ready(next(iter(trace.outputs))).prompt_cache_hit_tokens == 0
