"""Logit parity of the DeepSeek-V4 graph (CPU backend, fp32) against transformers 5.23.

Every schedule is compared with the reference run on the same schedule: one-shot prefill, chunked
prefill, token-by-token decode, several sequences of different lengths in one call, and greedy
continuations. Tolerance: max |ours - ref| <= 1e-4 * max |ref| over all positions.

Index top-k ties: our indexer breaks exact score ties by taking the lower entry index first.
torch.topk specifies no tie order, and a near-tie (a gap within fp32 rounding) can flip with the
summation order, so every case first checks the reference's selection margins (indexer and router
top-k, ref.selection_margins) and refuses a seed with a gap below 1e-5
(docs/model.md#top-k-near-ties).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import v4_reference as ref
from runner_driver import RunnerDriver

REL_TOL = 1e-4
SEEDS = [0, 1, 2]


@dataclass
class Case:
    name: str
    model: object
    driver: RunnerDriver
    prompt: list[int]
    schedule: list[int]  # a chunked schedule covering the prompt


def assert_close(ours: np.ndarray, want: np.ndarray, what: str) -> None:
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} != {want.shape}"
    scale = float(np.abs(want).max())
    err = float(np.abs(ours - want).max())
    assert err <= REL_TOL * scale, f"{what}: max abs diff {err:.3e} > {REL_TOL} * {scale:.3e}"


def build_case(
    tmp: Path, name: str, config: dict, seed: int, prompt_len: int, schedule: list[int]
) -> Case:
    model = ref.make_model(config, seed)
    path = ref.save(model, tmp / name)
    prompt = ref.random_tokens(prompt_len, config["vocab_size"], seed + 7)
    margins = ref.selection_margins(model, prompt)
    # A near-tie in a top-k selection would make the comparison depend on summation order.
    assert ref.tie_free(margins), (
        f"{name}: top-k near-tie in the reference run {margins}; pick another seed"
    )
    return Case(
        name, model, RunnerDriver(str(path), max_seqs=4, max_len=prompt_len + 64), prompt, schedule
    )


F2_SCHEDULE = [13, 9, 1, 1, 1, 1, 1, 20, *[1] * 12]  # 59 tokens, then the rest in one chunk


@pytest.fixture(scope="module", params=SEEDS, ids=lambda s: f"f2-seed{s}")
def f2_case(request, tmp_path_factory) -> Case:
    prompt_len = 72
    schedule = [*F2_SCHEDULE, prompt_len - sum(F2_SCHEDULE)]
    return build_case(
        tmp_path_factory.mktemp("f2"),
        f"f2_{request.param}",
        ref.F2_CONFIG,
        request.param,
        prompt_len,
        schedule,
    )


@pytest.fixture(scope="module")
def real_ratio_case(tmp_path_factory) -> Case:
    prompt_len = 410
    # Crosses 128-token blocks, closes HCA windows mid-chunk, and feeds a 150-token chunk (longer
    # than the 134-slot window ring).
    schedule = [*F2_SCHEDULE, 150, 1, 1, 1, 1, 1, 64]
    schedule.append(prompt_len - sum(schedule))
    return build_case(
        tmp_path_factory.mktemp("real"),
        "real_ratio",
        ref.REAL_RATIO_CONFIG,
        12,
        prompt_len,
        schedule,
    )


@pytest.fixture(params=["f2", "real_ratio"])
def case(request, f2_case, real_ratio_case) -> Case:
    return f2_case if request.param == "f2" else real_ratio_case


def test_parity_one_shot_prefill(case: Case) -> None:
    want = ref.logits_one_shot(case.model, case.prompt)
    ours = case.driver.run_schedule(case.prompt, [len(case.prompt)])
    assert_close(ours, want, f"{case.name} one-shot")


def test_parity_chunked_prefill(case: Case) -> None:
    want = ref.logits_scheduled(case.model, case.prompt, case.schedule)
    ours = case.driver.run_schedule(case.prompt, case.schedule, slot=1)
    assert_close(ours, want, f"{case.name} chunked {case.schedule}")


def test_parity_token_by_token_decode(case: Case) -> None:
    schedule = [1] * len(case.prompt)
    want = ref.logits_scheduled(case.model, case.prompt, schedule)
    ours = case.driver.run_schedule(case.prompt, schedule, slot=2)
    assert_close(ours, want, f"{case.name} token by token")


def test_parity_batch_of_three_sequences(case: Case) -> None:
    n = len(case.prompt)
    # Call 0 prefills all three at once (different lengths); later calls mix decode rows of one
    # sequence with prefill chunks of another.
    schedules = [
        [n],
        [n - 40, 1, 1, 17, 1, 1, 1, 1],
        [n // 2 - 10, 1, 15],
    ]
    prompts = [
        case.prompt,
        ref.random_tokens(sum(schedules[1]), 128, 101),
        ref.random_tokens(sum(schedules[2]), 128, 202),
    ]
    outs = case.driver.run_batched(prompts, schedules)
    for i, (p, s, ours) in enumerate(zip(prompts, schedules, outs, strict=True)):
        want = ref.logits_scheduled(case.model, p, s)
        assert_close(ours, want, f"{case.name} batched sequence {i} schedule {s}")


def test_parity_greedy_continuation(case: Case) -> None:
    want = ref.greedy_continuation(case.model, case.prompt, 32)
    ours = case.driver.greedy(case.prompt, 32, slot=3)
    assert ours == want
