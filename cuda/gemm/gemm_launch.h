// The launches of the gemm family that linear.cu composes with its cuBLAS calls.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/gemm/gemv_heuristics.h"

namespace deepinfer::cuda {

// y = x . w^T per group by the bf16 GEMV (gemv_bf16.cu), for a config with c.use.
void launch_gemv_bf16(const float* x, const __nv_bfloat16* w, float* y, const GemvProblem& p,
                      const GemvConfig& c, cudaStream_t stream);

}  // namespace deepinfer::cuda
