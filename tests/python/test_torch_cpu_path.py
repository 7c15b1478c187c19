"""tests/conftest.py fixes torch's CPU code path before torch is imported; this fails if something
imports torch earlier (a plugin, a conftest) and the host's CPU picks the path again."""

from __future__ import annotations

import os

import pytest
import torch


def test_aten_kernels_follow_the_pinned_capability() -> None:
    want = os.environ["ATEN_CPU_CAPABILITY"].upper()
    got = torch.backends.cpu.get_cpu_capability()
    # A host without the pinned set falls back to a lower one; never to a higher one.
    order = ["DEFAULT", "AVX2", "AVX512"]
    if got not in order:
        pytest.skip(f"not an x86 host: ATen kernels {got}")
    assert order.index(got) <= order.index(want), f"ATen kernels {got}, pinned {want}"
    assert os.environ["MKL_CBWR"], "MKL_CBWR is not set"
