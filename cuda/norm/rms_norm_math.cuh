// The arithmetic of rms_norm on the CUDA backend (rms_norm.cu), shared by the kernels that norm a
// row as they make it (hc_fused.cu) or as they quantize it (the FP8 linears' RowNorm): the CPU
// reference's (cpp/src/backend/cpu_ops_dense.cpp) y = x * (1 / sqrt(float(mean(x^2)) + eps)) [* w],
// the sum of squares in double (each square is exact in double, so only the order of the
// additions differs from the CPU's).
#pragma once

#include <cstdint>

#include "cuda/common/reduce.cuh"

namespace deepinfer::cuda {

__device__ __forceinline__ double add_squares(double acc, float4 v) {
  const double a = v.x, b = v.y, c = v.z, d = v.w;
  acc += a * a;  // exact in double, so a fused multiply-add rounds the same
  acc += b * b;
  acc += c * c;
  acc += d * d;
  return acc;
}

__device__ __forceinline__ float rms_inv(double sum_squares, int64_t dim, float eps) {
  return 1.0f / sqrtf(static_cast<float>(sum_squares / static_cast<double>(dim)) + eps);
}

// 1 / rms of row [0, k) (16-byte aligned, k % 4 == 0) by one warp; every lane returns it.
__device__ __forceinline__ float warp_row_rms_inv(const float* row, int64_t k, float eps) {
  double acc = 0.0;
  for (int64_t c = 4 * static_cast<int64_t>(threadIdx.x & 31); c < k; c += 128) {
    acc = add_squares(acc, *reinterpret_cast<const float4*>(row + c));
  }
  return rms_inv(warp_sum(acc), k, eps);
}

// inv[t] = 1 / rms of row t of x (rows [0, rows), `ld` floats apart) for every row, a warp a row,
// the CTA's warps striding over them; a block barrier after (every thread must call it).
__device__ __forceinline__ void block_rows_rms_inv(float* inv, const float* x, int rows, int64_t ld,
                                                   int64_t k, float eps) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int warps = static_cast<int>(blockDim.x >> 5);
  for (int t = warp; t < rows; t += warps) {
    const float v = warp_row_rms_inv(x + t * ld, k, eps);
    if ((threadIdx.x & 31) == 0) inv[t] = v;
  }
  __syncthreads();
}

// (x * inv) * w in this order, as the CPU (two roundings; nvcc does not fuse two products).
__device__ __forceinline__ float4 norm_scale(float4 v, float inv, float4 g) {
  return make_float4((v.x * inv) * g.x, (v.y * inv) * g.y, (v.z * inv) * g.z, (v.w * inv) * g.w);
}
__device__ __forceinline__ float4 norm_scale(float4 v, float inv) {
  return make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
}

}  // namespace deepinfer::cuda
