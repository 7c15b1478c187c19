"""The MTP block on the CUDA backend against the CPU reference backend (whose parity with the
torch reference is tests/python/test_mtp.py): one shot over a prompt and a 3-token draft on the
tiny checkpoint with an MTP block."""

from __future__ import annotations

import random

import deepinfer_core as dc
import numpy as np
import pytest
from deepinfer.tiny import ensure_tiny_checkpoint

pytestmark = pytest.mark.gpu


def test_mtp_block_on_the_device_matches_the_cpu() -> None:
    path = str(ensure_tiny_checkpoint(mtp=True))
    rng = random.Random(2)
    prompt = [rng.randrange(2, 129000) for _ in range(60)]
    following = prompt[1:] + [rng.randrange(2, 129000)]
    out = {}
    for device in ("cpu", "cuda"):
        runner = dc.ModelRunner(path, num_blocks=4, device=device, kv_cache_dtype="f32")
        _, hidden = runner.forward_hidden([dc.SequenceChunk(0, 0, prompt, [1])])
        logits, _ = runner.mtp_forward([dc.SequenceChunk(0, 0, following, [1])], hidden)
        _, hidden = runner.forward_hidden([dc.SequenceChunk(1, 0, prompt, [2])])
        tokens, draft_logits = runner.mtp_draft([dc.SequenceChunk(1, 0, following, [2])], hidden, 3)
        out[device] = (logits, tokens, draft_logits)
    scale = float(np.abs(out["cpu"][0]).max())
    err = float(np.abs(out["cuda"][0] - out["cpu"][0]).max()) / scale
    draft_err = float(np.abs(out["cuda"][2] - out["cpu"][2]).max()) / scale
    agree = int((out["cuda"][1] == out["cpu"][1]).sum())
    print(f"\nMTP-GPU one-shot err {err:.2e} draft err {draft_err:.2e} draft tokens {agree}/3")
    # f32 weights on both backends; the device's GEMMs may round through TF32.
    assert err < 1e-2 and draft_err < 1e-2
