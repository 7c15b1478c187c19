from __future__ import annotations

import sys
from pathlib import Path

# Helper modules (v4_reference, runner_driver) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))

import pytest


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch on one thread for a test module (`pytestmark = pytest.mark.usefixtures(...)`): the
    references' tiny ops run far faster so, and intra-op threads that spin on a busy 2-core
    machine make them 10-100x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """The embedded tiny default checkpoint (generated into the deepinfer cache on first use)."""
    from deepinfer.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint()


# SDK clients of the module's `server` fixture (each server test module starts its own server
# with the flags it needs and defines `server`; these clients follow it).
@pytest.fixture
def oai(server: str):
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def claude(server: str):
    import anthropic

    return anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)
