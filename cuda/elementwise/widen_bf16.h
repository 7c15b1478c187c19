// Exact bf16 -> f32 widening on the device, for launches whose kernels read f32: the router's
// bf16 gate weights (moe/moe_route.cu) and bf16 attention queries for the kernels that take f32
// q (attention/attention.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

// out = f32(in), n elements, on `stream` (a programmatic dependent launch where `pdl`); a launch
// failure names `op`.
void launch_widen_bf16(const __nv_bfloat16* in, float* out, int64_t n, bool pdl,
                       cudaStream_t stream, const char* op);

}  // namespace deepinfer::cuda
