"""Data-parallel attention with expert-parallel MoE on the CUDA backend (docs/parallel.md).

One GPU can show the whole group: with device "cuda:0" every rank shares it and the collectives
go through host memory (dist/host_staged_communicator.h). The group's greedy tokens equal one
rank's on the same GPU (the ranks run the same kernels; an expert's output for a token does not
depend on which rank computes it), and its top-5 logprobs agree within 1e-3 relative: an
expert's rows are a different GEMM on each side (a rank's received rows against all of one
rank's), and the GPU's f32 GEMMs choose their tiling and K-split by the row count, so they round
differently (measured on the H200: 5.7e-6 on tiny, 1.6e-4 on f2).
Figures are printed ("PARALLEL-GPU ...").
"""

from __future__ import annotations

import random

import deepinfer_core as dc
import pytest
import v4_reference as ref
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


def run(path: str, prompts, **options):
    engine = dc.Engine(path, device="cuda:0", max_num_seqs=8, **options)
    params = dc.SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
    ids = [engine.add_request(p, params) for p in prompts]
    tokens = {i: [] for i in ids}
    lps = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.id] += list(o.tokens)
            lps[o.id] += list(o.logprobs)
    engine.step()
    stats = engine.stats()
    assert stats["num_blocks_free"] == stats["num_blocks_total"]
    return [tokens[i] for i in ids], [lps[i] for i in ids], stats


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("name", ["tiny", "f2"])
def test_gpu_group_on_one_gpu_equals_one_rank(name: str, ranks: int, tmp_path) -> None:
    if name == "tiny":
        path, vocab = str(ensure_tiny_checkpoint()), 129000
    else:
        path = str(ref.save(ref.make_model(ref.F2_CONFIG, 0), tmp_path / "f2"))
        vocab = ref.F2_CONFIG["vocab_size"]
    rng = random.Random(3)
    prompts = [[rng.randrange(2, vocab) for _ in range(n)] for n in (3, 17, 64, 129, 90)]
    want, want_lps, _ = run(path, prompts, gpu_memory_utilization=0.2)
    got, got_lps, stats = run(
        path,
        prompts,
        data_parallel_size=ranks,
        expert_parallel_size=ranks,
        gpu_memory_utilization=0.2,
    )
    worst = 0.0
    for a, b in zip(got_lps, want_lps, strict=True):
        for (_, top_a), (_, top_b) in zip(a, b, strict=False):
            for (_, x), (_, y) in zip(top_a, top_b, strict=False):
                worst = max(worst, abs(x - y) / max(abs(y), 1.0))
    print(
        f"PARALLEL-GPU {name} ranks={ranks}: tokens equal {got == want}, "
        f"max rel logprob diff {worst:.2e}, group steps {stats['dp_group_steps']}, "
        f"idle passes {stats['dp_idle_passes']}"
    )
    assert got == want
    assert worst <= 1e-3


def test_gpu_rank_processes_on_one_gpu() -> None:
    """data_parallel_backend "processes" on "cuda:0": rank 1 is a child process on the same GPU,
    the ranks joined over TCP (device tensors staged through the host)."""
    from deepinfer.llm import load_engine

    path = str(ensure_tiny_checkpoint())
    rng = random.Random(5)
    prompts = [[rng.randrange(2, 129000) for _ in range(n)] for n in (3, 40, 90)]
    want, _, _ = run(path, prompts, gpu_memory_utilization=0.2)
    config = dc.EngineConfig(
        model_path=path,
        device="cuda:0",
        max_num_seqs=8,
        num_kv_blocks=512,  # processes sharing a GPU would size it from free memory concurrently
        data_parallel_size=2,
        expert_parallel_size=2,
        data_parallel_backend="processes",
    )
    engine = load_engine(config)
    params = dc.SamplingParams(temperature=0.0, max_tokens=16, logprobs=5)
    ids = [engine.add_request(p, params) for p in prompts]
    tokens = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.id] += list(o.tokens)
    got = [tokens[i] for i in ids]
    print(f"PARALLEL-GPU processes on cuda:0: tokens equal {got == want}")
    assert got == want
