"""DeepSeek-V4.1's DSpark drafter (cpp/src/model/dspark.h) on the CPU backend against the torch
reference dspark_reference.py, on tiny V4.1 configs with 1 to 3 DSpark blocks.

Each case writes the reference's random weights (target and mtp.*) as a checkpoint and loads it
with deepinfer_core.ModelRunner. Every forward writes the blocks' main keys; dspark_draft runs one
draft step after the golden token. Drafts must be identical to the reference's, confidences
within 1e-4, draft logits within 1e-4 * max |logit|: after a one-shot prompt, after a verify
chunk whose last drafts were rejected (their main keys stay in the ring past the accepted
position) and after a decode step that overwrites them, for two sequences drafted together (one
shorter than the sliding window).
"""

from __future__ import annotations

import re
from pathlib import Path

import dspark_reference as dref
import numpy as np
import pytest
import v41_reference as ref
from runner_driver import RunnerDriver

deepinfer_core = pytest.importorskip("deepinfer_core")

REL_TOL = 1e-4
CONF_TOL = 1e-4
PROMPT_LEN = 40
SHORT_LEN = 5  # below every tiny config's sliding window


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


def assert_close(ours: np.ndarray, want: np.ndarray, what: str) -> None:
    assert ours.shape == want.shape, f"{what}: shape {ours.shape} != {want.shape}"
    scale = float(np.abs(want).max())
    err = float(np.abs(ours - want).max())
    assert err <= REL_TOL * scale, f"{what}: max abs diff {err:.3e} > {REL_TOL} * {scale:.3e}"


def assert_draft(
    ours: tuple[np.ndarray, np.ndarray, np.ndarray], row: int, want: dref.Draft, what: str
) -> None:
    tokens, confs, logits = ours
    assert tokens[row].tolist() == want.tokens, f"{what}: drafts"
    err = float(np.abs(confs[row] - np.array(want.confidences)).max())
    assert err <= CONF_TOL, f"{what}: confidence diff {err:.3e}"
    assert_close(logits[row], want.logits.numpy(), f"{what}: draft logits")


_models: dict = {}


def model(name: str) -> dref.DSparkModel:
    if name not in _models:
        _models[name] = dref.make_model(name)
    return _models[name]


CASES = [("A", "f32", "off"), ("B", "f32", "off"), ("C", "f32", "off"), ("A", "fp8", "off")]
# YOCO compact truncation: only the prompt's last yoco_keep_tokens rows reach the target layers
# and get main keys (keep >= sliding_window + max_backtrack; config A keeps 12 of window 8).
CASES += [("A", "f32", "compact")]


@pytest.mark.parametrize(("name", "kv", "yoco"), CASES)
def test_dspark_drafts_match_reference(name: str, kv: str, yoco: str, tmp_path: Path) -> None:
    m = model(name)
    cfg = m.cfg
    options = {}
    if yoco != "off":
        options = {
            "yoco_prefill_truncation": yoco,
            "yoco_keep_tokens": cfg.yoco_keep_tokens,
            "max_backtrack": cfg.dspark_block_size,
        }
    d = RunnerDriver(
        str(dref.write_checkpoint(m, tmp_path / "ckpt")),
        max_seqs=2,
        max_len=PROMPT_LEN + 64,
        kv_cache_dtype=kv,
        **options,
    )
    assert d.runner.num_dspark_blocks == cfg.num_nextn_predict_layers
    prompts = [
        ref.random_tokens(PROMPT_LEN, cfg.vocab_size, 11),
        ref.random_tokens(SHORT_LEN, cfg.vocab_size, 12),
    ]
    caches = [m.new_cache(yoco, kv) for _ in prompts]
    goldens = []
    for slot, p in enumerate(prompts):
        # The last row (compact truncation leaves the dropped rows' logits NaN on both sides).
        ours = d.runner.forward([d.chunk(slot, 0, p, prompt_end=len(p))])[-1:]
        want = m.forward_chunk(caches[slot], p, prompt_end=len(p)).numpy()[-1:]
        assert_close(ours, want, f"{name}: prompt {slot} logits")
        goldens.append(int(np.argmax(want[-1])))

    def draft_both(what: str) -> list[dref.Draft]:
        batch = [d.chunk(s, caches[s].main.length, [goldens[s]]) for s in range(2)]
        ours = d.runner.dspark_draft(batch)
        wants = [m.draft(caches[s], goldens[s]) for s in range(2)]
        for s in range(2):
            assert_draft(ours, s, wants[s], f"{name}/{kv}/{yoco}: {what}, sequence {s}")
        return wants

    drafts = draft_both("after the prompt")
    # Verify rows: golden + 2 drafts, of which only the golden is kept (the drafts are made wrong
    # so their main keys at ap + 1, ap + 2 are stale); the reference sees the kept token only.
    for s in range(2):
        start = caches[s].main.length
        wrong = [(t + 1) % cfg.vocab_size for t in drafts[s].tokens[:2]]
        ours = d.runner.forward([d.chunk(s, start, [goldens[s], *wrong])])
        want = m.forward_chunk(caches[s], [goldens[s]]).numpy()
        assert_close(ours[:1], want, f"{name}: verify row {s}")
        goldens[s] = int(np.argmax(want[-1]))
    draft_both("after a partly rejected verify chunk")
    # A decode step over the rejected positions.
    for s in range(2):
        start = caches[s].main.length
        ours = d.runner.forward([d.chunk(s, start, [goldens[s]])])
        want = m.forward_chunk(caches[s], [goldens[s]]).numpy()
        assert_close(ours, want, f"{name}: decode {s}")
        goldens[s] = int(np.argmax(want[-1]))
    draft_both("after a decode step")


def test_dspark_absent_without_mtp_tensors(tmp_path: Path) -> None:
    m = model("B")
    path = dref.write_checkpoint(m, tmp_path / "ckpt", with_mtp=False)
    d = RunnerDriver(str(path), max_seqs=1, max_len=64)
    assert d.runner.num_dspark_blocks == 0
    d.runner.forward([d.chunk(0, 0, [1, 2, 3])])
    with pytest.raises(ValueError, match="no DSpark drafter"):
        d.runner.dspark_draft([d.chunk(0, 3, [4])])


def test_dspark_missing_tensor_is_named(tmp_path: Path) -> None:
    m = model("B")
    path = dref.write_checkpoint(m, tmp_path / "ckpt")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    del tensors["mtp.0.markov_head.head.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match=re.escape("'mtp.0.markov_head.head.weight'")):
        RunnerDriver(str(path), max_seqs=1, max_len=64)


def test_dspark_needs_rings_past_the_window(tmp_path: Path) -> None:
    """A draft block's keys sit past the window in the rings: with max_backtrack below the block
    size the model still loads and runs, and drafting is refused naming both."""
    m = model("C")  # block size 5
    path = dref.write_checkpoint(m, tmp_path / "ckpt")
    d = RunnerDriver(str(path), max_seqs=1, max_len=64, max_backtrack=2)
    assert d.runner.num_dspark_blocks == m.cfg.num_nextn_predict_layers
    d.runner.forward([d.chunk(0, 0, [1, 2, 3])])
    with pytest.raises(ValueError, match=r"dspark_block_size = 5 .*max_backtrack is 2"):
        d.runner.dspark_draft([d.chunk(0, 3, [4])])
