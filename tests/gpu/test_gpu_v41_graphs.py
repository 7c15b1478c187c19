"""DeepSeek-V4.1 decode steps replayed from CUDA graphs (cpp/src/model/decode_graphs.h) against the
eager CUDA engine: tiny config A (every layer role, Engram), greedy, through the engine with
decode_graph_max_batch auto (-1: graphs up to max_num_seqs = 8 rows, buckets 1, 2, 4, 8) and 0
(eager), zero-overhead scheduling on and off. Requests of different lengths finish apart, so the
decode batches shrink from 6 (bucket 8) through 3 (bucket 4) to 1; a second round hits the prefix
cache. Tokens must be identical and
logprobs (the sampled token's and the top-k) within 1e-6; the graph engine must have replayed
decode steps, the eager one none."""

from __future__ import annotations

import numpy as np
import pytest
import v41_reference as ref
from engine_helpers import run_all
from test_v41_parity import write_checkpoint

dc = pytest.importorskip("deepinfer_core")

pytestmark = pytest.mark.gpu
NAME = "A"
LOGPROB_TOL = 1e-6
MAX_TOKENS = (14, 11, 9, 7, 4, 2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    model = ref.V41Model(ref.TINY_CONFIGS[NAME], seed=0)
    return str(write_checkpoint(model, tmp_path_factory.mktemp("v41_graphs")))


def params(n: int) -> dc.SamplingParams:
    return dc.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=3)


def logprobs_of(trace, rid: int) -> list[tuple[float, list]]:
    return [lp for o in trace.outputs[rid] for lp in o.logprobs]


def run(checkpoint: str, graphs: int, zero_overhead: bool) -> dict:
    # Activations unquantized as the other tiny V4.1 GPU tests; KV "auto" (fp8 on CUDA: V4.1's
    # FP8 / FP4 records, FP4 index keys included, replayed from the graphs as run eagerly); a few
    # blocks, so the eager and the graph engine do not each size the KV cache to the whole GPU.
    engine = dc.Engine(
        checkpoint,
        device="cuda",
        activation_quant="none",
        num_kv_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        zero_overhead=zero_overhead,
        decode_graph_max_batch=graphs,
    )
    vocab = ref.TINY_CONFIGS[NAME].vocab_size
    lengths = (37, 21, 50, 9, 140, 3)
    batch = [ref.random_tokens(n, vocab, 300 + i) for i, n in enumerate(lengths)]
    outs, trace = run_all(engine, batch, [params(n) for n in MAX_TOKENS])
    lps = [logprobs_of(trace, rid) for rid in sorted(trace.outputs)]
    # A prefix-cache hit: 300 tokens whose first 256 an earlier prompt left cached (blocks and
    # the state snapshot); the warm decode's n-grams come from the hit's history.
    shared = ref.random_tokens(300, vocab, 7)
    run_all(engine, [shared[:270] + [17]], params(2))
    warm, warm_trace = run_all(engine, [shared], params(8))
    (warm_id,) = list(warm_trace.outputs)
    hit = warm_trace.ready(warm_id).prompt_cache_hit_tokens
    return {
        "tokens": outs + warm,
        "logprobs": lps + [logprobs_of(warm_trace, warm_id)],
        "hit": hit,
        "graph_steps": engine.stats()["num_graph_steps"],
    }


def assert_logprobs_close(ours: list, want: list, what: str) -> None:
    assert len(ours) == len(want), what
    for i, ((lp, top), (want_lp, want_top)) in enumerate(zip(ours, want, strict=True)):
        assert abs(lp - want_lp) <= LOGPROB_TOL, f"{what} token {i}: {lp} vs {want_lp}"
        assert [t for t, _ in top] == [t for t, _ in want_top], f"{what} token {i}: top-k ids"
        got = np.array([v for _, v in top])
        ref_top = np.array([v for _, v in want_top])
        err = float(np.abs(got - ref_top).max()) if got.size else 0.0
        assert err <= LOGPROB_TOL, f"{what} token {i}: top-k logprobs differ by {err:.2e}"


@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
def test_gpu_v41_decode_graphs_match_eager(checkpoint: str, zero_overhead: bool) -> None:
    eager = run(checkpoint, 0, zero_overhead)
    graphs = run(checkpoint, -1, zero_overhead)
    assert eager["graph_steps"] == 0
    assert graphs["graph_steps"] > 0, "no V4.1 decode step replayed a CUDA graph"
    assert eager["hit"] == graphs["hit"] == 256
    assert graphs["tokens"] == eager["tokens"]
    worst = 0.0
    for i, (ours, want) in enumerate(zip(graphs["logprobs"], eager["logprobs"], strict=True)):
        assert_logprobs_close(ours, want, f"request {i}")
        if ours:
            worst = max(worst, max(abs(a[0] - b[0]) for a, b in zip(ours, want, strict=True)))
    print(
        f"\nV4.1 decode graphs ({'zos' if zero_overhead else 'sync'}): "
        f"{graphs['graph_steps']} graph steps, max |logprob diff| {worst:.2e}"
    )
