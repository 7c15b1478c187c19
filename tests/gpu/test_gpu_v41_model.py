"""DeepSeek-V4.1 on the CUDA backend against the CPU reference backend: the same tiny fp32
checkpoints as tests/python/test_v41_parity.py (configs A, B, C), f32 KV, logits of a chunked
schedule within 1e-4 * max |logit| and identical greedy continuations. Prints the measured error
(`-s` shows it)."""

from __future__ import annotations

import numpy as np
import pytest
import v41_reference as ref
from runner_driver import RunnerDriver
from test_v41_parity import CHUNKS, PROMPT_LEN, assert_close, prompt, write_checkpoint

pytestmark = pytest.mark.gpu
GREEDY_TOKENS = 16


def driver(path: str, device: str) -> RunnerDriver:
    return RunnerDriver(
        path, max_seqs=1, max_len=PROMPT_LEN + 64, device=device, activation_quant="none"
    )


@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_gpu_v41_matches_cpu(name: str, tmp_path) -> None:
    path = str(write_checkpoint(ref.V41Model(ref.TINY_CONFIGS[name], seed=0), tmp_path / name))
    tokens = prompt(name)
    cpu = driver(path, "cpu")
    want = cpu.run_schedule(tokens, CHUNKS)
    ours = driver(path, "cuda").run_schedule(tokens, CHUNKS)
    assert np.isfinite(ours).all()
    rel = float(np.abs(ours - want).max() / np.abs(want).max())
    greedy_gpu = driver(path, "cuda").greedy(tokens, GREEDY_TOKENS)
    greedy_cpu = cpu.greedy(tokens, GREEDY_TOKENS)
    same = sum(a == b for a, b in zip(greedy_gpu, greedy_cpu, strict=True))
    print(
        f"\nV41-GPU config {name}: max|cuda - cpu| / max|cpu| = {rel:.2e} over {ours.shape[0]} "
        f"positions; greedy {same}/{len(greedy_cpu)} identical"
    )
    assert_close(ours, want, f"config {name}, cuda vs cpu")
    assert greedy_gpu == greedy_cpu


@pytest.mark.parametrize("mode", ["mask", "compact"])
@pytest.mark.parametrize("name", ["A", "B"])
def test_gpu_v41_yoco_truncation_matches_cpu(name: str, mode: str, tmp_path) -> None:
    """YOCO prefill truncation (docs/model.md#yoco-prefill-truncation) on CUDA: the attention
    kernels' swa_start bound and compact's dropped rows, chunked with every chunk naming the
    prefill's end; compact's dropped rows are NaN on both."""
    cfg = ref.TINY_CONFIGS[name]
    path = str(write_checkpoint(ref.V41Model(cfg, seed=0), tmp_path / name))
    tokens = prompt(name)
    options = {
        "yoco_prefill_truncation": mode,
        "yoco_keep_tokens": cfg.yoco_keep_tokens,
        "max_backtrack": 1,  # keep >= sliding_window + max_backtrack on the tiny configs
    }

    def run(device: str) -> RunnerDriver:
        return RunnerDriver(
            path,
            max_seqs=1,
            max_len=PROMPT_LEN + 64,
            device=device,
            activation_quant="none",
            **options,
        )

    want = run("cpu").run_schedule(tokens, CHUNKS, prompt_end=PROMPT_LEN)
    ours = run("cuda").run_schedule(tokens, CHUNKS, prompt_end=PROMPT_LEN)
    kept = ~np.isnan(want).any(-1)
    assert np.array_equal(kept, ~np.isnan(ours).any(-1))
    assert kept.sum() >= cfg.yoco_keep_tokens
    rel = float(np.abs(ours[kept] - want[kept]).max() / np.abs(want[kept]).max())
    greedy_gpu = run("cuda").greedy(tokens, GREEDY_TOKENS)
    greedy_cpu = run("cpu").greedy(tokens, GREEDY_TOKENS)
    print(f"\nV41-GPU YOCO {mode} config {name}: max|cuda - cpu| / max|cpu| = {rel:.2e} (kept)")
    assert_close(ours[kept], want[kept], f"config {name}, yoco {mode}, cuda vs cpu")
    assert greedy_gpu == greedy_cpu
