"""GPU tests run on the device machine (an H200) behind the `gpu` marker; elsewhere they skip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The parity helpers (v4_reference, runner_driver) live with the CPU tests.
sys.path.insert(0, str(Path(__file__).parent.parent / "python"))


def _cuda_available() -> bool:
    import deepinfer_core

    return deepinfer_core.backend_available("cuda")


def pytest_collection_modifyitems(config, items) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(
        reason="deepinfer_core was built without the CUDA backend (no GPU here)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
