"""Minimal SM90-only build of upstream FlashMLA (throwaway peer build for benchmarking).

Run from the unpacked FlashMLA root:  python3 setup_sm90.py build_ext --inplace
Builds flash_mla/cuda*.so with only: sparse FP8 decode (MODEL1, h64/h128), sparse prefill
(d_qk 512, with/without topk_length), decode combine + sched-meta kernels and csrc/api/api.cpp.
Everything else the API dispatches to is stubbed by sm90_only_stubs.cpp (raises at run time).
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

root = Path(__file__).resolve().parent
cutlass = Path(os.environ.get("FLASHMLA_CUTLASS_DIR", root / "csrc" / "cutlass"))

sources = [
    "csrc/api/api.cpp",
    "csrc/sm90_only_stubs.cpp",
    "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "csrc/smxx/decode/combine/combine.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h64.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h128.cu",
    "csrc/sm90/prefill/sparse/instantiations/phase1_k512.cu",
    "csrc/sm90/prefill/sparse/instantiations/phase1_k512_topklen.cu",
]


def host_only_include_dirs():
    """Include dirs that g++ (not nvcc) needs for the .cpp files.

    CUDA 13 moved CCCL (cuda/std/...) to include/cccl, which nvcc adds by itself but torch's
    include_paths() does not; cutlass/bfloat16.h (included by api.cpp) needs it. torch's CUDA
    headers also include cusparse.h/cublas_v2.h/cusolver_common.h: if the toolkit lacks them,
    fall back to the pip nvidia-* packages that torch's CUDA wheel depends on.
    """
    dirs = []
    cuda_inc = Path(CUDA_HOME or os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"
    if (cuda_inc / "cccl" / "cuda" / "std").is_dir():
        dirs.append(cuda_inc / "cccl")
    wanted = ["cusparse.h", "cublas_v2.h", "cublasLt.h", "cusolver_common.h", "cusolverDn.h"]
    missing = [h for h in wanted if not (cuda_inc / h).is_file()]
    if missing:
        roots = [Path(p) / "nvidia" for p in sys.path if p and (Path(p) / "nvidia").is_dir()]
        for header in missing:
            hits = sorted({h.parent for r in roots for h in r.glob(f"**/include/{header}")})
            print(
                f"[setup_sm90] {header} not in {cuda_inc}; "
                f"pip candidates: {[str(h) for h in hits]}",
                flush=True,
            )
            dirs.extend(h for h in hits if h not in dirs)
    return [str(d) for d in dirs]


cxx_args = [
    "-O3",
    "-g0",
    "-std=c++20",
    "-DNDEBUG",
    "-Wno-deprecated-declarations",
]  # -g0: python CFLAGS carry -g
for d in host_only_include_dirs():
    cxx_args += ["-isystem", d]
print(f"[setup_sm90] CUDA_HOME={CUDA_HOME} cxx_args={cxx_args}", flush=True)
nvcc_args = [
    "-O3",
    "-std=c++20",
    "-DNDEBUG",
    "-D_USE_MATH_DEFINES",
    "-Wno-deprecated-declarations",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    # Same ptxas settings as upstream setup.py; -v prints registers/spills into the build log.
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage",
    # An explicit -gencode also stops torch from adding its own arch flags.
    "-gencode",
    "arch=compute_90a,code=sm_90a",
]

setup(
    name="flash_mla_sm90_peer",
    version="0.0.0",
    ext_modules=[
        CUDAExtension(
            name="flash_mla.cuda",
            sources=sources,
            extra_compile_args={"cxx": cxx_args, "nvcc": nvcc_args},
            include_dirs=[
                str(root / "csrc"),
                str(root / "csrc" / "kerutils" / "include"),
                str(root / "csrc" / "sm90"),
                str(cutlass / "include"),
                str(cutlass / "tools" / "util" / "include"),
            ],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
