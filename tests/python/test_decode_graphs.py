"""Decode graphs (cpp/src/model/decode_graphs.h) on the CPU backend, where a graph re-issues its
recorded calls: the padding to a bucket, the scratch slot, the padding entries, the metadata
staging and the shared logits buffer are the same code the CUDA graphs replay, so a decode batch
run through them must give bitwise the eager logits (the CPU computes every row on its own).
"""

from __future__ import annotations

import random

import deepinfer_core as dc
import numpy as np
import pytest
from runner_driver import RunnerDriver

MAX_SEQS = 5


def make_driver(checkpoint, graph_max_batch: int, device: str = "cpu") -> RunnerDriver:
    driver = RunnerDriver(str(checkpoint), max_seqs=MAX_SEQS, max_len=512, device=device)
    driver.runner = dc.ModelRunner(
        str(checkpoint),
        num_blocks=1 + MAX_SEQS * driver.blocks_per_seq,
        num_state_slots=MAX_SEQS,
        device=device,
        decode_graph_max_batch=graph_max_batch,
    )
    return driver


def decode_trace(driver: RunnerDriver, prompts: list[list[int]], steps: int) -> list[np.ndarray]:
    """Prefills every prompt alone, then decodes greedily with a batch that changes size every
    step (members drop in and out), so several buckets and their padding are used."""
    outputs = []
    next_token, cursor = {}, {}
    for slot, prompt in enumerate(prompts):
        logits = driver.runner.forward([driver.chunk(slot, 0, prompt)], logits="last")
        next_token[slot] = int(np.argmax(logits[0]))
        cursor[slot] = len(prompt)
        outputs.append(logits)
    rng = random.Random(7)
    for step in range(steps):
        size = 1 + step % len(prompts)
        members = sorted(rng.sample(range(len(prompts)), size))
        batch = [driver.chunk(s, cursor[s], [next_token[s]]) for s in members]
        mode = "last" if step % 2 else "all"
        logits = driver.runner.forward(batch, logits=mode)
        assert logits.shape[0] == len(members)
        for row, s in enumerate(members):
            next_token[s] = int(np.argmax(logits[row]))
            cursor[s] += 1
        outputs.append(logits)
    return outputs


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(11)
    # Lengths put decode positions across CSA (4) and HCA (128) window closes: 126 and 127
    # close the first HCA window within a few steps.
    return [[rng.randrange(2, 129000) for _ in range(n)] for n in (126, 127, 3, 64, 250)]


@pytest.fixture(scope="module")
def eager(tiny_checkpoint, prompts) -> list[np.ndarray]:
    driver = make_driver(tiny_checkpoint, 0)
    out = decode_trace(driver, prompts, steps=24)
    assert driver.runner.decode_graph_stats() == {
        "num_recorded": 0,
        "num_calls": 0,
        "num_verify_calls": 0,
    }
    return out


@pytest.mark.parametrize("graph_max_batch", [MAX_SEQS, 3])
def test_graph_decode_matches_eager(tiny_checkpoint, prompts, eager, graph_max_batch) -> None:
    # With 3, batches of 4 and 5 run eagerly between replays of the same caches.
    driver = make_driver(tiny_checkpoint, graph_max_batch)
    graphs = decode_trace(driver, prompts, steps=24)
    stats = driver.runner.decode_graph_stats()
    # Batches of 1..5 in turn: buckets 1, 2, 4 (3 and 4), 5 (the limit) when the limit is 5; with 3,
    # batches of 1..3 use buckets 1, 2, 3 and 4..5 run eagerly.
    expected_calls = sum(1 for step in range(24) if 1 + step % 5 <= graph_max_batch)
    assert stats["num_calls"] == expected_calls
    assert stats["num_recorded"] == (4 if graph_max_batch == MAX_SEQS else 3)
    for i, (g, e) in enumerate(zip(graphs, eager, strict=True)):
        np.testing.assert_array_equal(g, e, err_msg=f"call {i} differs")


def verify_trace(driver: RunnerDriver, prompts: list[list[int]], steps: int) -> list[np.ndarray]:
    """Prefills every prompt alone, then runs steps shaped as a speculative engine's: each member
    is a verify row (its next token and 1..5 random drafts, every position scored) or a plain
    decode row, and moves on by 1 + a (a random count of accepted drafts), so the next row
    overwrites the rejected positions' keys as the engine's does."""
    outputs = []
    next_token, cursor = {}, {}
    for slot, prompt in enumerate(prompts):
        logits = driver.runner.forward([driver.chunk(slot, 0, prompt)], logits="last")
        next_token[slot] = int(np.argmax(logits[0]))
        cursor[slot] = len(prompt)
    rng = random.Random(13)
    for step in range(steps):
        size = 1 + step % len(prompts)
        members = sorted(rng.sample(range(len(prompts)), size))
        drafts = {
            s: [rng.randrange(2, 129000) for _ in range(rng.choice([0, 0, 1, 3, 5]))]
            for s in members
        }
        if step % 4 == 0:  # some steps with one long verify row at least
            drafts[members[0]] = [rng.randrange(2, 129000) for _ in range(5)]
        batch = [driver.chunk(s, cursor[s], [next_token[s], *drafts[s]]) for s in members]
        logits = driver.runner.forward(batch, logits="all")
        row = 0
        for s in members:
            n = 1 + len(drafts[s])
            accepted = rng.randrange(0, n)
            next_token[s] = int(np.argmax(logits[row + accepted]))
            cursor[s] += 1 + accepted
            row += n
        assert row == logits.shape[0]
        outputs.append(logits)
    return outputs


def test_verify_steps_replay_graphs_and_match_eager(tiny_checkpoint, prompts) -> None:
    eager_driver = make_driver(tiny_checkpoint, 0)
    eager = verify_trace(eager_driver, prompts, steps=16)
    graph_driver = make_driver(tiny_checkpoint, MAX_SEQS)
    graphs = verify_trace(graph_driver, prompts, steps=16)
    stats = graph_driver.runner.decode_graph_stats()
    # A step has a verify row when it scores more rows than it has members.
    verify_steps = sum(1 for i, e in enumerate(eager) if e.shape[0] > 1 + i % len(prompts))
    assert verify_steps >= 4
    assert stats["num_calls"] == 16, stats
    assert stats["num_verify_calls"] == verify_steps, stats
    for i, (g, e) in enumerate(zip(graphs, eager, strict=True)):
        np.testing.assert_array_equal(g, e, err_msg=f"step {i} differs")
    # greedy(logits="all") replays too and is the argmax of every scored row.
    batch = [graph_driver.chunk(0, 200, [5, 6, 7]), graph_driver.chunk(1, 201, [8])]
    want = eager_driver.runner.forward(
        [eager_driver.chunk(0, 200, [5, 6, 7]), eager_driver.chunk(1, 201, [8])], logits="all"
    ).argmax(axis=-1)
    calls = graph_driver.runner.decode_graph_stats()["num_verify_calls"]
    assert graph_driver.runner.greedy(batch, logits="all").tolist() == want.tolist()
    assert graph_driver.runner.decode_graph_stats()["num_verify_calls"] == calls + 1


@pytest.mark.parametrize("graph_max_batch", [0, MAX_SEQS])
def test_greedy_is_the_argmax_of_the_last_rows(tiny_checkpoint, graph_max_batch) -> None:
    driver = make_driver(tiny_checkpoint, graph_max_batch)
    prefill = [driver.chunk(0, 0, [5, 6, 7]), driver.chunk(1, 0, [9] * 20)]
    want = driver.runner.forward(prefill, logits="last").argmax(axis=-1)
    # The same call again on fresh slots (2, 3) gives the same logits, hence the same tokens.
    again = [driver.chunk(2, 0, [5, 6, 7]), driver.chunk(3, 0, [9] * 20)]
    got = driver.runner.greedy(again)
    assert got.dtype == np.int32 and got.tolist() == want.tolist()
    decode = [driver.chunk(0, 3, [int(got[0])]), driver.chunk(1, 20, [int(got[1])])]
    want = driver.runner.forward(decode, logits="last").argmax(axis=-1)
    decode = [driver.chunk(2, 3, [int(got[0])]), driver.chunk(3, 20, [int(got[1])])]
    assert driver.runner.greedy(decode).tolist() == want.tolist()


def test_graph_decode_validates_like_eager(tiny_checkpoint) -> None:
    driver = make_driver(tiny_checkpoint, MAX_SEQS)
    driver.runner.forward([driver.chunk(0, 0, [5, 6, 7])])
    # The scratch slot (MAX_SEQS) is not the caller's to name.
    bad_slot = dc.SequenceChunk(MAX_SEQS, 3, [8], driver.block_table(0))
    with pytest.raises(ValueError, match=r"sequence 0: 'slot' 5 is outside \[0, 5\)"):
        driver.runner.forward([bad_slot])
    bad_token = driver.chunk(0, 3, [10**9])
    with pytest.raises(ValueError, match=r"sequence 0: 'tokens'\[0\] = 1000000000"):
        driver.runner.forward([bad_token])
    dup = [driver.chunk(0, 3, [8]), driver.chunk(0, 3, [8])]
    with pytest.raises(ValueError, match="sequence 1: 'slot' 0 is used by another sequence"):
        driver.runner.forward(dup)


def test_decode_graphs_default_off_on_cpu(tiny_checkpoint) -> None:
    driver = RunnerDriver(str(tiny_checkpoint), max_seqs=2, max_len=256)
    driver.greedy([5, 6, 7], 4)
    assert driver.runner.decode_graph_stats()["num_calls"] == 0


def test_decode_graph_max_batch_rejects_below_minus_one(tiny_checkpoint) -> None:
    with pytest.raises(ValueError, match="decode_graph_max_batch must be -1"):
        dc.ModelRunner(str(tiny_checkpoint), decode_graph_max_batch=-2)
