// Element and vector loads for f32 and bf16 storage, bf16 packing and products, float4
// arithmetic, and the MUFU's 2^x.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace deepinfer::cuda {

// Element access that works for f32 and bf16 storage.
__device__ __forceinline__ float load_as_float(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// Elements of W in one 16-byte load.
template <typename W>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int kN = 4;
};
template <>
struct Vec16<__nv_bfloat16> {
  static constexpr int kN = 8;
};

// One read-only 16-byte load of W, widened to f32 (p 16-byte aligned).
__device__ __forceinline__ void load16(const float* p, float (&v)[4]) {
  const float4 q = __ldg(reinterpret_cast<const float4*>(p));
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}

__device__ __forceinline__ void load16(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // bf16 -> f32 is exact: the bf16 bits are the high half of the f32.
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// N consecutive f32 activations (N a multiple of 4, p 16-byte aligned).
template <int N>
__device__ __forceinline__ void load_f32(const float* p, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(p) + i);
    v[4 * i] = q.x;
    v[4 * i + 1] = q.y;
    v[4 * i + 2] = q.z;
    v[4 * i + 3] = q.w;
  }
}

// Two floats as bf16x2 (round to nearest even), the first in the low half (the lower column of a
// fragment pair).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &v, sizeof(r));
  return r;
}

// bf16x2 products a * b, each half rounded to nearest even (no flush of subnormals).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x;
  __nv_bfloat162 y;
  memcpy(&x, &a, sizeof(a));
  memcpy(&y, &b, sizeof(b));
  const __nv_bfloat162 r = __hmul2(x, y);
  uint32_t out;
  memcpy(&out, &r, sizeof(out));
  return out;
}

constexpr float kLog2E = 1.4426950408889634f;

// 2^x by the MUFU (ex2.approx.ftz: about 2 ulp; 2^-inf = 0), as __expf computes e^x after its
// multiply by log2(e), without __expf's steps around results below 2^-126 (flushed to 0 here).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// acc + a * x, per component.
__device__ __forceinline__ float4 fma4(float a, float4 x, float4 acc) {
  acc.x = fmaf(a, x.x, acc.x);
  acc.y = fmaf(a, x.y, acc.y);
  acc.z = fmaf(a, x.z, acc.z);
  acc.w = fmaf(a, x.w, acc.w);
  return acc;
}

// acc + a * b, per component.
__device__ __forceinline__ float4 fma4v(float4 a, float4 b, float4 acc) {
  acc.x = fmaf(a.x, b.x, acc.x);
  acc.y = fmaf(a.y, b.y, acc.y);
  acc.z = fmaf(a.z, b.z, acc.z);
  acc.w = fmaf(a.w, b.w, acc.w);
  return acc;
}

// acc + a . b, the components in order.
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

}  // namespace deepinfer::cuda
