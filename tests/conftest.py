"""Shared by the CPU (tests/python) and GPU (tests/gpu) tests; pytest loads it first."""

from __future__ import annotations

import os

# torch's CPU numerics depend on the host's instruction set: MKL picks a code path and ATen a
# kernel set by CPU. Fixed here, before anything imports torch, so the references compute the
# same bits on every x86 host with AVX2, and a CI host's CPU does not decide which quantized-KV
# comparison meets a rounding flip (tests/python/quantized_kv_checks.py). A variable already set
# wins.
os.environ.setdefault("MKL_CBWR", "AVX2")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
