"""The CUDA backend against the CPU reference, run here so one pytest run reports them: the
backend op table (tests/backend_ops, binary deepinfer_backend_ops: every op on random inputs at
tiny and V4-Flash widths) and the CUDA-only GoogleTest binary (tests/gpu/cpp,
deepinfer_gpu_tests: behaviour with no CPU counterpart). Both fail rather than skip when the CUDA
backend cannot be created (DEEPINFER_REQUIRE_DEVICE)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def find_binary(env_var: str, relative: str) -> Path | None:
    env = os.environ.get(env_var)
    if env:
        return Path(env)
    hits = sorted(ROOT.glob(f"build/**/{relative}"))
    return hits[0] if hits else None


def run_gtest(env_var: str, relative: str) -> None:
    binary = find_binary(env_var, relative)
    if binary is None or not binary.exists():
        pytest.skip(
            f"{Path(relative).name} not built: configure with -DDEEPINFER_CUDA=ON "
            f"-DDEEPINFER_BUILD_TESTS=ON (or set {env_var} to its path)"
        )
    run = subprocess.run(
        [str(binary), "--gtest_brief=1"],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "DEEPINFER_REQUIRE_DEVICE": "1"},
    )
    print(run.stdout[-20000:])
    print(run.stderr[-5000:])
    assert run.returncode == 0, f"{binary} failed:\n{run.stdout[-5000:]}"


@pytest.mark.gpu
def test_cuda_ops_match_cpu() -> None:
    run_gtest("DEEPINFER_BACKEND_OPS", "tests/backend_ops/deepinfer_backend_ops")


@pytest.mark.gpu
def test_cuda_only_behaviour() -> None:
    run_gtest("DEEPINFER_GPU_TESTS", "tests/gpu/cpp/deepinfer_gpu_tests")
