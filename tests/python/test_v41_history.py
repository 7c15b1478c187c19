"""ModelRunner.set_history: a DeepSeek-V4.1 slot's token history (what its Engram n-grams read)
supplied without running it, as the V4.1 benchmark does to decode at a long context it never
prefilled.

The runner and the torch reference v41_reference.py (tiny config A: Engram at layers 1 and 4) both
prefill the same prompt; then both get a history whose last tokens differ from the prompt while
their caches stay those of the prompt (the reference's V41Cache.tokens is what its Engram reads).
The next decode step must match the reference, differ from the step after the true history, and
come back to it when the true history is supplied again.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import v41_reference as ref
from runner_driver import RunnerDriver
from test_v41_parity import assert_close, write_checkpoint

dc = pytest.importorskip("deepinfer_core")

NAME = "A"
PROMPT_LEN = 40


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def model() -> ref.V41Model:
    return ref.V41Model(ref.TINY_CONFIGS[NAME], seed=0)


@pytest.fixture(scope="module")
def driver(model: ref.V41Model, tmp_path_factory) -> RunnerDriver:
    path = write_checkpoint(model, tmp_path_factory.mktemp("v41_history"))
    return RunnerDriver(str(path), max_seqs=3, max_len=PROMPT_LEN + 64)


def changed_tail(tokens: list[int], n: int, vocab: int) -> list[int]:
    """`tokens` with its last n tokens replaced (each by a different id)."""
    return tokens[:-n] + [(t + 1 + i) % vocab for i, t in enumerate(tokens[-n:])]


def test_v41_decode_reads_the_supplied_history(model: ref.V41Model, driver: RunnerDriver) -> None:
    cfg = ref.TINY_CONFIGS[NAME]
    prompt = ref.random_tokens(PROMPT_LEN, cfg.vocab_size, 5)
    # The n-grams of the next position reach back engram_max_ngram_size - 1 tokens.
    other = changed_tail(prompt, cfg.engram_max_ngram_size - 1, cfg.vocab_size)
    step = [7]
    runner = driver.runner

    driver.run_schedule(prompt, [PROMPT_LEN], slot=0)
    cache = model.new_cache("off")
    model.forward_chunk(cache, prompt)

    # The true history (what the prefill left) first, as a plain decode would see it.
    true_step = runner.forward([driver.chunk(0, PROMPT_LEN, step)])
    want_true = model.forward_chunk(copy.deepcopy(cache), step).numpy()
    assert_close(true_step, want_true, "decode after the prefilled history")

    runner.set_history(0, other)
    ours = runner.forward([driver.chunk(0, PROMPT_LEN, step)])
    swapped = copy.deepcopy(cache)
    swapped.tokens = list(other)  # the caches stay the prompt's; Engram reads `other`
    want = model.forward_chunk(swapped, step).numpy()
    assert_close(ours, want, "decode after the supplied history")
    assert float(np.abs(ours - true_step).max()) > 1e-3 * float(np.abs(want).max())

    runner.set_history(0, prompt)
    again = runner.forward([driver.chunk(0, PROMPT_LEN, step)])
    np.testing.assert_array_equal(again, true_step)


def test_v41_history_lets_a_slot_decode_past_what_it_was_fed(driver: RunnerDriver) -> None:
    """The benchmark's use: a slot never fed decodes at a context its history covers."""
    cfg = ref.TINY_CONFIGS[NAME]
    runner = driver.runner
    context = PROMPT_LEN + 20
    with pytest.raises(ValueError, match="past the 0 tokens slot 2 holds"):
        runner.greedy([driver.chunk(2, context, [3])])
    runner.set_history(2, ref.random_tokens(context, cfg.vocab_size, 9))
    ids = runner.greedy([driver.chunk(2, context, [3])])
    assert ids.shape == (1,) and 0 <= int(ids[0]) < cfg.vocab_size
    # The decoded token joined the history: the next position follows on.
    runner.greedy([driver.chunk(2, context + 1, [int(ids[0])])])


def test_v41_history_errors_name_the_field(driver: RunnerDriver) -> None:
    vocab = ref.TINY_CONFIGS[NAME].vocab_size
    with pytest.raises(ValueError, match=r"'slot' 3 is outside the runner's 3 state slots"):
        driver.runner.set_history(3, [1, 2])
    with pytest.raises(ValueError, match=rf"'tokens'\[1\] = {vocab} is outside the vocabulary"):
        driver.runner.set_history(0, [1, vocab])


def test_v4_runner_has_no_history(tiny_checkpoint) -> None:
    runner = dc.ModelRunner(str(tiny_checkpoint), num_blocks=4, num_state_slots=1, device="cpu")
    with pytest.raises(ValueError, match=r"DeepSeek-V4\.1 only"):
        runner.set_history(0, [1, 2, 3])
