// The arithmetic of rms_norm on the CUDA backend (rms_norm.cu), shared by the kernels that norm a
// row as they make it (hc_fused.cu): the CPU reference's (cpp/src/backend/cpu_ops_dense.cpp)
// y = x * (1 / sqrt(float(mean(x^2)) + eps)) [* w], the sum of squares in double (each square is
// exact in double, so only the order of the additions differs from the CPU's).
#pragma once

#include <cstdint>

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

// (x * inv) * w in this order, as the CPU (two roundings; nvcc does not fuse two products).
__device__ __forceinline__ float4 norm_scale(float4 v, float inv, float4 g) {
  return make_float4((v.x * inv) * g.x, (v.y * inv) * g.y, (v.z * inv) * g.z, (v.w * inv) * g.w);
}
__device__ __forceinline__ float4 norm_scale(float4 v, float inv) {
  return make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
}

}  // namespace deepinfer::cuda
