"""DeepSeek-V4.1's KV formats on the CUDA backend (docs/model.md#kv-cache-dtypes).

* bf16 KV: the CUDA engine against the CPU engine on the same tiny checkpoints (configs A, B, C),
  both with bf16 caches (the writers encode bit-identically, the readers decode exactly): logits
  of a chunked schedule within 1e-3 * max |logit| and identical greedy continuations. Not 1e-4
  as with f32 KV: the GPU's f32 GEMMs sum in another order, so a key that lands next to a bf16
  rounding midpoint may round to the neighbouring bf16 value (2^-8 relative) on one backend; the
  H200 measured 1.26e-4 on config A (8.3e-6 and 3.6e-6 on B and C) with 16/16 greedy tokens
  identical, as V4's bf16 KV measured 2.1e-4 on its tiny config (tests/gpu/test_gpu_kv_dtypes.py).
* fp8 KV (V4.1's FP8 SWA + FP4 compressed entries + FP4 index keys, which the CUDA indexer reads
  in its score kernels): the same comparison against the CPU engine with fp8 KV, logits within
  FP8_KV_TOL * max |logit| and identical greedy continuations. Both backends encode the same
  records from keys computed in a different summation order; a key channel within that
  difference of an e2m1 rounding midpoint stores one code apart (up to a third of the value),
  which bf16's 2^-8 steps never do. Measured on the H200 (2026-12-02): 8.3e-7 / 8.3e-7 / 6.6e-7
  of max |logit| on A / B / C (no code flipped there); FP8_KV_TOL is bf16's bound, which leaves
  room for a flip in one channel and still catches a wrong decode (errors of 1e-2 and up). The
  records and the indexer ops are checked op by op in tests/backend_ops (rows labelled kv_v41_ /
  kv_v41fp4_).
* kv_cache_dtype "auto" on a V4.1 checkpoint takes fp8 on a GPU (V4.1's formats, as DeepInfer
  stores them), in the engine's resolved config, and the engine generates the CPU engine's fp8
  greedy tokens.
Prints the measured error (``-s`` shows it).
"""

from __future__ import annotations

import numpy as np
import pytest
import v41_reference as ref
from runner_driver import RunnerDriver
from test_v41_parity import CHUNKS, PROMPT_LEN, prompt, write_checkpoint

pytestmark = pytest.mark.gpu
GREEDY_TOKENS = 16
BF16_KV_TOL = 1e-3  # of max |logit| (module docstring)
FP8_KV_TOL = 1e-3  # of max |logit| (module docstring)


def driver(path: str, device: str, kv: str) -> RunnerDriver:
    return RunnerDriver(
        path,
        max_seqs=1,
        max_len=PROMPT_LEN + 64,
        device=device,
        activation_quant="none",
        kv_cache_dtype=kv,
    )


@pytest.mark.parametrize(("kv", "tol"), [("bf16", BF16_KV_TOL), ("fp8", FP8_KV_TOL)])
@pytest.mark.parametrize("name", list(ref.TINY_CONFIGS))
def test_gpu_v41_kv_matches_cpu(name: str, kv: str, tol: float, tmp_path) -> None:
    path = str(write_checkpoint(ref.V41Model(ref.TINY_CONFIGS[name], seed=0), tmp_path / name))
    tokens = prompt(name)
    cpu = driver(path, "cpu", kv)
    want = cpu.run_schedule(tokens, CHUNKS)
    ours = driver(path, "cuda", kv).run_schedule(tokens, CHUNKS)
    assert np.isfinite(ours).all()
    rel = float(np.abs(ours - want).max() / np.abs(want).max())
    greedy_gpu = driver(path, "cuda", kv).greedy(tokens, GREEDY_TOKENS)
    greedy_cpu = cpu.greedy(tokens, GREEDY_TOKENS)
    same = sum(a == b for a, b in zip(greedy_gpu, greedy_cpu, strict=True))
    print(f"\nV41-GPU {kv} KV config {name}: rel {rel:.2e}; greedy {same}/{GREEDY_TOKENS}")
    assert rel <= tol, f"config {name}, cuda vs cpu, {kv} KV: {rel:.2e} > {tol}"
    assert greedy_gpu == greedy_cpu


def test_gpu_v41_auto_kv_is_fp8_and_generates_the_cpu_tokens(tmp_path) -> None:
    """kv_cache_dtype "auto" on a V4.1 checkpoint takes fp8 on a GPU, in the engine's resolved
    config, and greedy decoding gives the CPU engine's tokens with fp8 KV."""
    import deepinfer_core as dc

    path = str(write_checkpoint(ref.V41Model(ref.TINY_CONFIGS["A"], seed=0), tmp_path / "A"))
    params = dc.SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
    outs = {}
    for device, kv in (("cpu", "fp8"), ("cuda", "auto")):
        engine = dc.Engine(path, device=device, kv_cache_dtype=kv, num_kv_blocks=16)
        assert engine.config.cache.kv_cache_dtype == "fp8"
        request = engine.add_request(prompt("A"), params)
        tokens: list[int] = []
        while engine.has_unfinished():
            for o in engine.step():
                assert o.id == request
                tokens += o.tokens
        outs[device] = tokens
    print(f"\nV41-GPU engine auto (fp8): cuda {outs['cuda']}, cpu {outs['cpu']}")
    assert len(outs["cuda"]) == GREEDY_TOKENS
    assert outs["cuda"] == outs["cpu"]
