"""Speculative verify steps replayed from decode graphs on the CUDA backend
(cpp/src/model/decode_graphs.h): ModelRunner steps of verify rows mixed with plain rows match the
eager calls (a replay pads the call to more token rows, so kernels may split their sums
differently: close, and the same argmax), and an engine verifying drafts (an oracle drafter, with
and without zero-overhead scheduling) replays every verify step from a graph and gives the plain
engine's greedy tokens, as the eager verify path does."""

from __future__ import annotations

import random

import deepinfer_core as dc
import numpy as np
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint
from test_decode_graphs import make_driver, verify_trace
from test_gpu_speculative import Oracle, run

pytestmark = pytest.mark.gpu
REL_TOL = 1e-4


def test_gpu_verify_steps_replay_graphs_and_match_eager() -> None:
    path = ensure_tiny_checkpoint()
    rng = random.Random(11)
    prompts = [[rng.randrange(2, 129000) for _ in range(n)] for n in (126, 127, 3, 64, 250)]
    eager_driver = make_driver(path, 0, device="cuda")
    graph_driver = make_driver(path, 5, device="cuda")
    eager = verify_trace(eager_driver, prompts, steps=16)
    graphs = verify_trace(graph_driver, prompts, steps=16)
    stats = graph_driver.runner.decode_graph_stats()
    verify_steps = sum(1 for i, e in enumerate(eager) if e.shape[0] > 1 + i % len(prompts))
    print(f"\nVERIFY-GRAPHS-GPU runner {stats} verify steps {verify_steps}")
    assert stats["num_calls"] == 16
    assert stats["num_verify_calls"] == verify_steps >= 4
    for i, (g, e) in enumerate(zip(graphs, eager, strict=True)):
        scale = float(np.abs(e).max())
        err = float(np.abs(g - e).max())
        assert err <= REL_TOL * scale, f"step {i}: max abs diff {err:.3e} vs scale {scale:.3e}"
        np.testing.assert_array_equal(g.argmax(axis=-1), e.argmax(axis=-1))


@pytest.mark.parametrize("zero_overhead", [True, False], ids=["zos", "sync"])
def test_gpu_engine_verify_steps_replay_graphs(zero_overhead: bool) -> None:
    path = str(ensure_tiny_checkpoint())
    rng = random.Random(9)
    prompts = [[rng.randrange(2, 129000) for _ in range(n)] for n in (5, 40, 130, 260, 17, 90)]
    params = dc.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    # Every prompt prefills in the first step, so no later step mixes a prefill row in. A fixed
    # KV cache (each sequence needs at most 3 blocks of 128 tokens) keeps the engines small.
    # (Sized from memory, each takes ~90% of the device; `engine = dc.Engine(...)` in the loop
    # below would then build the next engine while the name still holds the last one, which is
    # why the loop drops it: on the H200 that once failed the second engine's start.)
    common = {
        "device": "cuda",
        "max_num_seqs": 8,
        "max_num_batched_tokens": 1024,
        "num_kv_blocks": 64,
    }
    plain = run(dc.Engine(path, **common), prompts, params)
    outputs, stats = {}, {}
    for graphs in (0, -1):
        engine = dc.Engine(
            path,
            **common,
            num_speculative_tokens=4,
            speculative_method="external",
            zero_overhead=zero_overhead,
            speculative_zero_overhead=zero_overhead,
            decode_graph_max_batch=graphs,
        )
        engine.set_drafter(Oracle(prompts, plain))
        outputs[graphs] = run(engine, prompts, params)
        stats[graphs] = engine.stats()
        del engine
    total = sum(len(x) for x in plain)

    def agreement(a, b) -> int:
        return sum(x == y for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))

    s = stats[-1]
    print(
        f"\nVERIFY-GRAPHS-GPU zero_overhead={zero_overhead} graph spec vs plain "
        f"{agreement(outputs[-1], plain)}/{total}, vs eager spec "
        f"{agreement(outputs[-1], outputs[0])}/{total}; verify steps {s['verify_steps']} "
        f"replayed {s['num_graph_verify_steps']} graph steps {s['num_graph_steps']} "
        f"steps {s['num_steps']}; eager spec verify steps {stats[0]['verify_steps']}"
    )
    assert stats[0]["num_graph_steps"] == 0
    assert s["verify_steps"] > 0
    assert s["num_graph_verify_steps"] == s["verify_steps"]
    assert s["accepted_draft_tokens"] > 0.8 * s["draft_tokens"]
    # As the eager verify path (test_gpu_speculative): a verify row's sums may be split
    # differently from a decode row's, so near-ties can flip; both must agree as well.
    assert agreement(outputs[-1], plain) >= 0.97 * total
    assert agreement(outputs[-1], plain) >= agreement(outputs[0], plain) - 0.02 * total
