"""One process, any import order: deepinfer_core and torch (CUDA) imported either way round.

On the GPU machine `import deepinfer_core; import torch` used to crash inside torch's import:
the toolchain there links libstdc++ statically, and the module exported that copy's unique
symbols, which then bound torch's libraries to it (bindings/CMakeLists.txt). Each order runs in
its own interpreter, and both libraries then do CUDA work.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

WORK = (
    "import deepinfer_core as dc, torch\n"
    "assert dc.backend_available('cuda')\n"
    "x = torch.randn(256, 256, device='cuda')\n"
    "assert torch.allclose(x @ torch.eye(256, device='cuda'), x)\n"
    "print(dc.build_info()['version'], torch.__version__, f'{1.5:.3f}')\n"
)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "first", ["import deepinfer_core", "import torch"], ids=["deepinfer_first", "torch_first"]
)
def test_import_order(first: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"{first}\n{WORK}"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
