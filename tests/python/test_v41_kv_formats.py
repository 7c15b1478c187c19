"""DeepSeek-V4.1 with quantized KV caches (CPU backend) against the torch reference with the same
formats emulated (v41_reference.py ``new_cache(kv_format=...)``, the oracle).

kv_cache_dtype "fp8" on a V4.1 model selects V4.1's shipped formats (docs/model.md#kv-cache-dtypes):
FP8 SWA keys (e4m3 + UE8M0 per 32), FP4 compressed entries (e2m1 + e4m3 per 16) and FP4 index
keys (e2m1 + UE8M0 per 32); "bf16" stores every cache as bf16. Logits of every schedule must match
the reference on the same formats (the keys are quantized the same way whether they come from this
call or from the cache, so prefill equals decode), and greedy continuations must be the
reference's, fed the same tokens: within 1e-4 * max |logit| but where a last-bit difference
rounds a key to the other grid point (quantized_kv_checks.py). The drift against f32 KV is
printed (``-s``), not held.
"""

from __future__ import annotations

import numpy as np
import pytest
import quantized_kv_checks as qkv
import torch
import v41_reference as ref
from runner_driver import RunnerDriver
from test_v41_parity import (
    CHUNKS,
    GREEDY_TOKENS,
    PROMPT_LEN,
    SCHEDULES,
    model,
    prompt,
    write_checkpoint,
)

deepinfer_core = pytest.importorskip("deepinfer_core")


# Tiny torch ops on one thread (conftest.py).
pytestmark = pytest.mark.usefixtures("torch_one_thread")


_paths: dict = {}


def checkpoint(name: str, tmp_path_factory) -> str:
    if name not in _paths:
        _paths[name] = str(write_checkpoint(model(name), tmp_path_factory.mktemp(f"v41kv_{name}")))
    return _paths[name]


def engine(name: str, kv: str, tmp_path_factory) -> RunnerDriver:
    return RunnerDriver(
        checkpoint(name, tmp_path_factory), max_seqs=1, max_len=PROMPT_LEN + 64, kv_cache_dtype=kv
    )


def reference(name: str, tokens: list[int], schedule: list[int], kv: str) -> np.ndarray:
    cache = model(name).new_cache("off", kv_format=kv)
    out, pos = [], 0
    for n in schedule:
        out.append(model(name).forward_chunk(cache, tokens[pos : pos + n]).numpy())
        pos += n
    return np.concatenate(out, axis=0)


def reference_greedy(name: str, tokens: list[int], kv: str) -> list[int]:
    m = model(name)
    cache = m.new_cache("off", kv_format=kv)
    logits = m.forward_chunk(cache, tokens)
    out = []
    for _ in range(GREEDY_TOKENS):
        out.append(int(torch.argmax(logits[-1])))
        logits = m.forward_chunk(cache, [out[-1]])
    return out


def assert_greedy_tracks(name: str, tokens: list[int], greedy: list[int], kv: str) -> None:
    m = model(name)
    want = qkv.teacher_forced_logprobs(m, m.new_cache("off", kv_format=kv), tokens, greedy)
    flips = qkv.greedy_flips(want, greedy, f"config {name}, {kv} KV")
    assert len(flips) <= qkv.MAX_FLIPS, flips


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_fp8_kv_matches_the_emulating_reference(name: str, schedule: str, tmp_path_factory):
    tokens = prompt(name)
    ours = engine(name, "fp8", tmp_path_factory).run_schedule(tokens, SCHEDULES[schedule])
    want = reference(name, tokens, SCHEDULES[schedule], "fp8")
    qkv.assert_logits_track(ours, want, f"config {name}, {schedule}, fp8 KV")


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_v41_quantized_kv_greedy_and_drift(name: str, kv: str, tmp_path_factory) -> None:
    tokens = prompt(name)
    d = engine(name, kv, tmp_path_factory)
    ours = d.run_schedule(tokens, CHUNKS)
    want = reference(name, tokens, CHUNKS, kv)
    qkv.assert_logits_track(ours, want, f"config {name}, chunked, {kv} KV")
    greedy = d.greedy(tokens, GREEDY_TOKENS)
    assert_greedy_tracks(name, tokens, greedy, kv)
    # Reported, not held: how far the format moves the logits from f32 KV.
    f32 = reference(name, tokens, CHUNKS, "f32")
    drift = float(np.abs(ours - f32).max() / np.abs(f32).max())
    greedy_f32 = reference_greedy(name, tokens, "f32")
    same = sum(a == b for a, b in zip(greedy, greedy_f32, strict=True))
    print(
        f"\nV4.1 config {name}, {kv} KV vs f32 KV: max |d| / max |logit| = {drift:.2e}; "
        f"greedy {same}/{GREEDY_TOKENS} tokens equal"
    )


@pytest.mark.parametrize(("kv", "other"), [("fp8", "bf16"), ("bf16", "f32")])
@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_quantized_checks_reject_another_format(name: str, kv: str, other: str, tmp_path_factory):
    """quantized_kv_checks' allowance for flips does not let a format pass for another: the
    engine's logits with ``kv`` keys against the reference reading ``other`` keys fail."""
    tokens = prompt(name)
    ours = engine(name, kv, tmp_path_factory).run_schedule(tokens, CHUNKS)
    with pytest.raises(AssertionError, match="of the rows within"):
        qkv.assert_logits_track(ours, reference(name, tokens, CHUNKS, other), f"{kv} vs {other}")
