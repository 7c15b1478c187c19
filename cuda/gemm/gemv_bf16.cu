// The decode GEMV of linear / grouped_linear: bf16 weights, f32 activations, few tokens.
//
// For M <= kGemvMaxTokens tokens and bf16 weights, one kernel reads the f32 activations as they
// are (no cast kernel, no bf16 rounding of x) and streams each weight row once: products of f32 x
// and the exactly widened bf16 weight, accumulated in f32 (as the CPU op on the bf16 weight's
// values, up to summation order).
//
// Layout: a warp is four 8-lane subgroups; lane l8 of a subgroup loads the 8 weights [k, k + 8),
// k = 64 b + 8 l8, of block b of its rows with one 16-byte load, so each load instruction of the
// warp reads 128 contiguous bytes of 4 rows, and the 4 subgroups read the same x (broadcast). A
// lane owns R rows (the warp 4 R; R = 2, or 1 when N is too small for 2 CTAs per SM) and all M
// tokens: every weight vector serves M tokens and every x vector R rows. x goes through L1
// (ld.global.nc; the weights bypass L1 allocation), the whole [M, K] slice being too large for
// shared memory at K = 8192, M = 16. A CTA has 8 warps: S of them (1, 2, 4, 8) split the K blocks
// of the same 4 R rows (for small N the CTAs would not fill the GPU otherwise), so a CTA covers 32
// R / S rows of one group; grid (row tiles, groups). Summation order of y[m, n], fixed by (N, K, G)
// alone (S and the split points are chosen without M, so a token's result does not depend on the
// other tokens): each lane over its k ascending (one f32 FMA chain), then the 8 lanes of the
// subgroup by an xor butterfly (4, 2, 1), then the S warps in ascending order through shared
// memory. No atomics: results are bitwise reproducible. Rows past N read row N - 1 and are not
// stored; tokens past M are skipped (warp-uniform).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/gemm/gemm_launch.h"

namespace deepinfer::cuda {

namespace {

// 16 bytes of weights, read-only, not allocated in L1 (which keeps x).
__device__ __forceinline__ uint4 load_weights16(const __nv_bfloat16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// acc[r][m] += w_r[k + i] * x_m[k + i], i = 0..7 in order, for U consecutive blocks of the lane
// (k = k0 + 64 u); blocks with k >= K are skipped.
template <int MT, int R, int U>
__device__ __forceinline__ void gemv_blocks(const __nv_bfloat16* const (&w)[R], const float* x,
                                            int64_t ldx, int m_count, int64_t k0, int64_t K,
                                            float (&acc)[R][MT]) {
  uint4 raw[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t k = k0 + static_cast<int64_t>(u) * kGemvBlockK;
#pragma unroll
    for (int r = 0; r < R; ++r) raw[u][r] = k < K ? load_weights16(w[r] + k) : uint4{0, 0, 0, 0};
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t k = k0 + static_cast<int64_t>(u) * kGemvBlockK;
    if (k < K) {
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t words[4] = {raw[u][r].x, raw[u][r].y, raw[u][r].z, raw[u][r].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // bf16 -> f32 is exact: the bf16 bits are the high half
          wf[r][2 * i] = __uint_as_float(words[i] << 16);
          wf[r][2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < m_count) {
          const float4* xp = reinterpret_cast<const float4*>(x + m * ldx + k);
          const float4 a = __ldg(xp);
          const float4 b = __ldg(xp + 1);
          const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][m] = fmaf(wf[r][i], xv[i], acc[r][m]);
          }
        }
      }
    }
  }
}

template <int MT, int R>
__global__ void __launch_bounds__(kGemvThreads, 2) gemv_bf16_kernel(GemvArgs a) {
  __shared__ float part[kGemvWarps][4][R][MT];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int sub = lane >> 3;
  const int l8 = lane & 7;
  const int S = a.splits;
  const int s = warp % S;
  const int rows_cta = (kGemvWarps / S) * 4 * R;
  const int64_t g = blockIdx.y;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * rows_cta;
  const int64_t row0 = tile0 + (warp / S) * 4 * R + sub * R;
  const __nv_bfloat16* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = a.w + (g * a.n + min(row0 + r, a.n - 1)) * a.k;
  const float* x = a.x + g * a.k;
  const int64_t nblk = (a.k + kGemvBlockK - 1) / kGemvBlockK;
  const int64_t b0 = s * nblk / S;
  const int64_t b1 = (s + 1) * nblk / S;
  // Before the wait for the previous kernel (weights are never written by one): the first
  // blocks' lines of the rows into L2, one 128-byte line per row and block.
  if (b0 + l8 < b1 && l8 < kGemvUnroll) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      prefetch_l2(w[r] + (b0 + l8) * kGemvBlockK);
    }
  }
  enter_dependent_grid();
  float acc[R][MT] = {};
  const int64_t lane_k = static_cast<int64_t>(l8) * 8;
  // Fewer blocks in flight with more tokens (registers: their x vectors; more FMAs per load).
  constexpr int kU = MT >= 8 ? 2 : kGemvUnroll;
  int64_t b = b0;
  for (; b + kU <= b1; b += kU) {
    gemv_blocks<MT, R, kU>(w, x, a.ldx, a.m, b * kGemvBlockK + lane_k, a.k, acc);
  }
  for (; b < b1; ++b) {
    gemv_blocks<MT, R, 1>(w, x, a.ldx, a.m, b * kGemvBlockK + lane_k, a.k, acc);
  }
  // Subgroup sums by an xor butterfly: v + partner on both sides, so all 8 lanes end with the
  // same bits. Every lane of the warp takes part (no early exit above).
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      if (((r * MT + m) & 7) == l8) part[warp][sub][r][m] = v;
    }
  }
  __syncthreads();
  // y[m, n]: the S warps of the row group in ascending order.
  for (int i = static_cast<int>(threadIdx.x); i < rows_cta * a.m; i += kGemvThreads) {
    const int m = i / rows_cta;
    const int lr = i % rows_cta;  // = row group * 4 R + sub * R + r
    const int rg = lr / (4 * R);
    const int sb = (lr / R) % 4;
    const int r = lr % R;
    float v = part[rg * S][sb][r][m];
    for (int j = 1; j < S; ++j) v += part[rg * S + j][sb][r][m];
    const int64_t n = tile0 + lr;
    if (n < a.n) a.y[m * a.ldy + g * a.n + n] = v;
  }
}

template <int R>
void launch_gemv_r(const GemvArgs& a, dim3 grid, bool pdl, cudaStream_t stream) {
  const char* op = "linear (bf16 gemv)";
  const dim3 block(kGemvThreads);
  if (a.m <= 1) {
    launch_programmatic(op, grid, block, 0, stream, pdl, gemv_bf16_kernel<1, R>, a);
  } else if (a.m <= 2) {
    launch_programmatic(op, grid, block, 0, stream, pdl, gemv_bf16_kernel<2, R>, a);
  } else if (a.m <= 4) {
    launch_programmatic(op, grid, block, 0, stream, pdl, gemv_bf16_kernel<4, R>, a);
  } else if (a.m <= 8) {
    launch_programmatic(op, grid, block, 0, stream, pdl, gemv_bf16_kernel<8, R>, a);
  } else {
    launch_programmatic(op, grid, block, 0, stream, pdl, gemv_bf16_kernel<16, R>, a);
  }
}

}  // namespace

void launch_gemv_bf16(const float* x, const __nv_bfloat16* w, float* y, const GemvProblem& p,
                      const GemvConfig& c, bool pdl, cudaStream_t stream) {
  GemvArgs a;
  a.x = x;
  a.w = w;
  a.y = y;
  a.ldx = p.groups * p.k;
  a.ldy = p.groups * p.n;
  a.n = p.n;
  a.k = p.k;
  a.m = static_cast<int>(p.m);
  a.splits = c.splits;
  const dim3 grid(static_cast<unsigned>(c.row_tiles), static_cast<unsigned>(p.groups));
  if (c.rows_per_lane == 2) {
    launch_gemv_r<2>(a, grid, pdl, stream);
  } else {
    launch_gemv_r<1>(a, grid, pdl, stream);
  }
}

}  // namespace deepinfer::cuda
