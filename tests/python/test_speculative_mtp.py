"""Speculative decoding with the checkpoint's MTP block (speculative_method "mtp") on the tiny
model with an MTP block (CPU): greedy outputs are identical to decoding without drafts, with
chunked prefill, prefix-cache hits, preemption and aborts, and nothing leaks.

With random tiny weights the block's drafts are almost never accepted, so acceptance cannot show
that the engine feeds the block the right trunk rows, tokens and caches. A recording constraint
does: the engine accepts a verify row's drafts into the request's constraint to mask each row,
so every draft the engine proposed is seen there, and each must equal ModelRunner.mtp_draft over
the same committed tokens (the main trunk from forward_hidden, the block run over every position
from 0). CPU rows are computed independently and in a fixed order, so they match bit for bit.
"""

from __future__ import annotations

import random

import deepinfer_core as dc
import numpy as np
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint
from engine_helpers import Trace, assert_pools_full, cpu_engine, drain, run_all
from runner_driver import RunnerDriver


@pytest.fixture(scope="module")
def mtp_checkpoint(tiny_checkpoint):
    return ensure_tiny_checkpoint(tiny_checkpoint.parent, mtp=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(21)
    return [[rng.randrange(2, 129000) for _ in range(n)] for n in (4, 37, 130, 260, 9, 70, 1)]


def greedy(n: int = 12, constraint=None) -> dc.SamplingParams:
    return dc.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, constraint=constraint)


@pytest.fixture(scope="module")
def plain(mtp_checkpoint, prompts) -> list[list[int]]:
    return run_all(cpu_engine(mtp_checkpoint, max_num_seqs=8), prompts, greedy())[0]


def mtp_engine(checkpoint, k: int, **options) -> dc.Engine:
    return cpu_engine(checkpoint, num_speculative_tokens=k, speculative_method="mtp", **options)


class Recorder(dc.TokenConstraint):
    """Allows every token and records what the engine accepts: a verify row's drafts are accepted
    and then rolled back, committed tokens are accepted for good."""

    def __init__(self, prompt: list[int]) -> None:
        super().__init__()
        self.committed = list(prompt)
        self.pending: list[int] = []
        self.drafts: list[tuple[list[int], list[int]]] = []  # (committed tokens, drafts)

    def fill_allowed(self, mask) -> None:
        mask[:] = 0xFFFFFFFF

    def accept(self, token: int) -> bool:
        self.pending.append(token)
        return True

    def is_terminated(self) -> bool:
        return False

    def can_rollback(self) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        # The row's drafts were accepted on top of everything committed so far.
        context = self.committed + self.pending[:-num_tokens]
        self.drafts.append((context, self.pending[-num_tokens:]))
        del self.pending[len(self.pending) - num_tokens :]
        self.committed += self.pending
        self.pending.clear()


def assert_drafts_match_the_runner(checkpoint, recorders: list[Recorder], k: int) -> None:
    driver = RunnerDriver(str(checkpoint), max_seqs=1, max_len=512)
    checked = 0
    for rec in recorders:
        for context, drafts in rec.drafts:
            # The engine has computed positions 0..n-2; the block reads, at each, the main trunk
            # there and the token after it.
            n = len(context)
            _, hidden = driver.runner.forward_hidden([driver.chunk(0, 0, context[:-1])])
            want, _ = driver.runner.mtp_draft([driver.chunk(0, 0, context[1:])], hidden, k)
            assert 1 <= len(drafts) <= k
            assert drafts == want[0, : len(drafts)].tolist(), f"drafts after {n} tokens"
            checked += 1
    assert checked > 0


def recorded_run(engine, prompts, n: int = 12) -> tuple[list[list[int]], list[Recorder]]:
    recorders = [Recorder(p) for p in prompts]
    outs = run_all(engine, prompts, [greedy(n, r) for r in recorders])[0]
    return outs, recorders


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_outputs_identical_with_mtp_drafts(mtp_checkpoint, prompts, plain, k) -> None:
    engine = mtp_engine(mtp_checkpoint, k, max_num_seqs=8)
    assert run_all(engine, prompts, greedy())[0] == plain
    s = engine.stats()
    assert s["draft_tokens"] > 0 and s["verify_rows"] > 0
    assert sum(s["drafts_at_position"]) == s["draft_tokens"]
    assert sum(s["accepted_at_position"]) == s["accepted_draft_tokens"]
    assert s["drafts_at_position"][k - 1] > 0 and s["drafts_at_position"][k] == 0
    assert_pools_full(engine)


@pytest.mark.parametrize("k", [1, 3])
def test_engine_drafts_are_the_runners_mtp_drafts(mtp_checkpoint, prompts, plain, k) -> None:
    """Chunked prefill (64-token chunks) over prompts longer than the block's window ring, and a
    one-token prompt: the drafts after each step are mtp_draft's over the committed tokens."""
    engine = mtp_engine(mtp_checkpoint, k, max_num_seqs=8, max_num_batched_tokens=64)
    chosen = (1, 3, 4, 6)
    outs, recorders = recorded_run(engine, [prompts[i] for i in chosen])
    assert outs == [plain[i] for i in chosen]
    assert_drafts_match_the_runner(mtp_checkpoint, recorders, k)
    assert_pools_full(engine)


@pytest.mark.parametrize("k", [1, 3])
def test_estimates_are_the_mtp_probabilities(mtp_checkpoint, prompts, plain, k) -> None:
    """Each verified MTP draft's acceptance estimate is the product of the MTP softmax
    probabilities of the drafts up to it (for k = 1: softmax(mtp_logits)[draft]), computed here
    from ModelRunner.mtp_draft's logits over the same committed tokens; the engine's calibration
    bins hold exactly these estimates."""
    engine = mtp_engine(mtp_checkpoint, k, max_num_seqs=8)
    chosen = (0, 2, 5)
    outs, recorders = recorded_run(engine, [prompts[i] for i in chosen])
    assert outs == [plain[i] for i in chosen]
    driver = RunnerDriver(str(mtp_checkpoint), max_seqs=1, max_len=512)
    estimates = []
    for rec in recorders:
        for context, drafts in rec.drafts:
            _, hidden = driver.runner.forward_hidden([driver.chunk(0, 0, context[:-1])])
            want, logits = driver.runner.mtp_draft([driver.chunk(0, 0, context[1:])], hidden, k)
            assert drafts == want[0, : len(drafts)].tolist()
            a = 1.0
            for j, d in enumerate(drafts):
                row = logits[0, j].astype(np.float64)
                a *= float(np.exp(row[d] - row.max() - np.log(np.exp(row - row.max()).sum())))
                estimates.append(a)
    s = engine.stats()
    assert len(estimates) == s["draft_tokens"] > 0
    assert all(0 < e <= 1 for e in estimates)
    assert s["spec_mean_estimate"] == pytest.approx(np.mean(estimates), rel=1e-5)
    bins = np.minimum((np.array(estimates) * 10).astype(int), 9)
    assert s["spec_calibration_drafts"] == np.bincount(bins, minlength=10).tolist()
    sums = np.bincount(bins, weights=estimates, minlength=10)
    assert s["spec_calibration_estimate_sum"] == pytest.approx(sums.tolist(), rel=1e-5, abs=1e-12)
    outcome = s["accepted_draft_tokens"] / s["draft_tokens"]
    assert s["spec_mean_acceptance"] == pytest.approx(outcome)
    # With every estimate in bin 0 (random weights) the error is |mean estimate - outcome|.
    if s["spec_calibration_drafts"][0] == len(estimates):
        assert s["spec_calibration_error"] == pytest.approx(abs(np.mean(estimates) - outcome))


def abort_two_while_drafting(engine, prompts, plain, drafting_stat: str) -> None:
    """Five steps in (with `drafting_stat` > 0: drafts in flight), requests 1 and 4 are aborted:
    they finish as aborted, the others keep the outputs without drafts, and nothing leaks."""
    ids = [engine.add_request(p, greedy(30)) for p in prompts]
    trace = Trace()
    for _ in range(5):
        trace.record(engine.step())
    assert engine.stats()[drafting_stat] > 0
    engine.abort(ids[1])
    engine.abort(ids[4])
    drain(engine, trace)
    assert trace.finish(ids[1]) == "abort" and trace.finish(ids[4]) == "abort"
    for i in (0, 2, 3, 5, 6):
        assert trace.tokens(ids[i])[:12] == plain[i]
    assert_pools_full(engine)


@pytest.mark.parametrize("k", [1, 3])
def test_mtp_drafts_under_zero_overhead_scheduling(mtp_checkpoint, prompts, plain, k) -> None:
    """With speculative_zero_overhead the block drafts on the device within each step's launch
    (no host sync between a step and its drafts) while the next step is planned: greedy outputs
    are identical, the drafts are still mtp_draft's over the committed tokens, and nothing
    leaks."""
    engine = mtp_engine(
        mtp_checkpoint, k, max_num_seqs=8, max_num_batched_tokens=64, speculative_zero_overhead=True
    )
    assert engine.config.scheduler.zero_overhead is True
    outs, recorders = recorded_run(engine, prompts)
    assert outs == plain
    s = engine.stats()
    assert s["verify_rows"] > 0 and s["draft_tokens"] > 0
    assert_drafts_match_the_runner(mtp_checkpoint, recorders, k)
    assert_pools_full(engine)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_rows_carried_on_the_device_verify_the_devices_drafts(
    mtp_checkpoint, prompts, k, sampled
) -> None:
    """Under zero-overhead scheduling a sequence's next row is planned while its previous one
    runs: at the position it has if every draft is accepted, verifying the drafts the block made
    past that row, all its tokens still on the device, moved back there by the drafts rejected.
    Outputs (greedy, and seeded sampling) equal those without drafts; nothing leaks."""
    params = [
        dc.SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=12, ignore_eos=True)
        if sampled
        else greedy()
        for i in range(len(prompts))
    ]
    want = run_all(cpu_engine(mtp_checkpoint, max_num_seqs=8), prompts, params)[0]
    engine = mtp_engine(mtp_checkpoint, k, max_num_seqs=8, speculative_zero_overhead=True)
    assert run_all(engine, prompts, params)[0] == want
    s = engine.stats()
    assert (
        s["device_carried_verify_rows"] > 0
        and s["device_carried_rows"] >= s["device_carried_verify_rows"]
    ), s
    assert s["draft_tokens"] >= s["device_carried_verify_rows"]
    assert_pools_full(engine)


def test_rows_carried_on_the_device_under_the_confidence_budget(mtp_checkpoint, prompts) -> None:
    """The confidence budget sizes carried rows from each request's acceptance history (their
    drafts' probabilities arrive with the step still in flight; tests/cpp/test_scheduler.cpp checks
    the sizes) and a step cost model fed under zero-overhead scheduling: whatever it picks, greedy
    outputs are those without drafts and nothing leaks."""
    engine = mtp_engine(
        mtp_checkpoint,
        3,
        max_num_seqs=8,
        speculative_zero_overhead=True,
        speculative_budget="confidence",
    )
    want = run_all(cpu_engine(mtp_checkpoint, max_num_seqs=8), prompts, greedy(24))[0]
    assert run_all(engine, prompts, greedy(24))[0] == want
    s = engine.stats()
    assert s["device_carried_rows"] > 0
    # The cost model is fed under zero-overhead scheduling too (the time between two pipelined
    # decode steps' commits), past the 16 samples it needs to size rows at all.
    assert s["budget_step_times"] >= 16, s
    assert_pools_full(engine)


def test_rows_carried_on_the_device_with_preemption_and_aborts(mtp_checkpoint, prompts, plain):
    rng = random.Random(5)
    long_prompts = [
        [rng.randrange(2, 129000) for _ in range(rng.randrange(100, 126))] for _ in range(6)
    ]
    roomy = run_all(cpu_engine(mtp_checkpoint), long_prompts, greedy(24))[0]
    tight = mtp_engine(mtp_checkpoint, 3, num_kv_blocks=6, speculative_zero_overhead=True)
    assert run_all(tight, long_prompts, greedy(24))[0] == roomy
    s = tight.stats()
    assert s["num_preemptions"] > 0 and s["device_carried_verify_rows"] > 0, s
    assert_pools_full(tight)
    engine = mtp_engine(mtp_checkpoint, 3, max_num_seqs=8, speculative_zero_overhead=True)
    abort_two_while_drafting(engine, prompts, plain, "device_carried_verify_rows")


def test_mtp_drafts_with_prefix_hits(mtp_checkpoint, prompts) -> None:
    """A prefix hit restores the block's rings from the snapshot with the main layers' ones."""
    shared = prompts[3][:256]
    variants = [shared + [11, 12], shared + [21, 22, 23]]
    cold = run_all(cpu_engine(mtp_checkpoint, max_num_seqs=4), variants, greedy())[0]
    engine = mtp_engine(mtp_checkpoint, 2, max_num_seqs=4)
    run_all(engine, [shared + [99]], greedy(2))
    recorders = [Recorder(p) for p in variants]
    outs, trace = run_all(engine, variants, [greedy(12, r) for r in recorders])
    assert outs == cold
    hits = [trace.ready(rid).prompt_cache_hit_tokens for rid in sorted(trace.outputs)]
    assert hits == [256, 256], hits
    assert_drafts_match_the_runner(mtp_checkpoint, recorders, 2)
    assert_pools_full(engine)


def test_mtp_drafts_with_preemption_recompute(mtp_checkpoint) -> None:
    """A recomputed request runs the block over its prompt again: its drafts stay exact."""
    rng = random.Random(5)
    prompts = [[rng.randrange(2, 129000) for _ in range(rng.randrange(100, 126))] for _ in range(6)]
    roomy = run_all(cpu_engine(mtp_checkpoint), prompts, greedy(24))[0]
    tight = mtp_engine(mtp_checkpoint, 3, num_kv_blocks=6)
    outs, recorders = recorded_run(tight, prompts, 24)
    assert outs == roomy
    assert tight.stats()["num_preemptions"] > 0
    assert_drafts_match_the_runner(mtp_checkpoint, recorders[:2], 3)
    assert_pools_full(tight)


def test_aborts_with_mtp_drafts_leak_nothing(mtp_checkpoint, prompts, plain) -> None:
    engine = mtp_engine(mtp_checkpoint, 3, max_num_seqs=8)
    abort_two_while_drafting(engine, prompts, plain, "draft_tokens")


def test_mtp_needs_an_mtp_block(tiny_checkpoint, mtp_checkpoint) -> None:
    with pytest.raises(ValueError, match=r"'speculative_method' is \"mtp\".*no MTP block"):
        mtp_engine(tiny_checkpoint, 2)
    # Without drafts the method asks for nothing.
    cpu_engine(tiny_checkpoint, num_speculative_tokens=0, speculative_method="mtp")
    assert mtp_engine(mtp_checkpoint, 2).config.scheduler.zero_overhead is False


def test_an_engine_not_drafting_with_mtp_keeps_no_mtp_block(mtp_checkpoint) -> None:
    """Without MTP drafting the engine skips the checkpoint's mtp.* blocks (weights and the
    block's caches and trunk ring) with a note; with it, they load and the state grows."""
    plain_engine = cpu_engine(mtp_checkpoint, max_num_seqs=2)
    drafting = mtp_engine(mtp_checkpoint, 2, max_num_seqs=2)
    assert any("not requested" in n for n in plain_engine.load_notes), plain_engine.load_notes
    assert not any("mtp" in n for n in drafting.load_notes), drafting.load_notes
    plain_slot = plain_engine.kv_capacity.bytes_per_state_slot
    drafting_slot = drafting.kv_capacity.bytes_per_state_slot
    assert plain_slot < drafting_slot, (plain_slot, drafting_slot)
