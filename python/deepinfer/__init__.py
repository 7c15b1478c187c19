"""deepinfer: an inference engine for DeepSeek-V4-family models.

The engine lives in the C++ core, exposed as the extension module ``deepinfer_core``; this
package adds configuration loading, tokenization and the offline ``LLM`` API.
"""

from __future__ import annotations

import deepinfer_core as _core

from deepinfer.config import RunConfig, SamplingParams, load_config
from deepinfer.llm import LLM, CompletionOutput

__version__: str = _core.build_info()["version"]


def build_info() -> dict:
    """Version, compiled backends, compiler and build type of the C++ core."""
    return _core.build_info()


# The engine options (defaults from C++); a RunConfig's `engine`.
EngineConfig = _core.EngineConfig

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "RunConfig",
    "SamplingParams",
    "__version__",
    "build_info",
    "load_config",
]
