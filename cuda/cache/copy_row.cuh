// The row copy of ring_write and scatter_rows: one block copies one row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

// Threads of a one-row-per-block copy.
constexpr int kRowThreads = 128;

// Copies `width` floats; 16-byte vectors when both rows allow it.
__device__ __forceinline__ void copy_row(float* __restrict__ dst, const float* __restrict__ src,
                                         int64_t width, bool vec4) {
  if (vec4) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    const float4* s4 = reinterpret_cast<const float4*>(src);
    for (int64_t i = threadIdx.x; i < width / 4; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace deepinfer::cuda
