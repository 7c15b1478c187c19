// The prefill shape of the expert GEMMs when the tensor cores do not apply (f32 weights, odd
// sizes, unaligned rows): tiles of kTileM pair rows, 64 x 64 output tiles with 32-deep K steps
// through shared memory, 4 x 4 results per thread, f32 FMA on CUDA cores (activations stay f32,
// bf16 weights are widened exactly, so results equal the CPU op on bf16-rounded weights up to
// summation order). Rows past a tile's pairs, weight rows past the matrix and k past K are
// zero-filled in shared memory, never read from global memory.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/activation.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

// Shared-memory tile of one operand, K-major; the +1 pad keeps both the transposing stores and
// the reads free of bank conflicts.
using TileBuf = float[kTileK][kTileM + 1];
static_assert(kTileM == kTileN, "one buffer type serves both operands");

// Loads k in [k0, k0 + kTileK) of the 64 rows whose pointers are in `rows` (shared memory; null
// = a row outside the tile) into s[k - k0][row]: thread t loads k0 + t % 32 of rows t / 32 + 8 i
// (a warp reads 32 consecutive elements of one row). Null rows and k >= K load 0.
template <typename T>
__device__ __forceinline__ void load_tile(TileBuf& s, const T* const* rows, int64_t k0, int64_t K) {
  const int lk = static_cast<int>(threadIdx.x % 32);
  const int lr = static_cast<int>(threadIdx.x / 32);
  const int64_t k = k0 + lk;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const T* p = rows[lr + 8 * i];
    s[lk][lr + 8 * i] = (p != nullptr && k < K) ? load_as_float(p, k) : 0.0f;
  }
}

// acc[i][j] += sum_kk a[kk][ty + 16 i] * b[kk][tx + 16 j] for the thread's 4 x 4 results.
__device__ __forceinline__ void tile_fma(const TileBuf& a, const TileBuf& b, float (&acc)[4][4]) {
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int tx = static_cast<int>(threadIdx.x % 16);
#pragma unroll 8
  for (int kk = 0; kk < kTileK; ++kk) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = a[kk][ty + 16 * i];
#pragma unroll
    for (int j = 0; j < 4; ++j) bv[j] = b[kk][tx + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// act[row, n] = swiglu(x[token] . w1_e[n], x[token] . w3_e[n]) for a 64 x 64 block of one tile.
template <typename W>
__global__ void __launch_bounds__(kTileThreads)
    gate_up_tiled_kernel(const float* __restrict__ x, int64_t hidden, int64_t inter, int top_k,
                         const int32_t* __restrict__ sorted_pair, TileList tiles,
                         const W* const* __restrict__ w1s, const W* const* __restrict__ w3s,
                         float limit, float* __restrict__ act) {
  enter_dependent_grid();
  __shared__ TileBuf xs, gs, us;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  // Row pointers live in shared memory rather than in 3 x 8 registers per thread.
  __shared__ const float* xrow[kTileM];
  __shared__ const W* grow[kTileN];
  __shared__ const W* urow[kTileN];
  if (threadIdx.x < kTileM) {
    const int r = static_cast<int>(threadIdx.x);
    xrow[r] =
        r < rows ? x + static_cast<int64_t>(sorted_pair[start + r] / top_k) * hidden : nullptr;
    const int64_t n = n0 + r;
    grow[r] = n < inter ? w1s[e] + n * hidden : nullptr;
    urow[r] = n < inter ? w3s[e] + n * hidden : nullptr;
  }
  __syncthreads();
  float g[4][4] = {}, u[4][4] = {};
  for (int64_t k0 = 0; k0 < hidden; k0 += kTileK) {
    load_tile(xs, xrow, k0, hidden);
    load_tile(gs, grow, k0, hidden);
    load_tile(us, urow, k0, hidden);
    __syncthreads();
    tile_fma(xs, gs, g);
    tile_fma(xs, us, u);
    __syncthreads();
  }
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int tx = static_cast<int>(threadIdx.x % 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < inter)
        act[static_cast<int64_t>(start + r) * inter + n] = swiglu(g[i][j], u[i][j], limit);
    }
  }
}

// y[pair, n] = act[row] . w2_e[n] for a 64 x 64 block of one tile.
template <typename W>
__global__ void __launch_bounds__(kTileThreads)
    down_tiled_kernel(const float* __restrict__ act, int64_t hidden, int64_t inter,
                      const int32_t* __restrict__ sorted_pair, TileList tiles,
                      const W* const* __restrict__ w2s, float* __restrict__ y) {
  enter_dependent_grid();
  __shared__ TileBuf as, ws;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  __shared__ const float* arow[kTileM];
  __shared__ const W* wrow[kTileN];
  if (threadIdx.x < kTileM) {
    const int r = static_cast<int>(threadIdx.x);
    arow[r] = r < rows ? act + static_cast<int64_t>(start + r) * inter : nullptr;
    const int64_t n = n0 + r;
    wrow[r] = n < hidden ? w2s[e] + n * inter : nullptr;
  }
  __syncthreads();
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < inter; k0 += kTileK) {
    load_tile(as, arow, k0, inter);
    load_tile(ws, wrow, k0, inter);
    __syncthreads();
    tile_fma(as, ws, acc);
    __syncthreads();
  }
  const int ty = static_cast<int>(threadIdx.x / 16);
  const int tx = static_cast<int>(threadIdx.x % 16);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    const int64_t pair = sorted_pair[start + r];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n < hidden) y[pair * hidden + n] = acc[i][j];
    }
  }
}

}  // namespace

template <typename W>
void launch_experts_tiled(const ExpertsPassArgs<W>& p, float* act, float* y, bool pdl,
                          cudaStream_t stream) {
  const unsigned grid_tiles = static_cast<unsigned>(p.max_tiles);
  const dim3 grid1(grid_tiles, ceil_div(p.inter, kTileN));
  launch_programmatic("moe_experts", grid1, dim3(kTileThreads), 0, stream, pdl,
                      gate_up_tiled_kernel<W>, p.x, p.hidden, p.inter, p.top_k, p.sorted_pair,
                      p.tiles, p.w1s, p.w3s, p.limit, act);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  if (p.down_group > 0) {  // w2's activation quantization of the SwiGLU output, in place
    launch_quantize_activations(act, act, p.pairs, p.inter, p.down_group, pdl, stream);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  }
  const dim3 grid2(grid_tiles, ceil_div(p.hidden, kTileN));
  launch_programmatic("moe_experts", grid2, dim3(kTileThreads), 0, stream, pdl,
                      down_tiled_kernel<W>, act, p.hidden, p.inter, p.sorted_pair, p.tiles, p.w2s,
                      y);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template void launch_experts_tiled<float>(const ExpertsPassArgs<float>&, float*, float*, bool,
                                          cudaStream_t);
template void launch_experts_tiled<__nv_bfloat16>(const ExpertsPassArgs<__nv_bfloat16>&, float*,
                                                  float*, bool, cudaStream_t);

}  // namespace deepinfer::cuda
