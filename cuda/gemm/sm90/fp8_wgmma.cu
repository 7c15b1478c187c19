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
//                    K range itself, straight into shared memory (the same 128-byte swizzle);
//                    otherwise quantize_rows_e4m3 (gemm_fp8.cu) writes q(x) once and each CTA
//                    copies its tile (cp.async). Both with the same math: the same bytes.
//                    A RowNorm of x (linear's, linear_pair's) is applied where x is quantized, in
//                    rms_norm's arithmetic (each CTA sums the squares of its tokens' rows).
//   the math         each of the 4 warps takes 16 of the tile's 64 rows: mma.sync m16n8k32 e4m3
//                    (f32 sums, as the FP8 GEMV), the operands read from the swizzled stages;
//                    each stage's sum is folded into the total with its two scales.
//   reduce_splits    the `splits` CTAs of a row tile (one cluster, each a contiguous range of
//                    stages) put their partial tiles in shared memory and add them through
//                    distributed shared memory in split order (no atomics, no workspace).
//
// Every product is exact and summed in f32, so y differs from the CPU reference by summation
// order only, fixed by the K split, which depends on N, K, G and the SM count only: a token's
// result does not depend on the other tokens of its batch. The names say wgmma after the first
// version's math: FP8 wgmma, whose tensor-core sums keep fewer bits than f32 (DeepGEMM's
// observation). It differed from the GEMV by up to 5.7e-4 of max |y| on the real-format test
// checkpoints, enough to flip their top-k choices (session 48), where this math matches the CPU
// emulation to ~3e-7 (session 49; benchmarks/RESULTS.md).
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
  const float* x;             // [M, G K] f32, quantized here; nullptr: xq and xs
  const uint8_t* xq;          // [G][m_pad][K] e4m3 (quantize_rows_e4m3)
  const float* xs;            // [G][ceil(K / 128)][m_pad]
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

// The fused quantization: the CTA's activation tiles (kb blocks of its K range, the 128-byte
// swizzle) and scales from x, per (token, 128 columns) exactly as quantize_rows_e4m3 (one warp an
// item, 4 columns a lane); tokens past M are zeros with scale 0. Each warp keeps kBatch items'
// loads in flight. With a.norm_w, x's rows are normed first (row_inv: each token's 1 / rms).
template <int kTok>
__device__ __forceinline__ void quantize_tiles(const WgmmaArgs& a, int g, int kb0, int nk,
                                               uint8_t* acts, float* act_scales,
                                               const float* row_inv) {
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
    __shared__ float row_inv[kTok];
    if (a.norm_w != nullptr) {
      block_rows_rms_inv(row_inv, a.x, static_cast<int>(a.m < kTok ? a.m : kTok), a.groups * a.k,
                         a.k, a.norm_eps);
    }
    quantize_tiles<kTok>(a, g, kb0, nk, acts, act_scales, row_inv);
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

  // The partial tile, token-major (rows contiguous: the stores to y coalesce along N), in the
  // ring, which no copy writes any more; every warp is past its last read of it first.
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
