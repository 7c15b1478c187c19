// The mHC weights of one token and the CPU's rounding, shared by the hc kernels (hc_pre.cu,
// hc_post.cu, hc_fused.cu, hc_mix.cu). Products that feed sums are rounded separately (__fmul_rn /
// __fadd_rn) because the CPU build has no FMA contraction, and every sum runs in the CPU's order;
// the weights, the collapse and hc_post are then the CPU's arithmetic exactly (expf is within
// 2 ulp of glibc's).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/activation.cuh"
#include "cuda/hc/hc_heuristics.h"

namespace deepinfer::cuda {

// a * b + c with the product rounded first (no FMA), as the CPU computes it.
__device__ __forceinline__ float mul_add_rn(float a, float b, float c) {
  return __fadd_rn(__fmul_rn(a, b), c);
}

// mHC weights of one token from its row of mix:
//   pre[s]  = sigmoid(mix[s] * scale[0] + base[s]) + eps
//   post[s] = 2 * sigmoid(mix[n + s] * scale[1] + base[n + s])
//   comb    = softmax over j of (mix[2n + i*n + j] * scale[2] + base[...]) + eps, then Sinkhorn:
//             columns once, then (rows, columns) iters - 1 times, each dividing by (sum + eps).
// Every sum runs in the CPU's order (index ascending, from 0.0f) so the results are the CPU's.
__device__ __forceinline__ float hc_pre_weight(const float* __restrict__ m,
                                               const float* __restrict__ base, float scale0, int s,
                                               float eps) {
  return sigmoid(mul_add_rn(m[s], scale0, base[s])) + eps;
}

// Sum of row `row` / column `col` of the N x N matrix held one element per lane (lane = i*N + j),
// index ascending as the CPU sums. Every lane of the warp must call these (full-mask shuffles).
template <int N>
__device__ __forceinline__ float warp_row_sum(float v, int row) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) sum += __shfl_sync(0xffffffffu, v, row * N + j);
  return sum;
}
template <int N>
__device__ __forceinline__ float warp_col_sum(float v, int col) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += __shfl_sync(0xffffffffu, v, i * N + col);
  return sum;
}

// post and comb (and pre, when `pre` is not null) of one token by one whole warp (N * N <= 32):
// lane i*N + j owns comb[i][j]; the row / column sums gather the N elements by shuffles. Lanes
// past N * N shadow element 0 (so every shuffle reads a real element) and write nothing.
template <int N>
__device__ void hc_comb_warp(const float* __restrict__ m, const float* __restrict__ base,
                             const float* __restrict__ scale, int iters, float eps,
                             float* __restrict__ pre, float* __restrict__ post,
                             float* __restrict__ comb) {
  static_assert(N >= 1 && N * N <= 32, "one element per lane");
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane < N) post[lane] = 2.0f * sigmoid(mul_add_rn(m[N + lane], scale[1], base[N + lane]));
  if (pre != nullptr && lane < N) pre[lane] = hc_pre_weight(m, base, scale[0], lane, eps);
  const bool owner = lane < N * N;
  const int e = owner ? lane : 0;
  const int row = e / N;
  const int col = e % N;
  const float logit = mul_add_rn(m[2 * N + e], scale[2], base[2 * N + e]);
  float mx = __shfl_sync(0xffffffffu, logit, row * N);
#pragma unroll
  for (int j = 1; j < N; ++j) mx = fmaxf(mx, __shfl_sync(0xffffffffu, logit, row * N + j));
  const float ex = expf(logit - mx);
  float v = ex / warp_row_sum<N>(ex, row) + eps;
  v = v / (warp_col_sum<N>(v, col) + eps);
  for (int it = 1; it < iters; ++it) {
    v = v / (warp_row_sum<N>(v, row) + eps);
    v = v / (warp_col_sum<N>(v, col) + eps);
  }
  if (owner) comb[lane] = v;
}

// Channels [h, h + 4) of stream s of token t's updated trunk (hc_post's formula in the CPU's order
// and rounding; n <= kHcFusedMaxN): post[s] * out[h] + sum_i comb[i][s] * X[i][h], i ascending.
// xt / ot: the token's X [n, hidden] and out [hidden]; pw / cw: its post [n] and comb [n * n].
__device__ __forceinline__ float4 hc_post_quad(const float* __restrict__ xt,
                                               const float* __restrict__ ot, const float* pw,
                                               const float* cw, int n, int s, int64_t hidden,
                                               int64_t h) {
  const float4 o = __ldg(reinterpret_cast<const float4*>(ot + h));
  float4 xs[kHcFusedMaxN];
#pragma unroll
  for (int i = 0; i < kHcFusedMaxN; ++i) {
    if (i < n) xs[i] = __ldg(reinterpret_cast<const float4*>(xt + i * hidden + h));
  }
  const float p = pw[s];
  float4 v =
      make_float4(__fmul_rn(p, o.x), __fmul_rn(p, o.y), __fmul_rn(p, o.z), __fmul_rn(p, o.w));
#pragma unroll
  for (int i = 0; i < kHcFusedMaxN; ++i) {
    if (i < n) {
      const float c = cw[i * n + s];
      v.x = mul_add_rn(c, xs[i].x, v.x);
      v.y = mul_add_rn(c, xs[i].y, v.y);
      v.z = mul_add_rn(c, xs[i].z, v.z);
      v.w = mul_add_rn(c, xs[i].w, v.w);
    }
  }
  return v;
}

}  // namespace deepinfer::cuda
