"""deepinfer: an inference engine for DeepSeek-V4-family models.

The heavy lifting lives in the C++ core, exposed as the extension module ``deepinfer_core``.
"""

from __future__ import annotations

import deepinfer_core as _core

__version__: str = _core.build_info()["version"]


def build_info() -> dict:
    """Version, compiled backends, compiler and build type of the C++ core."""
    return _core.build_info()


__all__ = ["__version__", "build_info"]
