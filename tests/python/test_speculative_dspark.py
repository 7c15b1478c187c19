"""Speculative decoding with DeepSeek-V4.1's DSpark drafter through the engine (speculative_method
"mtp" on a V4.1 checkpoint with mtp.* tensors; CPU, f32 KV): greedy outputs are identical to
decoding without drafts, the drafts the engine proposes are ModelRunner.dspark_draft's over the
same committed tokens (itself checked against the torch reference in test_dspark.py), and the
confidence budget's per-draft estimates are the confidence head's values.

As in test_speculative_mtp.py, a recording constraint sees every verify row's drafts (the engine
accepts them into the constraint to mask each row, then rolls them back).
"""

from __future__ import annotations

import json
import random

import dspark_reference as dref
import numpy as np
import pytest
from engine_helpers import assert_pools_full, cpu_engine, run_all
from runner_driver import RunnerDriver
from test_speculative_mtp import Recorder, greedy

dc = pytest.importorskip("deepinfer_core")

NAME = "A"  # 3 DSpark blocks, block size 4


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return dref.write_checkpoint(dref.make_model(NAME), tmp_path_factory.mktemp("dspark"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(5)
    vocab = dref.TINY_DSPARK_CONFIGS[NAME].vocab_size
    return [[rng.randrange(0, vocab) for _ in range(n)] for n in (4, 37, 130, 9)]


@pytest.fixture(scope="module")
def plain(checkpoint, prompts) -> list[list[int]]:
    engine = cpu_engine(checkpoint, max_num_seqs=4)
    skipped = "mtp.* tensors (the DSpark drafter was not requested)"
    assert any(skipped in note for note in engine.load_notes)
    return run_all(engine, prompts, greedy())[0]


def dspark_engine(checkpoint, k: int, **options) -> dc.Engine:
    return cpu_engine(
        checkpoint, num_speculative_tokens=k, speculative_method="mtp", max_num_seqs=4, **options
    )


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_outputs_identical_with_dspark_drafts(checkpoint, prompts, plain, k) -> None:
    engine = dspark_engine(checkpoint, k)
    assert not engine.config.scheduler.zero_overhead  # as for the V4 MTP drafter
    assert run_all(engine, prompts, greedy())[0] == plain
    s = engine.stats()
    assert s["draft_tokens"] > 0 and s["verify_rows"] > 0
    assert s["drafts_at_position"][k - 1] > 0
    assert_pools_full(engine)


def runner_drafts(checkpoint, recorders: list[Recorder], k: int) -> list[float]:
    """Checks each verify row's drafts against dspark_draft over the committed tokens; returns
    each verified draft's estimate, the product of the confidences up to it."""
    driver = RunnerDriver(str(checkpoint), max_seqs=1, max_len=512)
    estimates = []
    for rec in recorders:
        for context, drafts in rec.drafts:
            # The engine's main caches hold context[:-1]; context[-1] is the golden token.
            n = len(context)
            driver.runner.forward([driver.chunk(0, 0, context[:-1])])
            tokens, confs, _ = driver.runner.dspark_draft([driver.chunk(0, n - 1, context[-1:])])
            assert 1 <= len(drafts) <= k
            assert drafts == tokens[0, : len(drafts)].tolist(), f"drafts after {n} tokens"
            a = 1.0
            for j in range(len(drafts)):
                a *= float(confs[0, j])
                estimates.append(a)
    assert estimates
    return estimates


@pytest.mark.parametrize("budget", ["fixed", "confidence"])
def test_drafts_and_estimates_are_the_drafters(checkpoint, prompts, plain, budget) -> None:
    """Chunked prefill (64-token chunks): each verify row's drafts are dspark_draft's over the
    committed tokens, and each verified draft's acceptance estimate (what the confidence budget
    ranks drafts by) is the product of the confidences up to it: the engine's calibration bins
    hold exactly these."""
    k = 3
    engine = dspark_engine(checkpoint, k, max_num_batched_tokens=64, speculative_budget=budget)
    recorders = [Recorder(p) for p in prompts]
    outs = run_all(engine, prompts, [greedy(12, r) for r in recorders])[0]
    assert outs == plain
    estimates = runner_drafts(checkpoint, recorders, k)
    s = engine.stats()
    assert len(estimates) == s["draft_tokens"] > 0
    bins = np.minimum((np.array(estimates) * 10).astype(int), 9)
    assert s["spec_calibration_drafts"] == np.bincount(bins, minlength=10).tolist()
    sums = np.bincount(bins, weights=estimates, minlength=10)
    assert s["spec_calibration_estimate_sum"] == pytest.approx(sums.tolist(), rel=1e-5, abs=1e-9)
    assert_pools_full(engine)


def test_dspark_drafts_with_prefix_hits(checkpoint, prompts) -> None:
    """A prefix hit restores the DSpark rings (main keys) from the snapshot with the main ones."""
    vocab = dref.TINY_DSPARK_CONFIGS[NAME].vocab_size
    shared = (prompts[2] * 3)[:256]
    variants = [shared + [11, 12], shared + [21, 22, 23]]
    cold = run_all(cpu_engine(checkpoint, max_num_seqs=4), variants, greedy())[0]
    engine = dspark_engine(checkpoint, 2)
    run_all(engine, [shared + [vocab - 1]], greedy(2))
    recorders = [Recorder(p) for p in variants]
    outs, trace = run_all(engine, variants, [greedy(12, r) for r in recorders])
    assert outs == cold
    hits = [trace.ready(rid).prompt_cache_hit_tokens for rid in sorted(trace.outputs)]
    assert hits == [256, 256], hits
    runner_drafts(checkpoint, recorders, 2)
    assert_pools_full(engine)


def test_dspark_drafts_with_preemption_recompute(checkpoint) -> None:
    """A recomputed request writes its prompt's main keys again: its drafts stay exact."""
    rng = random.Random(6)
    vocab = dref.TINY_DSPARK_CONFIGS[NAME].vocab_size
    prompts = [[rng.randrange(0, vocab) for _ in range(rng.randrange(100, 126))] for _ in range(6)]
    roomy = run_all(cpu_engine(checkpoint), prompts, greedy(24))[0]
    tight = dspark_engine(checkpoint, 3, num_kv_blocks=6)
    recorders = [Recorder(p) for p in prompts]
    outs = run_all(tight, prompts, [greedy(24, r) for r in recorders])[0]
    assert outs == roomy
    assert tight.stats()["num_preemptions"] > 0
    runner_drafts(checkpoint, recorders[:2], 3)
    assert_pools_full(tight)


def test_an_engine_not_drafting_keeps_no_dspark_state(checkpoint) -> None:
    plain_slot = cpu_engine(checkpoint, max_num_seqs=2).kv_capacity.bytes_per_state_slot
    drafting_slot = dspark_engine(checkpoint, 2).kv_capacity.bytes_per_state_slot
    assert plain_slot < drafting_slot, (plain_slot, drafting_slot)


def test_dspark_needs_mtp_tensors(prompts, tmp_path) -> None:
    path = dref.write_checkpoint(dref.make_model(NAME), tmp_path / "ckpt", with_mtp=False)
    with pytest.raises(ValueError, match=r"'speculative_method' is \"mtp\".*no MTP block"):
        dspark_engine(path, 2)


def test_dummy_weights_draft_with_dspark(prompts, tmp_path) -> None:
    """load_format dummy makes random DSpark weights too when the engine drafts with them (for
    benchmarks at real widths); the target's random weights do not depend on it."""
    cfg = dref.TINY_DSPARK_CONFIGS[NAME]
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_config()))
    plain_engine = cpu_engine(tmp_path, load_format="dummy", seed=3, max_num_seqs=4)
    want = run_all(plain_engine, prompts, greedy())[0]
    engine = dspark_engine(tmp_path, 3, load_format="dummy", seed=3)
    assert run_all(engine, prompts, greedy())[0] == want
    assert engine.stats()["draft_tokens"] > 0
    assert_pools_full(engine)


def test_dspark_drafts_next_to_decode_graphs(checkpoint, prompts, plain) -> None:
    """With decode graphs on (the CPU backend re-issues the recorded calls), a step replayed
    from a recording writes the main keys the next drafts read: those drafts are still
    dspark_draft's over the committed tokens (an eager runner), and greedy outputs equal the
    plain run. (Stale device pointers in a recording can only show on CUDA:
    tests/gpu/test_gpu_dspark.py.)"""
    engine = dspark_engine(checkpoint, 2, decode_graph_max_batch=4)
    recorders = [Recorder(p) for p in prompts]
    assert run_all(engine, prompts, [greedy(12, r) for r in recorders])[0] == plain
    assert engine.stats()["num_graph_steps"] >= 1
    runner_drafts(checkpoint, recorders, 2)
    assert_pools_full(engine)


def test_dspark_block_longer_than_the_ring_slack_is_refused_at_startup(tmp_path) -> None:
    """A DSpark block needs dspark_block_size ring positions past the window; the caches keep 6.
    An engine that would draft with a longer block is refused when it is created, not at its
    first drafting step."""
    path = dref.write_checkpoint(dref.make_model(NAME), tmp_path / "ckpt")
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config", config)
    text["dspark_block_size"] = 7
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'speculative_method'.*dspark_block_size = 7"):
        dspark_engine(path, 2)
    cpu_engine(path, max_num_seqs=1)  # not drafting: the block size does not matter
