"""The extension module exports its init function only.

Whatever it links in from static archives (libdeepinfer, nanobind, a statically linked C++
runtime) must stay private: exported C++ runtime symbols bind other libraries of the process to
this module's copy (tests/gpu/test_import_order.py has the crash that caused).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import deepinfer_core
import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol tables only")
@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_only_the_init_function_is_exported() -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", deepinfer_core.__file__],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = [line.split()[-1] for line in out.splitlines() if line.strip()]
    extra = [name for name in exported if name != "PyInit_deepinfer_core"]
    assert "PyInit_deepinfer_core" in exported
    assert not extra, f"{len(extra)} more exported symbols, e.g. {extra[:10]}"
