// The decode shape of the expert GEMMs (few pairs per expert): tiles of kExpertGemvRows pairs;
// one warp streams kExpertGemvWeightRows weight rows with 16-byte loads, coalesced across the
// warp (strided_dots.cuh, the lanes splitting K), so each used expert's weights are read once per
// tile (once in total when an expert has <= kExpertGemvRows pairs). Memory-bound. The f32
// activations are used as they are and bf16 weights widen exactly (f32 accumulation).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/activation.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/strided_dots.cuh"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

// act[row] = swiglu(x[token] . w1_e^T, x[token] . w3_e^T) for the rows of one tile; one warp per
// kExpertGemvWeightRows / 2 intermediate columns (their w1 and w3 rows).
template <typename W>
__global__ void __launch_bounds__(kExpertGemvWarps * 32)
    gate_up_gemv_kernel(const float* __restrict__ x, int64_t hidden, int64_t inter, int top_k,
                        const int32_t* __restrict__ sorted_pair, TileList tiles,
                        const W* const* __restrict__ w1s, const W* const* __restrict__ w3s,
                        float limit, float* __restrict__ act) {
  enter_dependent_grid();
  constexpr int kCols = kExpertGemvWeightRows / 2;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;
  const int64_t col0 =
      (static_cast<int64_t>(blockIdx.y) * kExpertGemvWarps + threadIdx.x / 32) * kCols;
  if (col0 >= inter) return;  // the whole warp leaves; no CTA barrier follows
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const W* w[2 * kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int64_t col = min(col0 + c, inter - 1);  // tail columns read a valid row, never stored
    w[c] = w1s[e] + col * hidden;
    w[kCols + c] = w3s[e] + col * hidden;
  }
  const float* xr[kExpertGemvRows];
#pragma unroll
  for (int r = 0; r < kExpertGemvRows; ++r) {
    xr[r] = x + static_cast<int64_t>(sorted_pair[start + min(r, rows - 1)] / top_k) * hidden;
  }
  float acc[2 * kCols][kExpertGemvRows] = {};
  const int lane = static_cast<int>(threadIdx.x & 31);
  strided_dots<W, true, 2 * kCols, kExpertGemvRows, 32, 2>(w, xr, rows, hidden, lane, acc);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < kExpertGemvRows; ++r) {
      const float g = warp_sum(acc[c][r]);
      const float u = warp_sum(acc[kCols + c][r]);
      if (lane == c * kExpertGemvRows + r && r < rows && col0 + c < inter) {
        act[static_cast<int64_t>(start + r) * inter + col0 + c] = swiglu(g, u, limit);
      }
    }
  }
}

// y[pair] = act[row] . w2_e^T for the rows of one tile; one warp per kExpertGemvWeightRows columns.
template <typename W>
__global__ void __launch_bounds__(kExpertGemvWarps * 32)
    down_gemv_kernel(const float* __restrict__ act, int64_t hidden, int64_t inter,
                     const int32_t* __restrict__ sorted_pair, TileList tiles,
                     const W* const* __restrict__ w2s, float* __restrict__ y) {
  enter_dependent_grid();
  constexpr int kCols = kExpertGemvWeightRows;
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= *tiles.count) return;
  const int64_t col0 =
      (static_cast<int64_t>(blockIdx.y) * kExpertGemvWarps + threadIdx.x / 32) * kCols;
  if (col0 >= hidden) return;
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const W* w[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) w[c] = w2s[e] + min(col0 + c, hidden - 1) * inter;
  const float* xr[kExpertGemvRows];
#pragma unroll
  for (int r = 0; r < kExpertGemvRows; ++r) {
    xr[r] = act + static_cast<int64_t>(start + min(r, rows - 1)) * inter;
  }
  float acc[kCols][kExpertGemvRows] = {};
  const int lane = static_cast<int>(threadIdx.x & 31);
  strided_dots<W, true, kCols, kExpertGemvRows, 32, 2>(w, xr, rows, inter, lane, acc);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < kExpertGemvRows; ++r) {
      const float v = warp_sum(acc[c][r]);
      if (lane == c * kExpertGemvRows + r && r < rows && col0 + c < hidden) {
        y[static_cast<int64_t>(sorted_pair[start + r]) * hidden + col0 + c] = v;
      }
    }
  }
}

}  // namespace

template <typename W>
void launch_experts_gemv(const ExpertsPassArgs<W>& p, float* act, float* y, bool pdl,
                         cudaStream_t stream) {
  const unsigned grid_tiles = static_cast<unsigned>(p.max_tiles);
  const dim3 grid1(grid_tiles, ceil_div(p.inter, kExpertGemvWarps * (kExpertGemvWeightRows / 2)));
  const dim3 block(kExpertGemvWarps * 32);
  launch_programmatic("moe_experts", grid1, block, 0, stream, pdl, gate_up_gemv_kernel<W>, p.x,
                      p.hidden, p.inter, p.top_k, p.sorted_pair, p.tiles, p.w1s, p.w3s, p.limit,
                      act);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  if (p.down_group > 0) {  // w2's activation quantization of the SwiGLU output, in place
    launch_quantize_activations(act, act, p.pairs, p.inter, p.down_group, pdl, stream);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  }
  const dim3 grid2(grid_tiles, ceil_div(p.hidden, kExpertGemvWarps * kExpertGemvWeightRows));
  launch_programmatic("moe_experts", grid2, block, 0, stream, pdl, down_gemv_kernel<W>, act,
                      p.hidden, p.inter, p.sorted_pair, p.tiles, p.w2s, y);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template void launch_experts_gemv<float>(const ExpertsPassArgs<float>&, float*, float*, bool,
                                         cudaStream_t);
template void launch_experts_gemv<__nv_bfloat16>(const ExpertsPassArgs<__nv_bfloat16>&, float*,
                                                 float*, bool, cudaStream_t);

}  // namespace deepinfer::cuda
