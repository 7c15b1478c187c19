"""The MTP block (mtp.0.*) on the CPU backend in fp32 against the torch reference
(mtp_reference.py, DeepSeek's MTPBlock.forward assembled from transformers' V4 pieces).

The checkpoint is the tiny model with an MTP block (deepinfer.tiny, mtp=True): a sliding-window
block as V4-Flash ships it, on a prompt longer than the 134-slot window ring. Tolerance as in the
parity tests: max |ours - ref| <= 1e-4 * max |ref|.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import deepinfer_core
import numpy as np
import pytest
import torch
import v4_reference as ref
from deepinfer.tiny import ensure_tiny_checkpoint
from mtp_reference import MtpReference
from runner_driver import RunnerDriver

REL_TOL = 1e-4
PROMPT_LEN = 150


def assert_close(ours: np.ndarray, want: np.ndarray, what: str) -> None:
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} != {want.shape}"
    scale = float(np.abs(want).max())
    err = float(np.abs(ours - want).max())
    assert err <= REL_TOL * scale, f"{what}: max abs diff {err:.3e} > {REL_TOL} * {scale:.3e}"


@dataclass
class Case:
    reference: MtpReference
    driver: RunnerDriver
    prompt: list[int]
    next_tokens: list[int]  # the token at p + 1 for every prompt position p
    ref_hidden: torch.Tensor  # the reference main model's trunk [S, N, H]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Case:
    checkpoint = ensure_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), mtp=True)
    reference = MtpReference(checkpoint, tmp_path_factory.mktemp("deeper"))
    prompt = ref.random_tokens(PROMPT_LEN, 129280, 7)
    logits, hidden = reference.main_forward(prompt)
    next_tokens = [*prompt[1:], int(np.argmax(logits[-1]))]
    driver = RunnerDriver(str(checkpoint), max_seqs=4, max_len=PROMPT_LEN + 16)
    return Case(reference, driver, prompt, next_tokens, hidden)


def test_mtp_block_is_loaded(case: Case, tiny_checkpoint) -> None:
    assert case.driver.runner.num_mtp_blocks == 1
    plain = deepinfer_core.ModelRunner(str(tiny_checkpoint), num_blocks=4, device="cpu")
    assert plain.num_mtp_blocks == 0
    hidden = np.zeros((1, 4, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="no mtp"):
        plain.mtp_forward([deepinfer_core.SequenceChunk(0, 0, [5], [1])], hidden)


def test_main_hidden_matches_the_reference_trunk(case: Case) -> None:
    logits, hidden = case.driver.runner.forward_hidden([case.driver.chunk(0, 0, case.prompt)])
    want_logits, _ = case.reference.main_forward(case.prompt)
    assert_close(logits, want_logits, "main logits")
    assert_close(hidden, case.ref_hidden.numpy(), "main trunk before the head")


def test_mtp_one_shot_over_the_prompt(case: Case) -> None:
    runner = case.driver.runner
    _, hidden = runner.forward_hidden([case.driver.chunk(1, 0, case.prompt)])
    ours, trunk = runner.mtp_forward([case.driver.chunk(1, 0, case.next_tokens)], hidden)
    want, want_trunk = case.reference.block(case.ref_hidden, case.next_tokens)
    assert case.reference.router_margin > 1e-5, "MTP router near-tie: pick another prompt"
    assert_close(ours, want, "MTP logits, one shot")
    assert_close(trunk, want_trunk.numpy(), "MTP trunk, one shot")


def test_mtp_chunked_over_the_prompt_uses_its_own_cache(case: Case) -> None:
    """The block in three chunks (the last one decode-sized) reads its earlier keys from its own
    window ring and gives the one-shot logits."""
    runner = case.driver.runner
    _, hidden = runner.forward_hidden([case.driver.chunk(2, 0, case.prompt)])
    rows, start = [], 0
    for n in [100, 49, 1]:
        chunk = case.driver.chunk(2, start, case.next_tokens[start : start + n])
        logits, _ = runner.mtp_forward([chunk], np.ascontiguousarray(hidden[start : start + n]))
        rows.append(logits)
        start += n
    want, _ = case.reference.block(case.ref_hidden, case.next_tokens)
    assert_close(np.concatenate(rows), want, "MTP logits, chunked")


def test_mtp_recurrent_draft_of_three_tokens(case: Case) -> None:
    runner = case.driver.runner
    _, hidden = runner.forward_hidden([case.driver.chunk(3, 0, case.prompt)])
    tokens, logits = runner.mtp_draft([case.driver.chunk(3, 0, case.next_tokens)], hidden, 3)
    want_tokens, want_logits = case.reference.draft(case.ref_hidden, case.next_tokens, 3)
    assert tokens.shape == (1, 3) and logits.shape == (1, 3, 129280)
    for j in range(3):
        assert_close(logits[0, j], want_logits[j], f"MTP draft step {j}")
    assert tokens[0].tolist() == want_tokens


def test_mtp_forward_rejects_a_wrong_hidden_shape(case: Case) -> None:
    chunk = case.driver.chunk(0, 0, case.next_tokens[:4])
    with pytest.raises(ValueError, match="'hidden' must be f32 \\[4, 4, 64\\]"):
        case.driver.runner.mtp_forward([chunk], np.zeros((3, 4, 64), dtype=np.float32))


def test_plain_tiny_checkpoint_is_unchanged_by_the_mtp_option(tiny_checkpoint: Path) -> None:
    """The mtp option only adds tensors: the main ones are the plain checkpoint's."""
    from safetensors.numpy import load_file

    with_mtp = load_file(
        str(ensure_tiny_checkpoint(tiny_checkpoint.parent, mtp=True) / "model.safetensors")
    )
    plain = load_file(str(tiny_checkpoint / "model.safetensors"))
    assert set(with_mtp) - set(plain) == {k for k in with_mtp if k.startswith("mtp.0.")}
    for name in ["embed.weight", "layers.3.ffn.experts.7.w2.weight", "hc_head_fn"]:
        np.testing.assert_array_equal(with_mtp[name], plain[name])
