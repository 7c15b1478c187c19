// The Hopper weight stream of linear / grouped_linear / linear_pair on block-scaled FP8 weights
// for decode batches (gemm_fp8_heuristics.h: choose_fp8_wgmma): y[m, n] = sum over 128-column
// blocks kb of (sum_k q(x)[m, k] w[n, k]) * w_scale[n / block_rows, kb] * x_scale[m, kb].
//
// At these sizes every weight byte serves at most 64 tokens, so the kernel is bound by the bytes
// in flight. The weights go straight from HBM to the tensor cores without passing a register:
//
//   the ring         one thread per CTA issues tensor copies (TMA, 128-byte swizzle) of its 64
//                    weight rows x 128 columns per stage into a ring of kFp8WgmmaStages stages,
//                    one mbarrier per stage; the first stages before the wait on the previous
//                    grid (weights depend on no kernel), so they stream while the activations are
//                    quantized.
//   activations      q(x): e4m3 with power-of-two scales per 128 columns. For small
//                    tiles (kFp8WgmmaFusedQuantMaxItems) each CTA quantizes its token tile of its
//                    K range itself, straight into shared memory (the same 128-byte swizzle);
//                    otherwise quantize_rows_e4m3 (gemm_fp8.cu) writes q(x) once and each CTA
//                    copies its tile (cp.async). Both with the same math: the same bytes.
//   wgmma            m64nTk32 e4m3 x e4m3 -> f32 with the weights as A (64 rows) and the tokens
//                    as B (T = 8, 16, 32 or 64 columns), four per stage. The FP8 tensor cores
//                    add with fewer bits than f32 (DeepGEMM's observation), so each stage's sum
//                    lands in its own accumulator and is folded into the f32 total with its two
//                    scales on the CUDA cores (the promotion), while the next stage's wgmmas run.
//   reduce_splits    the `splits` CTAs of a row tile (one cluster, each a contiguous range of
//                    stages) put their partial tiles in shared memory and add them through
//                    distributed shared memory in split order (no atomics, no workspace).
//
// Every product is exact; y differs from the CPU reference by the tensor cores' summation inside a
// 128-column block and the f32 order of the promotions, fixed by the K split, which depends on N,
// K, G and the SM count only: a token's result does not depend on the other tokens of its batch.
// That summation is far from f32's: against the FP8 GEMV (~1e-7 of the CPU emulation) the
// real-format test checkpoints' linears differed by up to 5.7e-4 of max |y| (K = 32, session 48),
// enough to flip their top-k choices, which is why the path is opt-in (fp8_linear_choice.h).
#include <cooperative_groups.h>
#include <cuda.h>

#include <cstdint>
#include <vector>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/gemm/gemm_launch.h"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kRows = kFp8WgmmaRows;
constexpr int kSliceK = kFp8WgmmaSliceK;
constexpr int kStages = kFp8WgmmaStages;
constexpr int kThreads = 128;  // one warpgroup
constexpr uint32_t kWeightStageBytes = kRows * kSliceK;
static_assert(kRows == 64 && kSliceK == 128, "one m64 tile of 128-byte swizzled rows per stage");

// d (64 x T f32) += a (64 x 32 e4m3, shared) . b (32 x T e4m3, shared), or = when !accumulate.
template <int kTok>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[kTok / 2], uint64_t a, uint64_t b,
                                           bool accumulate);

#define DEEPINFER_WG_ACC4(i) "+f"(d[i]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])

template <>
__device__ __forceinline__ void wgmma_e4m3<8>(float (&d)[4], uint64_t a, uint64_t b,
                                              bool accumulate) {
  DEEPINFER_WGMMA(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : DEEPINFER_WG_ACC4(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<16>(float (&d)[8], uint64_t a, uint64_t b,
                                               bool accumulate) {
  DEEPINFER_WGMMA(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, "
      "%9, p, 1, 1;\n}\n"
      : DEEPINFER_WG_ACC4(0), DEEPINFER_WG_ACC4(4)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], uint64_t a, uint64_t b,
                                               bool accumulate) {
  DEEPINFER_WGMMA(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : DEEPINFER_WG_ACC4(0), DEEPINFER_WG_ACC4(4), DEEPINFER_WG_ACC4(8), DEEPINFER_WG_ACC4(12)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], uint64_t a, uint64_t b,
                                               bool accumulate) {
  DEEPINFER_WGMMA(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : DEEPINFER_WG_ACC4(0), DEEPINFER_WG_ACC4(4), DEEPINFER_WG_ACC4(8), DEEPINFER_WG_ACC4(12),
        DEEPINFER_WG_ACC4(16), DEEPINFER_WG_ACC4(20), DEEPINFER_WG_ACC4(24), DEEPINFER_WG_ACC4(28)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

#undef DEEPINFER_WG_ACC4

// A K-major operand of 128-byte rows with the 128-byte swizzle (8-row groups 1 KB apart; the
// tile 1 KB aligned): cute's canonical layout, the leading byte offset unused.
__device__ __forceinline__ uint64_t swizzled_kmajor_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

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
  const float* x;             // [M, G K] f32, quantized here; nullptr: xq and xs
  const uint8_t* xq;          // [G][m_pad][K] e4m3 (quantize_rows_e4m3)
  const float* xs;            // [G][ceil(K / 128)][m_pad]
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

// The fused quantization: the CTA's activation tiles (kb blocks of its K range, the 128-byte
// swizzle) and scales from x, per (token, 128 columns) exactly as quantize_rows_e4m3 (one warp an
// item, 4 columns a lane); tokens past M are zeros with scale 0. Each warp keeps kBatch items'
// loads in flight.
template <int kTok>
__device__ __forceinline__ void quantize_tiles(const WgmmaArgs& a, int g, int kb0, int nk,
                                               uint8_t* acts, float* act_scales) {
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
      const float inv = 1.0f / scale;  // exact: a power of two
      const float f[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        packed |=
            static_cast<uint32_t>(__nv_cvt_float_to_fp8(f[e] * inv, __NV_SATFINITE, __NV_E4M3))
            << (8 * e);
      }
      uint8_t* row = acts + kb * WgmmaSmem<kTok>::kActTile + r * kSliceK;
      *reinterpret_cast<uint32_t*>(row + (((lane >> 2) ^ (r & 7)) << 4) + 4 * (lane & 3)) = packed;
      if (lane == 0) act_scales[kb * kTok + r] = scale;
    }
  }
  // The pad tokens' rows and scales.
  const int pad = kTok - tokens;
  for (int c = static_cast<int>(threadIdx.x); c < nk * pad * 8; c += kThreads) {
    const int kb = c / (pad * 8);
    const int r = tokens + (c / 8) % pad;
    *reinterpret_cast<uint4*>(acts + kb * WgmmaSmem<kTok>::kActTile + r * kSliceK + (c % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
  for (int i = static_cast<int>(threadIdx.x); i < nk * pad; i += kThreads) {
    act_scales[(i / pad) * kTok + tokens + i % pad] = 0.0f;
  }
}

template <int kTok>
__global__ void __launch_bounds__(kThreads) fp8_wgmma_kernel(WgmmaArgs a) {
  constexpr int kAcc = kTok / 2;  // a 64 x T f32 tile over 128 threads
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* ring = smem;
  uint8_t* acts = ring + kStages * kWeightStageBytes;
  // After the 1 KB activation tiles: 8-byte aligned whatever kb_per_split is.
  uint64_t* full = reinterpret_cast<uint64_t*>(acts + a.kb_per_split * WgmmaSmem<kTok>::kActTile);
  float* act_scales = reinterpret_cast<float*>(full + kStages);
  float* weight_scales = act_scales + a.kb_per_split * kTok;

  const int tid = static_cast<int>(threadIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const bool second = blockIdx.x >= a.first.row_tiles * a.groups;
  const WgmmaWeight& w = second ? a.second : a.first;
  const int64_t tile = second ? blockIdx.x - a.first.row_tiles * a.groups : blockIdx.x;
  const int g = static_cast<int>(tile / w.row_tiles);
  const int64_t row0 = (tile % w.row_tiles) * kRows;  // within the group
  const int64_t weight_row = g * w.n + row0;          // of the weight's matrix
  const int kb_total = static_cast<int>((a.k + kSliceK - 1) / kSliceK);
  const int kb0 = split * a.kb_per_split;
  const int nk = min(kb_total, kb0 + a.kb_per_split) - kb0;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    mbarrier_init_fence();
  }
  __syncthreads();
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
    quantize_tiles<kTok>(a, g, kb0, nk, acts, act_scales);
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
  fence_async_shared();  // the activation tiles, written by the generic proxy, feed wgmma
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  // Accumulator layout (m64nT): element 4j + 2h + e is row 16 warp + lane / 4 + 8h, token
  // 8j + 2 (lane % 4) + e.
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
  const uint32_t acts_addr = smem_addr(acts);
  // Stage i's four wgmmas into `part`; then stage i - 1's sum (in `prev`, its wgmmas waited
  // for) is promoted and its ring stage refilled with stage i - 1 + kStages.
  const auto step = [&](int i, float(&part)[kAcc], float(&prev)[kAcc]) {
    const int s = i % kStages;
    mbarrier_wait(&full[s], static_cast<uint32_t>(i / kStages) & 1);
    const uint32_t wst = ring_addr + s * kWeightStageBytes;
    const uint32_t ast = acts_addr + i * static_cast<uint32_t>(WgmmaSmem<kTok>::kActTile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_e4m3<kTok>(part, swizzled_kmajor_desc(wst + 32 * kk),
                       swizzled_kmajor_desc(ast + 32 * kk), kk > 0);
    }
    wgmma_commit();
    if (i > 0) {
      wgmma_wait<1>();
      fence_accumulators(prev);
      promote(prev, i - 1);
      // Every warp's wgmmas of stage i - 1 are done with its ring stage.
      named_barrier<kThreads>(1);
      if (tid == 0 && i - 1 + kStages < nk) issue(i - 1 + kStages);
    }
  };
  float part0[kAcc], part1[kAcc];
  int i = 0;
  for (; i + 1 < nk; i += 2) {
    step(i, part0, part1);
    step(i + 1, part1, part0);
  }
  if (i < nk) step(i, part0, part1);
  wgmma_wait<0>();
  if (nk > 0) {
    if ((nk - 1) % 2 == 1) {
      fence_accumulators(part1);
      promote(part1, nk - 1);
    } else {
      fence_accumulators(part0);
      promote(part0, nk - 1);
    }
  }

  // The partial tile, token-major (rows contiguous: the stores to y coalesce along N), in the
  // ring, which no copy writes any more. A warp's wgmma_wait covers its own share of the last
  // wgmmas only, and with 1 or 2 (mod 4) stages the last one read the ring's first stages: every
  // warp is past its wait before any overwrites them.
  __syncthreads();
  float* part_tile = reinterpret_cast<float*>(ring);
  const int r_lo = warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < kTok / 8; ++j) {
    const int t = 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      part_tile[t * kRows + r_lo + 8 * h] = acc[4 * j + 2 * h];
      part_tile[(t + 1) * kRows + r_lo + 8 * h] = acc[4 * j + 2 * h + 1];
    }
  }
  const int64_t ld_y = static_cast<int64_t>(a.groups) * w.n;
  const int64_t tokens = a.m < kTok ? a.m : kTok;
  const int entries = static_cast<int>(tokens) * kRows;
  if (splits == 1) {
    __syncthreads();
    for (int e = tid; e < entries; e += kThreads) {
      const int64_t row = row0 + (e % kRows);
      if (row < w.n) w.y[(e / kRows) * ld_y + g * w.n + row] = part_tile[e];
    }
    return;
  }
  // reduce_splits: CTA `split` of the cluster stores its share of the tile, adding the partials
  // of splits 0..S-1 in order (the same order whichever CTA adds them).
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int begin = split * entries / splits;
  const int end = (split + 1) * entries / splits;
  for (int e = begin + tid; e < end; e += kThreads) {
    float v = *cluster.map_shared_rank(part_tile + e, 0);
    for (int r = 1; r < splits; ++r) v += *cluster.map_shared_rank(part_tile + e, r);
    const int64_t row = row0 + (e % kRows);
    if (row < w.n) w.y[(e / kRows) * ld_y + g * w.n + row] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

template <int kTok>
void launch_tokens(const WgmmaArgs& a, const Fp8WgmmaConfig& c, KernelSmemLimits& smem_limits,
                   bool pdl, cudaStream_t stream) {
  const size_t smem = WgmmaSmem<kTok>::bytes(c.kb_per_split);
  smem_limits.allow(fp8_wgmma_kernel<kTok>, smem);
  ClusterLaunch l;
  const int64_t tiles = a.first.row_tiles * a.groups + a.second.row_tiles;
  l.grid = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(c.splits), 1);
  l.block = dim3(kThreads);
  l.cluster = dim3(1, static_cast<unsigned>(c.splits), 1);
  l.smem = smem;
  l.stream = stream;
  l.pdl = pdl;
  launch_clustered("linear (fp8 wgmma)", l, fp8_wgmma_kernel<kTok>, a);
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
  a.xs = l.xs;
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
