// The prefill shape of the quantized expert GEMMs on Hopper's warpgroup MMA (wgmma, sm_90a only):
// the pass of sm80/experts_quant.cu (same tile list, same outputs, same numerics) with
// wgmma.m64nNk16 bf16 x bf16 -> f32 in place of mma.sync, the default on sm_90 (the backend's
// DEEPINFER_MOE_QUANT_PREFILL=mma_sync keeps the mma.sync kernel; moe_heuristics.h).
//
// Why. The mma.sync prefill kernel (64-token tiles, eight warps of 32 weight rows) reads every
// B fragment from shared memory per warp and issues at mma.sync's rate; on the H200 it reached
// ~150 TFLOP/s at V4-Flash sizes. Here a CTA multiplies 256 weight rows by a 128-token tile with
// two warpgroups, each issuing two m64nNk16 per k-step (N: the smallest of 32, 64, 96, 128 that
// covers the tile's rows): B is read by the tensor cores straight from shared memory.
//
// Numerics: exactly those of experts_quant.cu (its head comment): the weights are decoded in
// registers to bf16 times their power-of-two scale (exact; the same decode functions), the
// activations are the same bf16 values (one plane after DeepSeek's activation quantization,
// hi + mid + lo planes without it), each product is exact and sums are f32. Only the summation
// order inside the tensor cores differs from the mma.sync kernel.
//
// Layouts. A (weights) comes from registers: the wgmma A fragment of a warp is the mma.sync
// m16n8k16 one (lane (g, q) holds rows g, g + 8 at k 2q, 2q + 1 and 2q + 8, 2q + 9), so a lane
// decodes its 16-byte loads exactly as experts_quant.cu does, and which input of a 128-input
// slice plays which k of which k-step is slice_input's. The activations are staged per pass in
// that order but k-contiguous per step (stage_wgmma_kernel): position 16 s + kk of a slice row
// holds the input of k-step s, k kk, so the 8 k of a core matrix (16 bytes) are contiguous and
// one cp.async each. In shared memory a slice is K-major without swizzle: core matrices of 8
// tokens x 8 k (128 bytes) laid out [token / 8][k / 8], leading byte offset 128 (next 8 k),
// stride byte offset 16 x 128 (next 8 tokens); planes one after the other.
//
// Weight rows: warp w of the CTA holds the same rows as warp w of the mma.sync prefill kernel
// (gate/up: w1 rows and the same w3 rows, 16 each; down: 32 rows of w2), its m16 tile mt being
// its 16 rows of the warpgroup's m64 tile mt, so the epilogue is experts_quant.cu's store_tile.
//
// Pipeline of a CTA: a ring of kStages slices in shared memory (ExpertQuantWgmma: 4 for MXFP4
// with quantized activations, 3 for FP8, 2 for MXFP4 with three planes; FP8 with three planes
// does not fit and keeps the mma.sync kernel), each the tile's activation rows and every lane's
// own weight chunks, filled by cp.async kStages - 2 slices ahead (kStages - 1 with two slots);
// the scales of slice s + 1 are loaded into registers during slice s. One __syncthreads per
// slice; gemm_tile says why the slot it refills is free. Per k-step of a slice a
// warpgroup decodes its A fragments, then issues one wgmma per m64 tile and plane and commits;
// one group stays in flight while the next step decodes, across slices too where the ring has
// three or more slots. (The refill stays before a slice's MMAs: issued after its first step it
// made ptxas serialize the wgmmas, C7513 "non wgmma instructions defining input registers";
// after its last step it would cut the copies' lead by a slice.)
//
// Resources (ptxas -v, sm_90a, nvcc 13.0): 224-244 registers per thread, no spills
// (__launch_bounds__(256, 1): one CTA of eight warps per SM); dynamic shared memory 192 KB for
// one activation plane (MXFP4: 4 x 48 KB, FP8: 3 x 64 KB), 224 KB for MXFP4 with three planes
// (2 x 112 KB), plus 1 KB of static row offsets.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/sm80/experts_quant_tile.cuh"
#include "cuda/moe/sm90/experts_quant_wgmma.h"
#include "cuda/moe/sm90/experts_quant_wgmma_mma.cuh"
#include "cuda/quant/quant_launch.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

using namespace quant_tile;  // NOLINT(google-build-using-namespace): this family's pieces
using Tile = ExpertQuantWgmma;
using namespace experts_wgmma;  // NOLINT(google-build-using-namespace): the MMA shapes

// ---- staging: activations -> bf16 planes, k-contiguous per step
// ------------------------------------------

// dst [rows, kPlanes, Kp] (Kp = K rounded up to 128): element 16 s + 8 w + 2 q + h of a slice
// row is input slice_input(q, s, w, h) of the slice (k-step s, k 8 w + 2 q + h); inputs past K
// are 0. One thread writes one 16-byte chunk (s, w) of every plane. kPlanes == 3: hi + mid + lo
// == x, as experts_quant.cu stages them.
template <QuantFormat F, int kPlanes>
__global__ void stage_wgmma_kernel(const float* __restrict__ src, int64_t rows, int64_t K,
                                   int64_t Kp, __nv_bfloat16* __restrict__ dst) {
  const int64_t chunks = Kp / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * chunks) return;
  const int64_t row = idx / chunks;
  const int64_t ch = idx - row * chunks;
  const int64_t k0 = (ch / 16) * kQuantSliceK;
  const int c = static_cast<int>(ch % 16);
  const int step = c >> 1, w = c & 1;
  const float* s = src + row * K;
  uint32_t out[kPlanes][4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float v[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t k = k0 + slice_input<F>(q, step, w, h);
      v[h] = k < K ? s[k] : 0.0f;
    }
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[0], v[1]);
      memcpy(&out[pl][q], &b, sizeof(uint32_t));
      v[0] -= __low2float(b);  // exact: the rest of v beyond its bf16 rounding
      v[1] -= __high2float(b);
    }
  }
  __nv_bfloat16* d = dst + row * kPlanes * Kp + ch * 8;
#pragma unroll
  for (int pl = 0; pl < kPlanes; ++pl) {
    *reinterpret_cast<uint4*>(d + pl * Kp) =
        make_uint4(out[pl][0], out[pl][1], out[pl][2], out[pl][3]);
  }
}

// ---- the GEMM
// ------------------------------------------------------------------------------------

// A lane's scales of one slice (MXFP4: the e8m0 byte; FP8: the f32 bits) of rows g and g + 8 of
// its m16 tiles, per 16-byte load.
template <QuantFormat F>
struct SliceScales {
  uint32_t v[Tile::kMTiles][2][QuantTraits<F>::kLoads];
};

// The lane's scales of slice `slice`; chunks at or past K (wholly, K being a multiple of the
// chunk) get a neutral scale (their bytes are zero).
template <QuantFormat F>
__device__ __forceinline__ void load_scales(SliceScales<F>& sc,
                                            const WeightRows<Tile::kMTiles>& rows, int slice, int q,
                                            int64_t K, int block_cols_log2) {
  using Tr = QuantTraits<F>;
#pragma unroll
  for (int l = 0; l < Tr::kLoads; ++l) {
    const int64_t k0 =
        static_cast<int64_t>(slice) * kQuantSliceK + l * 4 * Tr::kChunk + q * Tr::kChunk;
    const bool in = k0 < K;
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (!in) {
          sc.v[mt][hr][l] = Tr::kMx ? 127u : __float_as_uint(1.0f);
        } else if constexpr (Tr::kMx) {
          sc.v[mt][hr][l] = __ldg(static_cast<const uint8_t*>(rows.scales[mt][hr]) + k0 / 32);
        } else {
          sc.v[mt][hr][l] = __float_as_uint(
              __ldg(static_cast<const float*>(rows.scales[mt][hr]) + (k0 >> block_cols_log2)));
        }
      }
    }
  }
}

// Where the lane's weight chunk (mt, hr, l) of a slice sits in the ring slot's weights: the
// lanes of a warp at consecutive 16 bytes (conflict-free copies and reads).
template <QuantFormat F>
__device__ __forceinline__ int weight_chunk_offset(int mt, int hr, int l) {
  return ((mt * 2 + hr) * QuantTraits<F>::kLoads + l) * (Tile::kThreads * 16) +
         static_cast<int>(threadIdx.x) * 16;
}

// Copies the lane's weight chunks of slice `slice` into `buf` (cp.async; chunks at or past K are
// zeroed: an e4m3 NaN code times a zero activation would not vanish).
template <QuantFormat F>
__device__ __forceinline__ void stage_weights(uint8_t* buf, const WeightRows<Tile::kMTiles>& rows,
                                              int slice, int q, int64_t K) {
  using Tr = QuantTraits<F>;
#pragma unroll
  for (int l = 0; l < Tr::kLoads; ++l) {
    const int64_t k0 =
        static_cast<int64_t>(slice) * kQuantSliceK + l * 4 * Tr::kChunk + q * Tr::kChunk;
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        uint8_t* d = buf + weight_chunk_offset<F>(mt, hr, l);
        if (k0 < K) {
          cp_async_16(d, rows.values[mt][hr] + (Tr::kMx ? k0 / 2 : k0));
        } else {
          *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
}

// Whether some multiplier of the lane's slice needs two factors (Multiplier::two).
template <QuantFormat F>
__device__ __forceinline__ bool needs_two_factors(const SliceScales<F>& sc) {
  using Tr = QuantTraits<F>;
  bool two = false;
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
      for (int l = 0; l < Tr::kLoads; ++l) {
        two = two || (Tr::kMx ? mx_multiplier(sc.v[mt][hr][l]).two
                              : fp8_multiplier(__uint_as_float(sc.v[mt][hr][l])).two);
      }
    }
  }
  return two;
}

// Copies slice `slice` of the tile's staged rows (row_src: element offset of a row's planes)
// into `buf` (the core-matrix layout of the head comment), rows below `rows` only: the columns
// of the others are never stored (a column of D depends on its own column of B only). A warp
// copies 64 contiguous bytes of each of 8 rows; 8 consecutive lanes fill one core matrix.
template <int kPlanes>
__device__ __forceinline__ void stage_slice(uint8_t* buf, const __nv_bfloat16* a,
                                            const int64_t* row_src, int rows, int slice,
                                            int64_t Kp) {
  constexpr int kChunks = kPlanes * Tile::kTok * (kQuantSliceK / 8);
  static_assert(kChunks % Tile::kThreads == 0);
  // Unrolled by two only: the addresses of more copies in flight cost spills (ptxas -v).
#pragma unroll 2
  for (int i = 0; i < kChunks / Tile::kThreads; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * Tile::kThreads;
    const int r8 = idx & 7;
    const int c = (idx >> 3) & 15;
    const int rest = idx >> 7;
    const int group = rest % (Tile::kTok / 8);
    const int pl = rest / (Tile::kTok / 8);
    const int r = 8 * group + r8;
    if (r >= rows) continue;
    uint8_t* d = buf + pl * (Tile::kTok * kQuantSliceK * 2) + (group * 16 + c) * 128 + r8 * 16;
    cp_async_16(d, a + row_src[r] + pl * Kp + static_cast<int64_t>(slice) * kQuantSliceK + c * 8);
  }
}

// Keeps the compiler from moving accesses of the accumulators across the asynchronous MMAs.
__device__ __forceinline__ void fence_tile_accumulators(
    float (&acc)[Tile::kMTiles][Tile::kTok / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < Tile::kTok / 8; ++j) {
#pragma unroll
      for (int x = 0; x < 4; ++x) asm volatile("" : "+f"(acc[mt][j][x])::"memory");
    }
  }
}

// acc += the warpgroup's weight rows (the lane's chunks in `weights`, scales `sc`) x the slice's
// staged token rows at `act`, on wgmma n kN (32, 64, 96 or 128): per k-step, decode both m16
// tiles' A fragments, then one wgmma per m64 tile and plane, one group per step. Returns with
// the last step's group still running (kLag) or with every MMA done.
template <QuantFormat F, int kPlanes, int kN, bool kTwo, bool kLag>
__device__ __forceinline__ void multiply_slice_wgmma(float (&acc)[Tile::kMTiles][Tile::kTok / 8][4],
                                                     const uint8_t* weights,
                                                     const SliceScales<F>& sc, const uint8_t* act) {
  using Tr = QuantTraits<F>;
  constexpr int kM = Tile::kMTiles;
  // Leading byte offset: the next 8 k (one core matrix); stride: the next 8 tokens (16 of them).
  const uint64_t desc0 = wgmma_desc(act, 128, 16 * 128);
  constexpr uint32_t kPlaneBytes = Tile::kTok * kQuantSliceK * 2;
  uint4 chunk[kM][2];
  Multiplier mul[kM][2];
  uint32_t af[2][kM][4];
#pragma unroll
  for (int s = 0; s < kQuantSliceK / 16; ++s) {
    const int l = s / Tr::kStepsPerLoad;
    const int sl = s % Tr::kStepsPerLoad;
    if (sl == 0) {  // the load's chunks, read just before their first step
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          chunk[mt][hr] =
              *reinterpret_cast<const uint4*>(weights + weight_chunk_offset<F>(mt, hr, l));
          mul[mt][hr] = Tr::kMx ? mx_multiplier(sc.v[mt][hr][l])
                                : fp8_multiplier(__uint_as_float(sc.v[mt][hr][l]));
        }
      }
    }
    uint32_t(&a)[kM][4] = af[s & 1];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      // a0a1: row g, k 2q..; a2a3: row g + 8; a4a5, a6a7: the same rows at k 2q + 8.
      a[mt][0] = decode_scaled<F, kTwo>(chunk[mt][0], 2 * sl, mul[mt][0]);
      a[mt][1] = decode_scaled<F, kTwo>(chunk[mt][1], 2 * sl, mul[mt][1]);
      a[mt][2] = decode_scaled<F, kTwo>(chunk[mt][0], 2 * sl + 1, mul[mt][0]);
      a[mt][3] = decode_scaled<F, kTwo>(chunk[mt][1], 2 * sl + 1, mul[mt][1]);
    }
    fence_tile_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      // k-step s: k rows 16 s .. 16 s + 15 are core matrices 2 s, 2 s + 1 along k.
      const uint64_t desc = desc0 + ((pl * kPlaneBytes + 2 * s * 128) >> 4);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        if constexpr (kN == 128) {
          wgmma_m64n128k16_bf16(&acc[mt][0][0], a[mt], desc);
        } else if constexpr (kN == 96) {
          wgmma_m64n96k16_bf16(&acc[mt][0][0], a[mt], desc);
        } else if constexpr (kN == 64) {
          wgmma_m64n64k16_bf16(&acc[mt][0][0], a[mt], desc);
        } else {
          static_assert(kN == 32, "wgmma n 32, 64, 96 or 128");
          wgmma_m64n32k16_bf16(&acc[mt][0][0], a[mt], desc);
        }
      }
    }
    wgmma_commit();
    // Step s - 1 done (at s = 0: the previous slice's last step): its fragments (af[(s + 1) & 1])
    // may be overwritten.
    wgmma_wait<1>();
  }
  if constexpr (!kLag) wgmma_wait<0>();
  fence_tile_accumulators(acc);
}

// The K loop of a CTA on wgmma n kN: see the head comment's pipeline. With three or more ring
// slots (kLag) a warpgroup leaves its last group of a slice running into the next one, and the
// copies run kStages - 2 slices ahead: the slot refilled at slice s held slice s - 2, whose MMAs
// every warpgroup had waited for (in slice s - 1's first step) before the barrier of slice s.
// With two slots each slice ends with every MMA done and the copies run one slice ahead.
template <QuantFormat F, int kPlanes, int kN>
__device__ __forceinline__ void gemm_tile(float (&acc)[Tile::kMTiles][Tile::kTok / 8][4],
                                          uint8_t* smem, const __nv_bfloat16* a,
                                          const int64_t* row_src, int rows, int64_t K, int64_t Kp,
                                          const WeightRows<Tile::kMTiles>& wr, int q,
                                          int block_cols_log2) {
  constexpr int kLoads = QuantTraits<F>::kLoads;
  constexpr int kStages = Tile::stages(kPlanes, kLoads);
  static_assert(kStages >= 2, "a ring of at least two slices");
  constexpr bool kLag = kStages >= 3;
  constexpr int kAhead = kLag ? kStages - 2 : kStages - 1;  // slices in flight
  constexpr size_t kActBytes = Tile::act_stage_bytes(kPlanes);
  constexpr size_t kStageBytes = Tile::stage_bytes(kPlanes, kLoads);
  const int slices = static_cast<int>(Kp / kQuantSliceK);
  auto issue = [&](int slice) {
    uint8_t* slot = smem + (slice % kStages) * kStageBytes;
    stage_slice<kPlanes>(slot, a, row_src, rows, slice, Kp);
    stage_weights<F>(slot + kActBytes, wr, slice, q, K);
  };
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < slices) issue(st);
    cp_async_commit();
  }
  SliceScales<F> cur, nxt;
  load_scales<F>(cur, wr, 0, q, K, block_cols_log2);
#pragma unroll 1
  for (int s = 0; s < slices; ++s) {
    // Slice s + 1's scales in flight during slice s.
    load_scales<F>(nxt, wr, s + 1, q, K, block_cols_log2);
    cp_async_wait<kAhead - 1>();
    fence_async_shared();  // this thread's copies of slice s visible to wgmma
    // Slice s landed for every thread, and the slot refilled below is free (see above). The
    // two-factor decode where any lane of the CTA needs it (wgmma wants the warpgroup on one
    // instruction stream).
    const bool two = __syncthreads_or(needs_two_factors<F>(cur) ? 1 : 0) != 0;
    if (s + kAhead < slices) issue(s + kAhead);
    cp_async_commit();
    const uint8_t* slot = smem + (s % kStages) * kStageBytes;
    if (two) {
      multiply_slice_wgmma<F, kPlanes, kN, true, kLag>(acc, slot + kActBytes, cur, slot);
    } else {
      multiply_slice_wgmma<F, kPlanes, kN, false, kLag>(acc, slot + kActBytes, cur, slot);
    }
    cur = nxt;
  }
  wgmma_wait<0>();
  fence_tile_accumulators(acc);
}

// kGateUp: act[row, n] = swiglu(x[token] . w1_e[n], x[token] . w3_e[n]) for the tile's rows and
// 128 columns n (a = staged x [tokens], K = H, N = I). Otherwise y[pair, n] = act[row] . w2_e[n]
// for 256 columns (a = staged act [pairs], K = I, N = H). CTA blockIdx.x works on tile
// blockIdx.x % max_tiles and column block blockIdx.x / max_tiles, as experts_quant.cu's kernel.
template <QuantFormat F, bool kGateUp, int kPlanes>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    expert_quant_wgmma_kernel(const __nv_bfloat16* __restrict__ a, int64_t K, int64_t N, int top_k,
                              const int32_t* __restrict__ sorted_pair, TileList tiles,
                              int max_tiles, QuantMatrices lo, QuantMatrices hi, int block_rows,
                              int block_cols_log2, float limit, float* __restrict__ out) {
  constexpr int kM = Tile::kMTiles;
  constexpr int kHalf = kGateUp ? kM / 2 : kM;  // m16 tiles per matrix
  extern __shared__ __align__(128) uint8_t wgmma_smem_raw[];
  __shared__ int64_t row_src[Tile::kTok];

  const int tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(max_tiles));
  const int col = static_cast<int>(blockIdx.x / static_cast<unsigned>(max_tiles));
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int n8 = (rows + 7) / 8;
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;

  // tile_rows: where each token row's staged planes start (read after gemm_tile's barrier).
  if (tid < Tile::kTok) {
    int64_t src = 0;
    if (tid < rows) {
      const int64_t row = kGateUp ? sorted_pair[start + tid] / top_k : start + tid;
      src = row * kPlanes * Kp;
    }
    row_src[tid] = src;
  }
  __syncthreads();

  // The warp's first weight row, and the lane's rows (lane_weight_rows).
  const int64_t n_warp = static_cast<int64_t>(col) * (Tile::kWeightRows / (kGateUp ? 2 : 1)) +
                         static_cast<int64_t>(warp) * 16 * kHalf;
  WeightRows<kM> wr =
      lane_weight_rows<F, kM, kGateUp>(lo, hi, e, n_warp, g, N, K, block_rows, block_cols_log2);

  float acc[kM][Tile::kTok / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int j = 0; j < Tile::kTok / 8; ++j)
      acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }
  // The smallest wgmma n of 32, 64, 96, 128 that covers the tile's rows (uniform over the CTA):
  // at 4096 tokens a pass's experts average 96 pairs (V4-Flash, top-6 of 256).
  if (rows <= 32) {
    gemm_tile<F, kPlanes, 32>(acc, wgmma_smem_raw, a, row_src, rows, K, Kp, wr, q, block_cols_log2);
  } else if (rows <= 64) {
    gemm_tile<F, kPlanes, 64>(acc, wgmma_smem_raw, a, row_src, rows, K, Kp, wr, q, block_cols_log2);
  } else if (rows <= 96) {
    gemm_tile<F, kPlanes, 96>(acc, wgmma_smem_raw, a, row_src, rows, K, Kp, wr, q, block_cols_log2);
  } else {
    gemm_tile<F, kPlanes, 128>(acc, wgmma_smem_raw, a, row_src, rows, K, Kp, wr, q,
                               block_cols_log2);
  }
  store_tile<kGateUp, Tile>(acc, N, n_warp, sorted_pair, start, rows, n8, limit, out, g, q);
}

template <QuantFormat F, int kPlanes>
void launch_stage(const float* src, int64_t rows, int64_t K, __nv_bfloat16* dst,
                  cudaStream_t stream) {
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int64_t n = rows * (Kp / 8);
  if (n == 0) return;
  stage_wgmma_kernel<F, kPlanes><<<ceil_div(n, 256), 256, 0, stream>>>(src, rows, K, Kp, dst);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

// Activation quantization (bit-identical to the CPU op) into `qbuf` (may be `src`), then staging.
template <QuantFormat F>
void quantize_and_stage(const float* src, float* qbuf, int64_t rows, int64_t K, int group,
                        __nv_bfloat16* dst, cudaStream_t stream) {
  if (group > 0) {
    launch_quantize_activations(src, qbuf, rows, K, group, /*pdl=*/false, stream);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    launch_stage<F, 1>(qbuf, rows, K, dst, stream);
  } else {
    launch_stage<F, 3>(src, rows, K, dst, stream);
  }
}

template <QuantFormat F, bool kGateUp, int kPlanes>
void launch_gemm(const QuantExpertsArgs& p, const __nv_bfloat16* a, float* out,
                 cudaStream_t stream) {
  const int64_t K = kGateUp ? p.hidden : p.inter;
  const int64_t N = kGateUp ? p.inter : p.hidden;
  const int64_t block_cols = Tile::kWeightRows / (kGateUp ? 2 : 1);
  const int64_t cols = (N + block_cols - 1) / block_cols;
  const int smem = static_cast<int>(Tile::smem_bytes(kPlanes, QuantTraits<F>::kLoads));
  auto kernel = expert_quant_wgmma_kernel<F, kGateUp, kPlanes>;
  DEEPINFER_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Grid size: checked against gridDim.x's limit by the caller.
  kernel<<<static_cast<unsigned>(p.max_tiles * cols), Tile::kThreads, smem, stream>>>(
      a, K, N, p.top_k, p.sorted_pair, p.tiles, static_cast<int>(p.max_tiles),
      kGateUp ? p.w1 : p.w2, kGateUp ? p.w3 : p.w2, p.block_rows, p.block_cols_log2, p.limit, out);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template <QuantFormat F, bool kGateUp>
void launch_gemm_planes(const QuantExpertsArgs& p, int group, const __nv_bfloat16* a, float* out,
                        cudaStream_t stream) {
  if (group > 0) {
    launch_gemm<F, kGateUp, 1>(p, a, out, stream);
  } else if constexpr (Tile::fits(3, QuantTraits<F>::kLoads)) {
    launch_gemm<F, kGateUp, 3>(p, a, out, stream);
  } else {
    // moe_heuristics.h keeps this shape on the mma.sync kernel (quant_wgmma_fits).
    throw Error(ErrorCode::kInternal,
                "moe_experts: the wgmma prefill kernel has no ring for FP8 experts without "
                "activation quantization");
  }
}

template <QuantFormat F>
void run_pass(const QuantExpertsArgs& p, const float* x, int64_t tokens, float* xq,
              __nv_bfloat16* xs, float* act, __nv_bfloat16* as, float* y, cudaStream_t stream) {
  const int64_t pairs = tokens * p.top_k;
  quantize_and_stage<F>(x, xq, tokens, p.hidden, p.in_group, xs, stream);
  launch_gemm_planes<F, true>(p, p.in_group, xs, act, stream);
  quantize_and_stage<F>(act, act, pairs, p.inter, p.down_group, as, stream);
  launch_gemm_planes<F, false>(p, p.down_group, as, y, stream);
}

}  // namespace

void launch_experts_quant_wgmma(const QuantExpertsArgs& p, const float* x, int64_t tokens,
                                float* xq, __nv_bfloat16* xs, float* act, __nv_bfloat16* as,
                                float* y, cudaStream_t stream) {
  if (p.format == QuantFormat::kMxfp4) {
    run_pass<QuantFormat::kMxfp4>(p, x, tokens, xq, xs, act, as, y, stream);
  } else {
    run_pass<QuantFormat::kFp8>(p, x, tokens, xq, xs, act, as, y, stream);
  }
}

}  // namespace deepinfer::cuda
