// The Hopper weight stream of linear / grouped_linear / linear_pair on block-scaled FP8 weights
// for decode batches (gemm_fp8_heuristics.h: choose_fp8_wgmma): y[m, n] = sum over 128-column
// blocks kb of (sum_k q(x)[m, k] w[n, k]) * w_scale[n / block_rows, kb] * x_scale[m, kb].
//
// At these sizes every weight byte serves at most 64 tokens, so the kernel is bound by the bytes
// in flight. The weights go from HBM to shared memory by the copy engine, never through a
// register of the issuing thread:
//
//   the ring         one thread per CTA issues tensor copies (TMA, 128-byte swizzle) of its 64
//                    weight rows x 128 columns per stage into a ring of kFp8WgmmaStages stages,
//                    one mbarrier per stage; the first stages before the wait on the previous
//                    grid (weights depend on no kernel), so they stream while the activations are
//                    quantized.
//   activations      q(x): e4m3 with power-of-two scales per 128 columns. For small
//                    tiles (kFp8WgmmaFusedQuantMaxItems) each CTA quantizes its token tile of its
//                    K range itself, straight into shared memory; otherwise a launch before the
//                    kernel writes q(x) once (gemm_fp8.cu). Both with the same math: the same
//                    codes. A RowNorm of x (linear's, linear_pair's) is applied where x is
//                    quantized, in rms_norm's arithmetic (each CTA sums the squares of its
//                    tokens' rows).
//   the math         two (Fp8WgmmaConfig::math, DEEPINFER_FP8_WGMMA_MATH):
//                    mma.sync: each of the 4 warps takes 16 of the tile's 64 rows, mma.sync
//                    m16n8k32 e4m3 (f32 sums, as the FP8 GEMV; on sm_90 ptxas makes each two f16
//                    HMMAs after converting both operands), the operands read from the swizzled
//                    stages; the activations e4m3 (128-byte swizzle), copied by each CTA for its
//                    K range (cp.async) from quantize_rows_e4m3's output.
//                    f16: the warpgroup MMA, wgmma m64nTk16 f16 with A (the weights, decoded to
//                    f16 in registers) from registers and B (the activations as f16 tiles,
//                    fp8_wgmma_layout.h) from shared memory; the tiles come with each stage's
//                    weights (two bulk copies from quantize_rows_f16_tiles' output).
//                    Each stage's sum is folded into the total with its two scales.
//   reduce_splits    the `splits` CTAs of a row tile (one cluster, each a contiguous range of
//                    stages) put their partial tiles in shared memory and add them through
//                    distributed shared memory in split order (no atomics, no workspace).
//
// Every product is exact (e4m3 values are exact in f16) and summed in f32, so y differs from the
// CPU reference by summation order only, fixed by the math and the K split, which depends on N,
// K, G and the SM count only: a token's result does not depend on the other tokens of its batch
// (the default's math, auto, changes at 16 tokens: a token's result moves by summation order
// there, as it does where the GEMV hands over to cuBLASLt). FP8 wgmma (the first version's math,
// which gave the file its name) is not used: its tensor-core sums keep fewer bits than f32
// (DeepGEMM's observation); it differed from the GEMV by up to 5.7e-4 of max |y| on the
// real-format test checkpoints, enough to flip their top-k choices (session 48), where the
// mma.sync math matches the CPU emulation to ~3e-7 (session 49; benchmarks/RESULTS.md) and the
// f16 math the mma.sync math within 1e-5 of max |y| (session 55).
#include <cooperative_groups.h>
#include <cuda.h>

#include <cstdint>
#include <vector>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/e4m3_bits.h"
#include "cuda/common/fp8.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/common/wgmma_f16.cuh"
#include "cuda/gemm/fp8_wgmma_layout.h"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/norm/rms_norm_math.cuh"

namespace deepinfer::cuda {

namespace {

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

template <int kTok>
__global__ void __launch_bounds__(kThreads) fp8_wgmma_kernel(WgmmaArgs a) {
  constexpr int kAcc = kTok / 2;  // a 64 x T f32 tile over 128 threads
  extern __shared__ uint8_t smem_raw[];
  // 1 KB aligned (the 128-byte swizzle's atoms) by an offset from the shared array itself: a
  // pointer rebuilt from an integer loses its address space, and every access through it would
  // be a generic load or store.
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* ring = smem;
  uint8_t* acts = ring + kStages * kWeightStageBytes;
  // After the 1 KB activation tiles: 8-byte aligned whatever kb_per_split is.
  uint64_t* full = reinterpret_cast<uint64_t*>(acts + a.kb_per_split * WgmmaSmem<kTok>::kActTile);
  float* act_scales = reinterpret_cast<float*>(full + kStages);
  float* weight_scales = act_scales + a.kb_per_split * kTok;

  const int tid = static_cast<int>(threadIdx.x);
  const CtaTile ct = cta_tile(a);
  const WgmmaWeight& w = ct.second ? a.second : a.first;
  const int split = ct.split, splits = ct.splits, g = ct.g, kb0 = ct.kb0, nk = ct.nk;
  const int kb_total = ct.kb_total;
  const int64_t row0 = ct.row0, weight_row = ct.weight_row;
  init_ring_barriers(full);
  const uint32_t ring_addr = smem_addr(ring);
  const auto issue = [&](int i) {
    const int s = i % kStages;
    mbarrier_arrive_expect_tx(&full[s], kWeightStageBytes);
    tensor_copy_2d_to_shared_at(ring_addr + s * kWeightStageBytes, w.map, (kb0 + i) * kSliceK,
                                static_cast<int>(weight_row), smem_addr(&full[s]));
  };
  if (tid == 0) {
    for (int i = 0; i < kStages && i < nk; ++i) issue(i);
  }
  // The tile's 64 rows lie in one block of block_rows (a multiple of 64) rows.
  for (int i = tid; i < nk; i += kThreads) {
    weight_scales[i] = w.scales[(weight_row / a.block_rows) * w.scale_ld + kb0 + i];
  }

  enter_dependent_grid();  // x or q(x) is the output of the kernel before
  // The activation tiles: chunk c (16 bytes) of row r of a tile at (c ^ (r % 8)) * 16; chunks
  // past K are zeros (e4m3 garbage there could be NaN, which a zero weight would not cancel).
  if (a.x != nullptr) {
    __shared__ float row_inv[kTok];
    if (a.norm_w != nullptr) {
      block_rows_rms_inv(row_inv, a.x, static_cast<int>(a.m < kTok ? a.m : kTok), a.groups * a.k,
                         a.k, a.norm_eps);
    }
    quantize_tiles<kTok, false>(a, g, kb0, nk, acts, act_scales, row_inv);
  } else {
    const uint8_t* xq = a.xq + static_cast<int64_t>(g) * a.m_pad * a.k;
    for (int c = tid; c < nk * kTok * 8; c += kThreads) {
      const int kb = c / (kTok * 8);
      const int r = (c / 8) % kTok;
      const int chunk = c % 8;
      const int64_t col = static_cast<int64_t>(kb0 + kb) * kSliceK + chunk * 16;
      uint8_t* dst = acts + kb * WgmmaSmem<kTok>::kActTile + r * kSliceK + ((chunk ^ (r & 7)) << 4);
      if (r < a.m_pad && col < a.k) {
        cp_async_16(dst, xq + r * a.k + col);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
    const float* xs = a.xs + static_cast<int64_t>(g) * kb_total * a.m_pad;
    for (int i = tid; i < nk * kTok; i += kThreads) {
      const int kb = i / kTok, t = i % kTok;
      act_scales[i] = t < a.m_pad ? xs[static_cast<int64_t>(kb0 + kb) * a.m_pad + t] : 0.0f;
    }
    cp_async_wait_all();
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // Accumulator layout (the mma fragments of a warp's 16 rows): element 4j + 2h + e is row
  // 16 warp + lane / 4 + 8h, token 8j + 2 (lane % 4) + e.
  const auto promote = [&](const float(&part)[kAcc], int i) {
    const float ws = weight_scales[i];
    const float* s = act_scales + i * kTok;
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
      const int t = 8 * j + 2 * (lane & 3);
      const float s0 = ws * s[t], s1 = ws * s[t + 1];
      acc[4 * j + 0] += part[4 * j + 0] * s0;
      acc[4 * j + 1] += part[4 * j + 1] * s1;
      acc[4 * j + 2] += part[4 * j + 2] * s0;
      acc[4 * j + 3] += part[4 * j + 3] * s1;
    }
  };
  // Each warp's 16 rows by mma.sync: lane (g, q) holds 16-byte chunks 2q and 2q + 1 of rows g
  // and g + 8 and of token 8j + g; the same bytes of both operands at the same fragment slots,
  // so the k order is permuted alike for both. Banks: lanes 4g + q of a quarter warp read chunk
  // (2q + c) ^ g of two rows, eight distinct 16-byte columns.
  const int g8 = lane >> 2, q = lane & 3;
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbarrier_wait(&full[s], static_cast<uint32_t>(i / kStages) & 1);
    const uint8_t* wst = ring + s * kWeightStageBytes + (16 * warp + g8) * kSliceK;
    const uint8_t* ast = acts + i * WgmmaSmem<kTok>::kActTile + g8 * kSliceK;
    float part[kAcc];
#pragma unroll
    for (int e = 0; e < kAcc; ++e) part[e] = 0.0f;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int pos = ((2 * q + c) ^ g8) << 4;
      const uint4 lo = *reinterpret_cast<const uint4*>(wst + pos);
      const uint4 hi = *reinterpret_cast<const uint4*>(wst + 8 * kSliceK + pos);
#pragma unroll
      for (int j = 0; j < kTok / 8; ++j) {
        const uint4 b = *reinterpret_cast<const uint4*>(ast + 8 * j * kSliceK + pos);
        float(&d)[4] = *reinterpret_cast<float(*)[4]>(part + 4 * j);
        mma_e4m3(d, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
        mma_e4m3(d, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
      }
    }
    promote(part, i);
    named_barrier<kThreads>(1);  // every warp is done with ring stage s
    if (tid == 0 && i + kStages < nk) issue(i + kStages);
  }

  // The ring is the partial tile's room: every warp is past its last read of it first.
  __syncthreads();
  store_tile<kTok>(acc, reinterpret_cast<float*>(ring), a, w, g, row0, split, splits);
}

// ---- the f16 math (Fp8WgmmaMath::kF16) ---------------------------------------------------------

// Shared memory of the f16 math: the ring (1 KB aligned stages: the weight tile, then, where the
// activations stream, the block's activation tile and its token scales), the resident activation
// tiles and scales of the CTA's K range where it quantizes x itself, the barriers and the weight's
// scales.
template <int kTok>
struct F16Smem {
  static constexpr uint32_t kActTile = static_cast<uint32_t>(fp8_wgmma_tile_bytes(kTok));
  static constexpr uint32_t kActScales = 4 * kTok;
  static constexpr uint32_t kStreamStage =
      (kWeightStageBytes + kActTile + kActScales + 1023) / 1024 * 1024;
  static_assert(kTok * kPartLd * 4 <= kStages * kWeightStageBytes,
                "the partial tile fits the ring");
  static constexpr uint32_t stage_bytes(bool fused) {
    return fused ? kWeightStageBytes : kStreamStage;
  }
  static size_t bytes(int kb_per_split, bool fused) {
    const size_t kb = static_cast<size_t>(kb_per_split);
    return 1024 + kStages * stage_bytes(fused) + (fused ? kb * (kActTile + kActScales) : 0) +
           kStages * 8 + kb * 4;
  }
};

// One k-step of the warpgroup: d (+)= the weight rows' A fragments (words `lo` of row g, `hi` of
// row g + 8, fp8_wgmma_layout.h: bytes 0, 1 at k 2q, 2q + 1, bytes 2, 3 at k 2q + 8, 2q + 9) x the
// activation tile's step at descriptor b.
template <int kTok>
__device__ __forceinline__ void wgmma_step(float (&d)[kTok / 2], const uint32_t (&a)[4], uint64_t b,
                                           bool accumulate) {
  if constexpr (kTok == 8) {
    wgmma_m64n8k16_f16(d, a, b, accumulate);
  } else if constexpr (kTok == 16) {
    wgmma_m64n16k16_f16(d, a, b, accumulate);
  } else if constexpr (kTok == 32) {
    wgmma_m64n32k16_f16(d, a, b, accumulate);
  } else {
    static_assert(kTok == 64, "token tiles of 8, 16, 32 or 64");
    wgmma_m64n64k16_f16(d, a, b, accumulate);
  }
}

// The weight stream on the f16 math: the ring and the reduce_splits epilogue as the mma.sync
// kernel, with per stage
//   - the weight tile by a tensor copy and, unless the CTA quantized x itself, the block's
//     activation tile and token scales by two bulk copies from quantize_rows_f16_tiles' output,
//     all on the stage's barrier;
//   - each lane's 32 weight bytes of its rows g and g + 8 read once (two 16-byte loads each),
//     decoded to f16 x 2^-8 by integer operations (e4m3_bits.h) into the 8 k-steps' A fragments;
//   - 8 wgmma m64nTk16 into the stage's sum (the first one overwriting it), one commit, one wait;
//   - the sum folded into the total with its two scales and 2^8, as the mma.sync kernel does.
template <int kTok>
__global__ void __launch_bounds__(kThreads)
    fp8_wgmma_f16_kernel(const __grid_constant__ WgmmaArgs a) {
  constexpr int kAcc = kTok / 2;  // a 64 x T f32 tile over 128 threads
  using Smem = F16Smem<kTok>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const bool fused = a.x != nullptr;
  const uint32_t stage_bytes = Smem::stage_bytes(fused);
  uint8_t* ring = smem;
  uint8_t* resident = ring + kStages * stage_bytes;  // fused: the K range's tiles, then scales
  float* resident_scales = reinterpret_cast<float*>(resident + a.kb_per_split * Smem::kActTile);
  uint64_t* full = reinterpret_cast<uint64_t*>(
      fused ? reinterpret_cast<uint8_t*>(resident_scales + a.kb_per_split * kTok) : resident);
  float* weight_scales = reinterpret_cast<float*>(full + kStages);

  const int tid = static_cast<int>(threadIdx.x);
  const CtaTile ct = cta_tile(a);
  const WgmmaWeight& w = ct.second ? a.second : a.first;
  const int split = ct.split, splits = ct.splits, g = ct.g, kb0 = ct.kb0, nk = ct.nk;
  const int kb_total = ct.kb_total;
  const int64_t row0 = ct.row0, weight_row = ct.weight_row;
  init_ring_barriers(full);
  const uint32_t ring_addr = smem_addr(ring);
  const uint32_t stage_tx =
      fused ? kWeightStageBytes : kWeightStageBytes + Smem::kActTile + Smem::kActScales;
  const auto issue_weights = [&](int i) {
    const int s = i % kStages;
    mbarrier_arrive_expect_tx(&full[s], stage_tx);
    tensor_copy_2d_to_shared_at(ring_addr + s * stage_bytes, w.map, (kb0 + i) * kSliceK,
                                static_cast<int>(weight_row), smem_addr(&full[s]));
  };
  // The block's activation tile and scales (after the wait on the previous grid: they are the
  // output of quantize_rows_f16_tiles).
  const int64_t block0 = static_cast<int64_t>(g) * kb_total + kb0;
  const auto issue_acts = [&](int i) {
    const int s = i % kStages;
    const uint32_t dst = ring_addr + s * stage_bytes + kWeightStageBytes;
    bulk_copy_to_shared_at(dst, a.xt + (block0 + i) * Smem::kActTile, Smem::kActTile,
                           smem_addr(&full[s]));
    bulk_copy_to_shared_at(dst + Smem::kActTile, a.xs + (block0 + i) * kTok, Smem::kActScales,
                           smem_addr(&full[s]));
  };
  if (tid == 0) {
    for (int i = 0; i < kStages && i < nk; ++i) issue_weights(i);
  }
  for (int i = tid; i < nk; i += kThreads) {
    weight_scales[i] = w.scales[(weight_row / a.block_rows) * w.scale_ld + kb0 + i];
  }

  enter_dependent_grid();  // x or its tiles are the output of the kernel before
  if (fused) {
    __shared__ float row_inv[kTok];
    if (a.norm_w != nullptr) {
      block_rows_rms_inv(row_inv, a.x, static_cast<int>(a.m < kTok ? a.m : kTok), a.groups * a.k,
                         a.k, a.norm_eps);
    }
    quantize_tiles<kTok, true>(a, g, kb0, nk, resident, resident_scales, row_inv);
    fence_async_shared();  // the tiles are read by wgmma (the async proxy)
  } else if (tid == 0) {
    for (int i = 0; i < kStages && i < nk; ++i) issue_acts(i);
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  const int g8 = lane >> 2, q = lane & 3;
  float acc[kAcc], part[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    acc[i] = 0.0f;
    part[i] = 0.0f;
  }
  for (int i = 0; i < nk; ++i) {
    const int s = i % kStages;
    mbarrier_wait(&full[s], static_cast<uint32_t>(i / kStages) & 1);
    uint8_t* stage = ring + s * stage_bytes;
    const uint8_t* act = fused ? resident + i * Smem::kActTile : stage + kWeightStageBytes;
    const float* act_scales =
        fused ? resident_scales + i * kTok
              : reinterpret_cast<const float*>(stage + kWeightStageBytes + Smem::kActTile);
    // Lane (g, q): chunks 2q, 2q + 1 of rows g and g + 8 of its warp's 16 (128-byte swizzle).
    const uint8_t* wrow = stage + (16 * warp + g8) * kSliceK;
    uint4 lo[2], hi[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int pos = ((2 * q + c) ^ g8) << 4;
      lo[c] = *reinterpret_cast<const uint4*>(wrow + pos);
      hi[c] = *reinterpret_cast<const uint4*>(wrow + 8 * kSliceK + pos);
    }
    uint32_t frag[8][4];
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const uint4& l = lo[st >> 2];
      const uint4& h = hi[st >> 2];
      const uint32_t wl = (st & 3) == 0 ? l.x : (st & 3) == 1 ? l.y : (st & 3) == 2 ? l.z : l.w;
      const uint32_t wh = (st & 3) == 0 ? h.x : (st & 3) == 1 ? h.y : (st & 3) == 2 ? h.z : h.w;
      frag[st][0] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<false>(wl);
      frag[st][1] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<false>(wh);
      frag[st][2] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<true>(wl);
      frag[st][3] = e4m3_bits::e4m3x2_to_f16x2_times_2m8<true>(wh);
    }
    const uint64_t desc0 = wgmma_desc(act, kFp8WgmmaTileLead, kFp8WgmmaTileStride);
    fence_accumulators(part);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      // k-step st: core matrices 2 st, 2 st + 1 along k.
      wgmma_step<kTok>(part, frag[st], desc0 + ((2 * st * kFp8WgmmaTileLead) >> 4), st > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(part);
    // The decode left each product 2^-8 of its value: the scale takes it back (exactly).
    const float ws = weight_scales[i] * 256.0f;
#pragma unroll
    for (int j = 0; j < kTok / 8; ++j) {
      const int t = 8 * j + 2 * q;
      const float s0 = ws * act_scales[t], s1 = ws * act_scales[t + 1];
      acc[4 * j + 0] += part[4 * j + 0] * s0;
      acc[4 * j + 1] += part[4 * j + 1] * s1;
      acc[4 * j + 2] += part[4 * j + 2] * s0;
      acc[4 * j + 3] += part[4 * j + 3] * s1;
    }
    named_barrier<kThreads>(1);  // every warp is done with ring stage s
    if (tid == 0 && i + kStages < nk) {
      issue_weights(i + kStages);
      if (!fused) issue_acts(i + kStages);
    }
  }
  __syncthreads();
  store_tile<kTok>(acc, reinterpret_cast<float*>(ring), a, w, g, row0, split, splits);
}

template <int kTok>
void launch_tokens(const WgmmaArgs& a, const Fp8WgmmaConfig& c, KernelSmemLimits& smem_limits,
                   bool pdl, cudaStream_t stream) {
  const bool f16 = c.math == Fp8WgmmaMath::kF16;
  const size_t smem = f16 ? F16Smem<kTok>::bytes(c.kb_per_split, a.x != nullptr)
                          : WgmmaSmem<kTok>::bytes(c.kb_per_split);
  const auto kernel = f16 ? fp8_wgmma_f16_kernel<kTok> : fp8_wgmma_kernel<kTok>;
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

}  // namespace

void launch_fp8_wgmma(const Fp8WgmmaLaunch& l, const Fp8Problem& p, const Fp8WgmmaConfig& c,
                      KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream) {
  WgmmaArgs a{};
  const auto weight = [](const Fp8WgmmaWeight& w) {
    return WgmmaWeight{static_cast<const CUtensorMap*>(w.map),
                       w.scales,
                       w.scale_ld,
                       w.y,
                       w.n,
                       (w.n + kRows - 1) / kRows};
  };
  a.first = weight(l.first);
  if (l.second.map != nullptr) a.second = weight(l.second);
  a.x = l.x;
  a.xq = l.xq;
  a.xt = l.xt;
  a.xs = l.xs;
  a.norm_w = l.x_norm_weight;
  a.norm_eps = l.x_norm_eps;
  a.m = p.m;
  a.m_pad = l.m_pad;
  a.k = p.k;
  a.groups = static_cast<int>(p.groups);
  a.block_rows = p.block_rows;
  a.kb_per_split = c.kb_per_split;
  switch (c.tokens) {
    case 8:
      launch_tokens<8>(a, c, smem_limits, pdl, stream);
      break;
    case 16:
      launch_tokens<16>(a, c, smem_limits, pdl, stream);
      break;
    case 32:
      launch_tokens<32>(a, c, smem_limits, pdl, stream);
      break;
    default:
      launch_tokens<64>(a, c, smem_limits, pdl, stream);
      break;
  }
}

}  // namespace deepinfer::cuda
