"""Prints the C++ literals of tests/cpp/test_cpu_v41_ops.cpp from the V4.1 torch reference.

Run: ``python3 tests/python/v41_op_fixtures.py`` (system python3 with torch and numpy). The
inputs are exact binary fractions from ``pat`` (the C++ test computes the same formula), so both
sides start from identical fp32 values; every expected value comes from a function of
``v41_reference.py`` (``V41Model.hc_mix``), called on a stand-in ``self`` that holds only what
the method reads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import v41_reference as ref


def pat(i: int, a: int, b: int) -> float:
    """((i*a + b) mod 97 - 48) / 64: exact in fp32, the same formula as the C++ test's."""
    return ((i * a + b) % 97 - 48) / 64.0


def pats(n: int, a: int, b: int, shape) -> torch.Tensor:
    return torch.tensor([pat(i, a, b) for i in range(n)], dtype=torch.float32).view(*shape)


def cpp_float(v: float) -> str:
    s = f"{v:.9g}"
    return (s if any(c in s for c in ".e") else s + ".0") + "f"


def cpp_floats(name: str, t: torch.Tensor) -> str:
    vals = ", ".join(cpp_float(v) for v in t.flatten().tolist())
    return f"const std::vector<float> {name} = {{{vals}}};"


def cpp_ints(name: str, t, kind: str = "int32_t") -> str:
    vals = ", ".join(str(int(v)) for v in (t.flatten().tolist() if torch.is_tensor(t) else t))
    return f"const std::vector<{kind}> {name} = {{{vals}}};"


def shifted_hc() -> None:
    """Two shifted sub-layers and the final collapse (C.4): T 2, N 4, H 2."""
    t, n, h = 2, 4, 2
    cfg = SimpleNamespace(hc_mult=n, rms_norm_eps=1e-20, hc_eps=1e-6, hc_sinkhorn_iters=20)
    model = SimpleNamespace(cfg=cfg)
    rows = (2 + n) * n
    block = SimpleNamespace(
        hc_attn_fn=pats(rows * n * h, 31, 7, (rows, n * h)),
        hc_attn_base=pats(rows, 13, 5, (rows,)),
        hc_attn_scale=torch.tensor([0.75, 1.25, 0.5]),
        hc_ffn_fn=pats(rows * n * h, 29, 3, (rows, n * h)),
        hc_ffn_base=pats(rows, 11, 17, (rows,)),
        hc_ffn_scale=torch.tensor([1.5, 0.625, 1.0]),
    )
    emb = pats(t * h, 37, 11, (t, h))
    outs = [pats(t * h, 23, 41, (t, h)), pats(t * h, 19, 2, (t, h))]
    trunk = emb[:, None, :].expand(t, n, h).clone()
    pre_prev = torch.zeros(t, n)
    pre_prev[:, 0] = 1.0  # C.4: the first sub-layer reads stream 0
    for k, part in enumerate(("attn", "ffn")):
        pre, post, comb = ref.V41Model.hc_mix(model, block, part, trunk)
        y = (pre_prev[..., None] * trunk).sum(1)  # forward_chunk's collapse
        print(cpp_floats(f"kWantPre{k}", pre))
        print(cpp_floats(f"kWantPost{k}", post))
        print(cpp_floats(f"kWantComb{k}", comb))
        print(cpp_floats(f"kWantY{k}", y))
        a = outs[k]  # stands in for the sub-block's output
        trunk = post[..., None] * a[:, None, :] + torch.einsum("sij,sih->sjh", comb, trunk)
        pre_prev = pre
    print(cpp_floats("kWantH", (pre_prev[..., None] * trunk).sum(1)))


if __name__ == "__main__":
    torch.set_printoptions(precision=9)
    for fixture in (shifted_hc,):
        print(f"// ---- {fixture.__name__}")
        fixture()
