"""GPU tests run on the device machine (an H200) behind the `gpu` marker; elsewhere they skip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The parity helpers (v4_reference, runner_driver) live with the CPU tests.
sys.path.insert(0, str(Path(__file__).parent.parent / "python"))


def _why_no_gpu() -> str | None:
    """None when this build has the CUDA backend and a GPU is present, else why not."""
    import deepinfer_core

    if not deepinfer_core.backend_available("cuda"):
        return "deepinfer_core was built without the CUDA backend"
    if deepinfer_core.resolve_device("auto") != "cuda":
        return "the CUDA backend is built but no GPU is present"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    why = _why_no_gpu()
    if why is None:
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
