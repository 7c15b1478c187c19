from __future__ import annotations

import sys
from pathlib import Path

# Helper modules (v4_reference, runner_driver) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """The embedded tiny default checkpoint (generated into the deepinfer cache on first use)."""
    from deepinfer.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint()
