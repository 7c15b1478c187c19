"""GPU tests run on the device machine (an H200) behind the `gpu` marker; elsewhere they skip."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    import deepinfer_core

    return "cuda" in deepinfer_core.build_info()["backends"]


def pytest_collection_modifyitems(config, items) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(
        reason="deepinfer_core was built without the CUDA backend (no GPU here)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
