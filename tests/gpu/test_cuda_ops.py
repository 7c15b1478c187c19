"""Every CUDA op against the CPU reference op on random inputs, at tiny and V4-Flash widths: the
GoogleTest binary deepinfer_gpu_tests (tests/gpu/cpp), run here so one pytest run reports it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def find_binary() -> Path | None:
    env = os.environ.get("DEEPINFER_GPU_TESTS")
    if env:
        return Path(env)
    hits = sorted(ROOT.glob("build/**/tests/gpu/cpp/deepinfer_gpu_tests"))
    return hits[0] if hits else None


@pytest.mark.gpu
def test_cuda_ops_match_cpu() -> None:
    binary = find_binary()
    if binary is None or not binary.exists():
        pytest.skip(
            "deepinfer_gpu_tests not built: configure with -DDEEPINFER_CUDA=ON "
            "-DDEEPINFER_BUILD_TESTS=ON (or set DEEPINFER_GPU_TESTS to its path)"
        )
    run = subprocess.run(
        [str(binary), "--gtest_brief=1"], capture_output=True, text=True, timeout=1800
    )
    print(run.stdout[-20000:])
    print(run.stderr[-5000:])
    assert run.returncode == 0, f"{binary} failed:\n{run.stdout[-5000:]}"
