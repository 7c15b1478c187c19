// The row store of ring_write and scatter_rows: one block stores one row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cache/kv_record.cuh"

namespace deepinfer::cuda {

// Threads of a one-row-per-block store (a multiple of 32, as encode_kv_row needs).
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

// Stores the f32 row src (f.dim floats) as one cache row of format f at dst: f32 rows are
// copied (vec4 as in copy_row), bf16 and fp8 rows encoded.
__device__ __forceinline__ void store_kv_row(uint8_t* __restrict__ dst,
                                             const float* __restrict__ src, const KvRowFormat& f,
                                             bool vec4) {
  if (f.format == KvFormat::kF32) {
    copy_row(reinterpret_cast<float*>(dst), src, f.dim, vec4);
  } else {
    encode_kv_row(src, dst, f);
  }
}

}  // namespace deepinfer::cuda
