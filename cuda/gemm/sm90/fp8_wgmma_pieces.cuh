// The pieces both maths of the Hopper weight stream share (sm90/fp8_wgmma.cu: the mma.sync math
// and the launch; sm90/fp8_wgmma_f16.cu: the f16 math): the launch's arguments, the CTA's tile
// and K range, the ring's barriers, the fused activation quantization, the epilogue (the cluster
// reduction over the K splits) and the clustered launch. fp8_wgmma.cu's head comment describes
// the kernels. sm_90a device code.
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>

#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/gemm/fp8_wgmma_layout.h"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/norm/rms_norm_math.cuh"

namespace deepinfer::cuda::fp8_wgmma {

namespace cg = cooperative_groups;

constexpr int kRows = kFp8WgmmaRows;
constexpr int kSliceK = kFp8WgmmaSliceK;
constexpr int kStages = kFp8WgmmaStages;
constexpr int kThreads = 128;  // one warpgroup
constexpr uint32_t kWeightStageBytes = kRows * kSliceK;
static_assert(kRows == 64 && kSliceK == 128, "one m64 tile of 128-byte swizzled rows per stage");

// One weight of the launch: its tensor map (rows x K bytes), block scales and output.
struct WgmmaWeight {
  const CUtensorMap* map;
  const float* scales;  // [ceil(rows / block_rows), scale_ld]
  int64_t scale_ld;
  float* y;           // [M, ld_y]
  int64_t n;          // rows per group
  int64_t row_tiles;  // per group
};

struct WgmmaArgs {
  WgmmaWeight first, second;  // second.row_tiles == 0: no second weight
  const float* x;             // [M, G K] f32, quantized here; nullptr: xq or xt, and xs
  const uint8_t* xq;          // mma.sync: [G][m_pad][K] e4m3 (quantize_rows_e4m3)
  const uint8_t* xt;          // f16: [G][ceil(K / 128)] tiles of T tokens (fp8_wgmma_layout.h)
  const float* xs;            // mma.sync: [G][ceil(K / 128)][m_pad]; f16: [G][ceil(K / 128)][T]
  const float* norm_w;        // x's RowNorm (G = 1, with x): [K]; null: none
  float norm_eps;
  int64_t m, m_pad, k;
  int groups;
  int block_rows;
  int kb_per_split;
};

// Shared memory: the ring (1 KB aligned stages), the activation tiles of the CTA's K range (one
// T x 128-byte swizzled tile per 128 columns), the barriers, the activations' and the weight's
// scales.
template <int kTok>
struct WgmmaSmem {
  static constexpr size_t kActTile = static_cast<size_t>(kTok) * kSliceK;
  static size_t bytes(int kb_per_split) {
    const size_t kb = static_cast<size_t>(kb_per_split);
    return 1024 + kStages * kWeightStageBytes + kb * kActTile + kb * kTok * 4 + kb * 4 +
           kStages * 8;
  }
};

// The fused quantization: the CTA's activation tiles (kb blocks of its K range) and scales from
// x, per (token, 128 columns) exactly as quantize_rows_e4m3 (one warp an item, 4 columns a lane);
// tokens past M are zeros with scale 0. The mma.sync math's tiles hold the e4m3 codes (the
// 128-byte swizzle), the f16 math's their exact f16 values (fp8_wgmma_layout.h; the codes of
// quantize_rows_f16_tiles). Each warp keeps kBatch items' loads in flight. With a.norm_w, x's
// rows are normed first (row_inv: each token's 1 / rms).
template <int kTok, bool kF16>
__device__ __forceinline__ void quantize_tiles(const WgmmaArgs& a, int g, int kb0, int nk,
                                               uint8_t* acts, float* act_scales,
                                               const float* row_inv) {
  constexpr int64_t kTile = kF16 ? fp8_wgmma_tile_bytes(kTok) : WgmmaSmem<kTok>::kActTile;
  constexpr int kBatch = 4;
  constexpr int kWarps = kThreads / 32;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int tokens = static_cast<int>(a.m < kTok ? a.m : kTok);
  const int64_t ld_x = static_cast<int64_t>(a.groups) * a.k;
  const float* x = a.x + static_cast<int64_t>(g) * a.k;
  const int items = nk * tokens;
  for (int base = warp * kBatch; base < items; base += kWarps * kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int item = base + j;
      const int64_t col = static_cast<int64_t>(kb0 + item / tokens) * kSliceK + 4 * lane;
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (item < items && col < a.k) {
        v[j] = *reinterpret_cast<const float4*>(x + (item % tokens) * ld_x + col);
        if (a.norm_w != nullptr) {
          v[j] = norm_scale(v[j], row_inv[item % tokens],
                            __ldg(reinterpret_cast<const float4*>(a.norm_w + col)));
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int item = base + j;
      if (item >= items) break;  // warp-uniform
      const int kb = item / tokens, r = item % tokens;
      const float amax =
          fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w)));
      const float scale = act_group_scale(warp_max(amax));
      const uint32_t codes = e4m3x4_of(v[j], 1.0f / scale);  // exact inverse: a power of two
      uint8_t* tile = acts + kb * kTile;
      if constexpr (kF16) {
        *reinterpret_cast<uint32_t*>(tile + fp8_wgmma_tile_offset(r, 4 * lane)) =
            f16x2_of_e4m3x2(codes, 0);
        *reinterpret_cast<uint32_t*>(tile + fp8_wgmma_tile_offset(r, 4 * lane + 2)) =
            f16x2_of_e4m3x2(codes, 1);
      } else {
        *reinterpret_cast<uint32_t*>(tile + r * kSliceK + (((lane >> 2) ^ (r & 7)) << 4) +
                                     4 * (lane & 3)) = codes;
      }
      if (lane == 0) act_scales[kb * kTok + r] = scale;
    }
  }
  // The pad tokens: their 16-byte pieces (f16: of the 16 core matrices along k) and scales.
  const int pad = kTok - tokens;
  constexpr int kPieces = kF16 ? 16 : 8;
  for (int c = static_cast<int>(threadIdx.x); c < nk * pad * kPieces; c += kThreads) {
    const int kb = c / (pad * kPieces);
    const int r = tokens + (c / kPieces) % pad;
    const int64_t at = kF16 ? (16 * (r >> 3) + c % kPieces) * kFp8WgmmaTileLead + (r & 7) * 16
                            : r * kSliceK + (c % kPieces) * 16;
    *reinterpret_cast<uint4*>(acts + kb * kTile + at) = make_uint4(0, 0, 0, 0);
  }
  for (int i = static_cast<int>(threadIdx.x); i < nk * pad; i += kThreads) {
    act_scales[(i / pad) * kTok + tokens + i % pad] = 0.0f;
  }
}

// The CTA's work: split `split` of `splits` (blockIdx.y) of row tile blockIdx.x (the first
// weight's G x row_tiles tiles, then the second's), its group g, first row (within the group and
// of the weight's matrix) and its K range: blocks kb0 .. kb0 + nk - 1 of kb_total.
struct CtaTile {
  bool second;
  int split, splits, g, kb_total, kb0, nk;
  int64_t row0, weight_row;
};
__device__ __forceinline__ CtaTile cta_tile(const WgmmaArgs& a) {
  CtaTile t;
  t.split = static_cast<int>(blockIdx.y);
  t.splits = static_cast<int>(gridDim.y);
  t.second = blockIdx.x >= a.first.row_tiles * a.groups;
  const WgmmaWeight& w = t.second ? a.second : a.first;
  const int64_t tile = t.second ? blockIdx.x - a.first.row_tiles * a.groups : blockIdx.x;
  t.g = static_cast<int>(tile / w.row_tiles);
  t.row0 = (tile % w.row_tiles) * kRows;
  t.weight_row = t.g * w.n + t.row0;
  t.kb_total = static_cast<int>((a.k + kSliceK - 1) / kSliceK);
  t.kb0 = t.split * a.kb_per_split;
  t.nk = min(t.kb_total, t.kb0 + a.kb_per_split) - t.kb0;
  return t;
}

// The ring's barriers, one arrival (the copies' issuer) a phase; the CTA waits for them.
__device__ __forceinline__ void init_ring_barriers(uint64_t* full) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    mbarrier_init_fence();
  }
  __syncthreads();
}

// Floats per token of the partial tile: the stores of a warp's lanes (g, q), tokens 2 q apart and
// rows g apart, then fall on banks 8 q + g, all distinct (a stride of kRows put them 4-way on 8).
constexpr int kPartLd = kRows + 4;

// The epilogue of both maths: the CTA's 64 x T tile, acc in the mma fragment layout (element
// 4j + 2h + e is row 16 warp + lane / 4 + 8h, token 8j + 2 (lane % 4) + e), to y. The partial
// tile goes token-major to part_tile (rows contiguous: the stores to y coalesce along N), whose
// room every warp has left; without a split it is stored, else reduce_splits: CTA `split` of
// the cluster stores its share of the tile, adding the partials of splits 0..S-1 in order (the
// same order whichever CTA adds them).
template <int kTok>
__device__ __forceinline__ void store_tile(const float (&acc)[kTok / 2], float* part_tile,
                                           const WgmmaArgs& a, const WgmmaWeight& w, int g,
                                           int64_t row0, int split, int splits) {
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const int r_lo = warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < kTok / 8; ++j) {
    const int t = 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      part_tile[t * kPartLd + r_lo + 8 * h] = acc[4 * j + 2 * h];
      part_tile[(t + 1) * kPartLd + r_lo + 8 * h] = acc[4 * j + 2 * h + 1];
    }
  }
  const int64_t ld_y = static_cast<int64_t>(a.groups) * w.n;
  const int64_t tokens = a.m < kTok ? a.m : kTok;
  const int entries = static_cast<int>(tokens) * kRows;
  if (splits == 1) {
    __syncthreads();
    for (int e = tid; e < entries; e += kThreads) {
      const int64_t row = row0 + (e % kRows);
      if (row < w.n)
        w.y[(e / kRows) * ld_y + g * w.n + row] = part_tile[(e / kRows) * kPartLd + e % kRows];
    }
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int begin = split * entries / splits;
  const int end = (split + 1) * entries / splits;
  for (int e = begin + tid; e < end; e += kThreads) {
    const int slot = (e / kRows) * kPartLd + e % kRows;
    float v = *cluster.map_shared_rank(part_tile + slot, 0);
    for (int r = 1; r < splits; ++r) v += *cluster.map_shared_rank(part_tile + slot, r);
    const int64_t row = row0 + (e % kRows);
    if (row < w.n) w.y[(e / kRows) * ld_y + g * w.n + row] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

// Launches `kernel` (a stream kernel of either math) over the call's row tiles x K splits, the
// splits of a row tile one cluster, with `smem` bytes of dynamic shared memory.
template <typename Kernel>
void launch_tiles(Kernel kernel, const WgmmaArgs& a, const Fp8WgmmaConfig& c, size_t smem,
                  KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream) {
  smem_limits.allow(kernel, smem);
  ClusterLaunch l;
  const int64_t tiles = a.first.row_tiles * a.groups + a.second.row_tiles;
  l.grid = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(c.splits), 1);
  l.block = dim3(kThreads);
  l.cluster = dim3(1, static_cast<unsigned>(c.splits), 1);
  l.smem = smem;
  l.stream = stream;
  l.pdl = pdl;
  launch_clustered("linear (fp8 wgmma)", l, kernel, a);
}

// f.template operator()<T>() for the token tile T (fp8_wgmma_tokens: 8, 16, 32 or 64).
template <typename F>
void with_token_tile(int tokens, F&& f) {
  switch (tokens) {
    case 8:
      f.template operator()<8>();
      break;
    case 16:
      f.template operator()<16>();
      break;
    case 32:
      f.template operator()<32>();
      break;
    default:
      f.template operator()<64>();
      break;
  }
}

// The f16 math's launch (sm90/fp8_wgmma_f16.cu) for c.math == kF16.
void launch_f16(const WgmmaArgs& a, const Fp8WgmmaConfig& c, KernelSmemLimits& smem_limits,
                bool pdl, cudaStream_t stream);

}  // namespace deepinfer::cuda::fp8_wgmma
