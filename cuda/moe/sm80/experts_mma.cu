// The prefill expert GEMMs on tensor cores, bf16 weights (rows 16-byte aligned, H and I
// multiples of 8): mma.sync m16n8k16 with f32 accumulation, cp.async pipelines of 32-deep K
// slices. sm_80+ instructions (cp.async, ldmatrix, mma.sync), built for sm_90a and sm_100a.
// Without the tensor cores these GEMMs ran at ~3% of the bf16 peak.
//
// Each CTA multiplies the rows of one tile (ExpertMmaTile<kRows>::kM pair rows) by kN weight rows
// (gate/up: kN / 2 rows of w1 and the same kN / 2 rows of w3; down: kN rows of w2) with mma.sync
// m16n8k16 (bf16 x bf16 -> f32). A = bf16 rows (gate/up: x rounded to bf16 by
// round_to_bf16_kernel, gathered through sorted_pair; down: act, which the gate/up kernel writes
// as bf16), B = the weight rows, both K-contiguous in global memory, so both are "row" A / "col"
// B operands as stored and ldmatrix (without .trans) loads every fragment. The fragment layouts
// and address patterns are those of the attention kernel (attention/sm80/attention_mma.cu). The
// activations are rounded to bf16 (x once, before the gate/up GEMM; act, the SwiGLU output, when
// it is stored), as the dense linear op feeds cuBLAS for bf16 weights: the backend's precision
// policy for bf16 weights.
//
// Two CTA shapes (moe_heuristics.h picks one), the tile list built with the matching tile_rows:
//  - 64 pair rows x 256 weight rows, 3 stages: passes with at most kExpertMmaWideMinPairs pairs
//    per expert on average;
//  - 128 pair rows x 128 weight rows, 4 stages: larger passes. An expert with up to 128 pairs is
//    one row tile, so its weights are streamed from memory once per pass (with 64-row tiles an
//    expert of 65..128 pairs reads them twice, from L2 at best), and each CTA moves 20% fewer
//    operand bytes per FLOP (128 + 128 rows per stage instead of 64 + 256).
// The grid is 1-D and tile-major: CTA b works on tile b / cols and weight column block b % cols,
// so the column blocks of one tile, and the tiles of one expert, run at about the same time: the
// A rows of a tile and the weight blocks shared by the row tiles of one expert are re-read from
// L2, not from memory.
//
// Shared memory: kStages stages of [kM + kN][kExpertMmaStride] bf16, filled with cp.async
// 16-byte chunks; the 8-element (16-byte) pad puts the 8 rows one ldmatrix reads in 8 different
// bank groups. Chunks outside the operand (rows past the tile's pairs or the weight's columns, k
// past K) are zero-filled with plain stores and never read from global memory; K % 8 == 0 makes
// every chunk wholly inside or outside. Each output element is reduced over K in k-tile order,
// with the fixed order of the mma within a k-tile: it depends on its A row and weight row only.
//
// 8 warps of 32 pair rows x 64 weight rows each: warp w holds rows 32 (w % kWarpsM) .. + 31 (two
// m16 tiles) and, with wn = w / kWarpsM, weight rows: gate/up 32 wn .. + 31 of the CTA's w1 rows
// (the gate n8 tiles 0..3) and the same of its w3 rows (tiles 4..7), so one thread holds the gate
// and up value of the same (row, column) and applies SwiGLU in f32 before rounding act to bf16;
// down: 64 wn .. + 63 of w2 (tiles 0..7), written to y in f32. A warp whose 32 rows are all past
// the tile's pairs skips the ldmatrix and mma (it still copies and meets every barrier).
//
// The kernel's phases: the copy role's sources (copy_sources), the pipeline prologue and, per k
// tile, load_stage of a later tile and multiply_stage of this one, then store_tile.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/activation.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/sm80/experts_mma_config.h"

namespace deepinfer::cuda {

namespace {

// xb = bf16(x), 4 elements per step (n4 = numel / 4; both 16- and 8-byte aligned).
__global__ void round_to_bf16_kernel(const float4* __restrict__ x, uint2* __restrict__ xb,
                                     int64_t n4) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    const float4 v = __ldg(x + i);
    xb[i] = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
}

// First weight row (in the CTA's kN) of a warp's 16-row group p (n8 tiles 2p, 2p + 1).
template <bool kGateUp, int kN>
__device__ __forceinline__ int mma_wrow(int wn, int p) {
  return kGateUp ? (kN / 2) * (p >> 1) + 32 * wn + 16 * (p & 1) : 64 * wn + 16 * p;
}

// The copy role of a thread: 16-byte chunk cc (k + 8 cc .. + 7 of a stage) of A rows cr + 64 i
// and of weight rows cr + 64 i; null = outside the operand (zero-filled).
template <bool kGateUp, int kRows>
struct CopySources {
  static constexpr int kACopies = ExpertMmaTile<kRows>::kM / 64;
  static constexpr int kBCopies = ExpertMmaTile<kRows>::kN / 64;
  const __nv_bfloat16* a[kACopies];
  const __nv_bfloat16* b[kBCopies];
};

template <bool kGateUp, int kRows>
__device__ __forceinline__ CopySources<kGateUp, kRows> copy_sources(
    const __nv_bfloat16* a, int64_t K, int64_t N, int64_t n0, int top_k, const int32_t* sorted_pair,
    int e, int start, int rows, const __nv_bfloat16* const* w_lo, const __nv_bfloat16* const* w_hi,
    int cr, int cc) {
  constexpr int kN = ExpertMmaTile<kRows>::kN;
  using S = CopySources<kGateUp, kRows>;
  S src;
#pragma unroll
  for (int i = 0; i < S::kACopies; ++i) {
    const int r = cr + 64 * i;
    src.a[i] = nullptr;
    if (r < rows) {
      const int64_t arow = kGateUp ? sorted_pair[start + r] / top_k : start + r;
      src.a[i] = a + arow * K + 8 * cc;
    }
  }
#pragma unroll
  for (int i = 0; i < S::kBCopies; ++i) {
    const int b = cr + 64 * i;
    const int64_t n = n0 + (kGateUp ? b % (kN / 2) : b);
    const __nv_bfloat16* base = (kGateUp && b >= kN / 2) ? w_hi[e] : w_lo[e];
    src.b[i] = n < N ? base + n * K + 8 * cc : nullptr;
  }
  return src;
}

// k tile kt of this thread's chunks into stage buffer `buf`: cp.async, or zeros outside the
// operands.
template <bool kGateUp, int kRows>
__device__ __forceinline__ void load_stage(__nv_bfloat16* smem,
                                           const CopySources<kGateUp, kRows>& src, int buf, int kt,
                                           int64_t K, int cr, int cc) {
  using T = ExpertMmaTile<kRows>;
  using S = CopySources<kGateUp, kRows>;
  __nv_bfloat16* s = smem + buf * T::kStageElems + cr * kExpertMmaStride + 8 * cc;
  const int64_t k = static_cast<int64_t>(kt) * kExpertMmaK;
  const bool k_in = k + 8 * cc < K;
#pragma unroll
  for (int i = 0; i < S::kACopies; ++i) {
    __nv_bfloat16* d = s + 64 * i * kExpertMmaStride;
    if (src.a[i] != nullptr && k_in) {
      cp_async_16(d, src.a[i] + k);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int i = 0; i < S::kBCopies; ++i) {
    __nv_bfloat16* d = s + (T::kM + 64 * i) * kExpertMmaStride;
    if (src.b[i] != nullptr && k_in) {
      cp_async_16(d, src.b[i] + k);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// acc += the warp's 32 rows x 64 weight rows of one stage (two k16 steps).
template <bool kGateUp, int kRows>
__device__ __forceinline__ void multiply_stage(float (&acc)[2][8][4], const __nv_bfloat16* s,
                                               int a_frag, int b_frag, int wn) {
  constexpr int kN = ExpertMmaTile<kRows>::kN;
#pragma unroll
  for (int ks = 0; ks < kExpertMmaK / 16; ++ks) {
    uint32_t af[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
      ldmatrix_x4(af[mi], s + a_frag + 16 * mi * kExpertMmaStride + 16 * ks);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t bf[4];
      ldmatrix_x4(bf, s + b_frag + mma_wrow<kGateUp, kN>(wn, p) * kExpertMmaStride + 16 * ks);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        mma_bf16(acc[mi][2 * p], af[mi], bf[0], bf[1]);
        mma_bf16(acc[mi][2 * p + 1], af[mi], bf[2], bf[3]);
      }
    }
  }
}

// The epilogue from the accumulator layout: c0, c1 in row g, c2, c3 in row g + 8, columns
// 2 qd, 2 qd + 1 of the n8 tile. N % 8 == 0, so a column pair is wholly inside or outside.
// Gate/up: act = bf16(swiglu(gate, up)); down: y in f32, rows scattered back to pair order.
template <bool kGateUp>
__device__ __forceinline__ void store_tile(const float (&acc)[2][8][4], int64_t N, int64_t n0,
                                           const int32_t* sorted_pair, int start, int rows,
                                           float limit, __nv_bfloat16* act, float* y, int wm,
                                           int wn, int lane) {
  const int g = lane >> 2;
  const int qd = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = 32 * wm + 16 * mi + g + 8 * hr;
      if (r >= rows) continue;
      if constexpr (kGateUp) {
        __nv_bfloat16* dst = act + static_cast<int64_t>(start + r) * N;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t n = n0 + 32 * wn + 8 * j + 2 * qd;
          if (n < N) {
            const float v0 = swiglu(acc[mi][j][2 * hr], acc[mi][j + 4][2 * hr], limit);
            const float v1 = swiglu(acc[mi][j][2 * hr + 1], acc[mi][j + 4][2 * hr + 1], limit);
            *reinterpret_cast<uint32_t*>(dst + n) = pack_bf16(v0, v1);
          }
        }
      } else {
        float* dst = y + static_cast<int64_t>(sorted_pair[start + r]) * N;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t n = n0 + 64 * wn + 8 * j + 2 * qd;
          if (n < N) {
            *reinterpret_cast<float2*>(dst + n) =
                make_float2(acc[mi][j][2 * hr], acc[mi][j][2 * hr + 1]);
          }
        }
      }
    }
  }
}

// kGateUp: act[row, n] = bf16(swiglu(xb[token] . w1_e[n], xb[token] . w3_e[n])) for kM rows x
// kN / 2 columns n of one tile (a = xb [tokens, K = hidden], N = inter).
// Otherwise: y[pair, n] = act[row] . w2_e[n] for kM rows x kN columns (a = act [pairs, K =
// inter], N = hidden). Needs K % 8 == 0, N % 8 == 0 and 16-byte aligned rows. CTA blockIdx.x
// works on tile blockIdx.x / cols, column block blockIdx.x % cols (cols = ceil(N / columns)).
template <bool kGateUp, int kRows>
__global__ void __launch_bounds__(kExpertMmaThreads, 2)
    expert_mma_kernel(const __nv_bfloat16* __restrict__ a, int64_t K, int64_t N, int cols,
                      int top_k, const int32_t* __restrict__ sorted_pair, TileList tiles,
                      const __nv_bfloat16* const* __restrict__ w_lo,
                      const __nv_bfloat16* const* __restrict__ w_hi, float limit,
                      __nv_bfloat16* __restrict__ act, float* __restrict__ y) {
  using T = ExpertMmaTile<kRows>;
  constexpr int kM = T::kM;
  constexpr int kN = T::kN;
  constexpr int kStages = T::kStages;
  constexpr int kStageElems = T::kStageElems;
  extern __shared__ int4 mma_smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(mma_smem_raw);
  const int tile = static_cast<int>(blockIdx.x / static_cast<unsigned>(cols));
  const int col = static_cast<int>(blockIdx.x - static_cast<unsigned>(tile) * cols);
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  constexpr int kCols = kGateUp ? kN / 2 : kN;  // output columns per CTA
  const int64_t n0 = static_cast<int64_t>(col) * kCols;
  const int tid = static_cast<int>(threadIdx.x);

  const int cr = tid >> 2;
  const int cc = tid & 3;
  const CopySources<kGateUp, kRows> src = copy_sources<kGateUp, kRows>(
      a, K, N, n0, top_k, sorted_pair, e, start, rows, w_lo, w_hi, cr, cc);

  // Per-lane ldmatrix offsets (as the attention kernel):
  //  - A (row-major 16 x 16): matrix i = lane / 8 is rows + 8 (i % 2), k + 8 (i / 2), giving
  //    a0 .. a3 in mma order.
  //  - B (weight rows = n, k contiguous: the "col" operand): matrix i is n + 8 (i / 2),
  //    k + 8 (i % 2): registers 0, 1 are b0, b1 of n8 tile 0 of a 16-row group, 2, 3 of tile 1.
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp % T::kWarpsM;
  const int wn = warp / T::kWarpsM;
  const int lrow = lane & 7;
  const int bit3 = (lane >> 3) & 1;
  const int bit4 = lane >> 4;
  const int a_frag = (32 * wm + lrow + 8 * bit3) * kExpertMmaStride + 8 * bit4;
  const int b_frag = (kM + lrow + 8 * bit4) * kExpertMmaStride + 8 * bit3;
  // Whether any of the warp's 32 rows is one of the tile's pairs (warp-uniform).
  const bool live = 32 * wm < rows;

  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.f;
  }

  // Stage kt lives in buffer kt % kStages. One group is committed per stage slot (empty past the
  // end), so "at most kStages - 2 pending" means this thread's copies of stage kt landed; the
  // barrier then publishes every thread's copies and zero stores, and orders the refill of
  // buffer (kt - 1) % kStages after every warp's reads of it in iteration kt - 1.
  const int nk = static_cast<int>((K + kExpertMmaK - 1) / kExpertMmaK);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(smem, src, s, s, K, cr, cc);
    cp_async_commit();
  }
#pragma unroll 1
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < nk) load_stage(smem, src, next % kStages, next, K, cr, cc);
    cp_async_commit();
    if (!live) continue;
    multiply_stage<kGateUp, kRows>(acc, smem + (kt % kStages) * kStageElems, a_frag, b_frag, wn);
  }

  store_tile<kGateUp>(acc, N, n0, sorted_pair, start, rows, limit, act, y, wm, wn, lane);
}

// The gate/up and down GEMMs of one pass on tensor cores, over a tile list of kRows-row tiles.
template <int kRows>
void launch_expert_mma(const ExpertsPassArgs<__nv_bfloat16>& p, const __nv_bfloat16* xb,
                       __nv_bfloat16* act, float* y, cudaStream_t stream) {
  using T = ExpertMmaTile<kRows>;
  constexpr int smem = static_cast<int>(T::kSmemBytes);
  DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(expert_mma_kernel<true, kRows>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(expert_mma_kernel<false, kRows>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Grid sizes: checked against gridDim.x's limit by the heuristics (mma_fits).
  const int cols1 = static_cast<int>(ceil_div(p.inter, T::kN / 2));
  expert_mma_kernel<true, kRows>
      <<<static_cast<unsigned>(p.max_tiles * cols1), kExpertMmaThreads, smem, stream>>>(
          xb, p.hidden, p.inter, cols1, p.top_k, p.sorted_pair, p.tiles, p.w1s, p.w3s, p.limit, act,
          nullptr);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  const int cols2 = static_cast<int>(ceil_div(p.hidden, T::kN));
  expert_mma_kernel<false, kRows>
      <<<static_cast<unsigned>(p.max_tiles * cols2), kExpertMmaThreads, smem, stream>>>(
          act, p.inter, p.hidden, cols2, p.top_k, p.sorted_pair, p.tiles, p.w2s, p.w2s, p.limit,
          nullptr, y);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

}  // namespace

void launch_experts_mma(const ExpertsPassArgs<__nv_bfloat16>& p, ExpertsKernel kernel,
                        int64_t tokens, __nv_bfloat16* xb, __nv_bfloat16* act, float* y,
                        cudaStream_t stream) {
  // x rounded to bf16 once, so the gate/up A tiles are gathered with cp.async like the rest.
  const int64_t n4 = tokens * p.hidden / 4;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n4 + 255) / 256, 8192));
  round_to_bf16_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(p.x),
                                                   reinterpret_cast<uint2*>(xb), n4);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  if (kernel == ExpertsKernel::kMma128) {
    launch_expert_mma<128>(p, xb, act, y, stream);
  } else {
    launch_expert_mma<64>(p, xb, act, y, stream);
  }
}

}  // namespace deepinfer::cuda
