// The decode GEMV of linear / grouped_linear on block-scaled FP8 weights with dynamic activation
// quantization: y[m, n] = sum_k q(x)[m, k] * w[n, k] for 1..16 tokens, on FP8 tensor cores.
//
// Grid (row tiles, splits, groups); the `splits` CTAs of a row tile form one thread-block cluster
// and each covers a slab of K (a multiple of act_group). A CTA runs three phases:
//   quantize_slab   x[:, slab] -> e4m3 bytes and one power-of-two scale per (token, act group) in
//                   shared memory, exactly as quantize_activations (same amax, scale, rounding);
//                   with a RowNorm of x (linear's, linear_pair's), each row normed first in
//                   rms_norm's arithmetic (every CTA sums the squares of the token's whole row);
//   load_chunk /    each warp streams 16 weight rows of the slab, 256 columns at a time, with
//   math_chunk      16-byte (8-byte) loads that bypass L1, and feeds them with the e4m3
//                   activations to mma.m16n8k32.e4m3.e4m3.f32 (one per 8 tokens), folding each
//                   64-column (32) step's f32 partial into the accumulator times w_scale * x_scale;
//   reduce_splits   the cluster's CTAs add their partial tiles through distributed shared memory,
//                   in split order, and store y (no atomics, no workspace, no memset).
// Products of two e4m3 values are exact and the scales are powers of two (the activation scales
// always, the weight scales in DeepSeek's checkpoints), so y differs from the CPU reference (f32
// GEMM on the dequantized operands) by f32 summation order only; with other weight scales by the
// rounding of one product per scale block.
//
// The reduction dimension is permuted consistently for both operands: a thread's 16 contiguous
// weight bytes of row r and its 16 contiguous activation bytes of token t (at the same k) are the
// four A registers (rows g, g + 8) and two B registers of two mma steps, whose k positions the
// fragment layout fixes identically for A and B. So neither operand needs a shuffle or ldmatrix.
//
// The kernel is latency bound at decode sizes (one or two warps per scheduler), so its
// instruction count is its time: index arithmetic uses shifts and 32-bit offsets, never a 64-bit
// division (session 19: they were ~45% of its instructions at N 512, K 4096; 9.5 -> 6.1 us).
#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/gemm/gemm_launch.h"
#include "cuda/norm/rms_norm_math.cuh"

namespace deepinfer::cuda {

namespace {

namespace cg = cooperative_groups;

struct Fp8GemvArgs {
  const float* x;    // [M, ldx]; group g reads columns [g K, (g + 1) K)
  const uint8_t* w;  // [G N, K] e4m3
  const float* ws;   // [ceil(G N / br), ws_ld] f32 weight scales
  float* y;          // [M, ldy]; group g writes columns [g N, (g + 1) N)
  int64_t ldx, ldy, ws_ld;
  int64_t n, k, slab;
  // A pair (linear_pair, G = 1): row tiles from first_tiles on read the second weight (w2 [n2,
  // K], its scales ws2 [ceil(n2 / br), ws_ld2]) and write y2 [M, n2]; n is the first's rows, a
  // multiple of the CTA's. A single weight: first_tiles covers the grid.
  const uint8_t* w2;
  const float* ws2;
  float* y2;
  int64_t ws_ld2, n2;
  int first_tiles;
  int m, ag;
  // x's RowNorm (G = 1): rows are rms_norm(x, norm_w, norm_eps) where they are quantized; null:
  // none.
  const float* norm_w;
  float norm_eps;
  // log2 of the weight blocks' rows and columns and of act_group (choose_fp8_gemv takes powers
  // of two only): a column's scales are found by shifts, not divisions.
  int br_shift, bc_shift, ag_shift;
};

// Bytes of a lane's load per row and step: 16 (kstep 64) or 8 (kstep 32).
template <int KS>
struct Frag;
template <>
struct Frag<64> {
  using Raw = uint4;
  static constexpr int kWords = 4;
  __device__ static uint32_t word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
  }
  __device__ static uint4 load_stream(const uint8_t* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  }
};
template <>
struct Frag<32> {
  using Raw = uint2;
  static constexpr int kWords = 2;
  __device__ static uint32_t word(const uint2& v, int i) { return i == 0 ? v.x : v.y; }
  __device__ static uint2 load_stream(const uint8_t* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
  }
};

// Shared memory of a CTA: the slab's quantized activations (rows of slab + 16 bytes, so the 8
// tokens of a load phase hit distinct banks), their scales, and the partial y tile.
struct SlabSmem {
  uint8_t* xq;  // [8 NT][xld]
  float* xs;    // [8 NT][slab / ag]
  float* part;  // [8 NT][16 warps]
  int64_t xld;
  int64_t per_row;  // act groups per slab
};

__host__ __device__ inline int64_t slab_xld(int64_t slab) {
  return slab + 16;
}
__host__ __device__ inline size_t gemv_fp8_smem(int nt, int64_t slab, int ag, int warps) {
  const int64_t tok = 8 * nt;
  return static_cast<size_t>(tok * slab_xld(slab) + tok * (slab / ag) * 4 + tok * 16 * warps * 4);
}

// Phase 1's batching: act groups of up to 32 x kQuantVals columns are quantized kQuantBatch at
// a time per warp, their values in registers.
constexpr int kQuantBatch = 4;
constexpr int kQuantVals = 4;

// Phase 1: x[:, k0:k1] of group g as e4m3 bytes and scales. Tokens past M and columns past k1
// are zeros, so they add nothing in the tensor-core steps: the rows of tokens past M are cleared
// with 16-byte stores; each (token < M, act group) takes one warp, the warps striding over them
// in (token, group) order. Offsets are 32-bit (a 64-bit division by a runtime value costs a warp
// ~70 instructions, more than the rest of an act group's work).
// row_inv: with a.norm_w, each token's 1 / rms (x[t, c] becomes (x[t, c] * row_inv[t]) * w[c]).
template <int NT>
__device__ void quantize_slab(const Fp8GemvArgs& a, const SlabSmem& s, int64_t g, int64_t k0,
                              int64_t k1, const float* row_inv) {
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int warps = static_cast<int>(blockDim.x >> 5);
  const int per_row = static_cast<int>(s.per_row);
  const int xld = static_cast<int>(s.xld);
  const int width = static_cast<int>(k1 - k0);  // the slab's columns that exist
  {
    // xld = slab + 16 is a multiple of 16 (slab is of act_group, a multiple of 32).
    uint4* zeros = reinterpret_cast<uint4*>(s.xq + a.m * xld);
    const int words = (8 * NT - a.m) * xld / 16;
    for (int i = static_cast<int>(threadIdx.x); i < words; i += static_cast<int>(blockDim.x)) {
      zeros[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    const int scales = (8 * NT - a.m) * per_row;
    for (int i = static_cast<int>(threadIdx.x); i < scales; i += static_cast<int>(blockDim.x)) {
      s.xs[a.m * per_row + i] = 0.0f;
    }
  }
  const float* x = a.x + g * a.k + k0;
  const float* norm_w = a.norm_w != nullptr ? a.norm_w + k0 : nullptr;
  const auto value = [&](int t, int c) {
    const float v = x[t * a.ldx + c];
    return norm_w != nullptr ? (v * row_inv[t]) * __ldg(norm_w + c) : v;
  };
  const int items = a.m * per_row;
  if (a.ag <= 32 * kQuantVals) {
    // A lane holds a group's columns lane + 32 i (i < ag / 32) of kQuantBatch items at once: the
    // items' loads are in flight together (one L2 round trip per batch, not per item: at 16
    // tokens a warp has 16 groups to quantize).
    const int vals = a.ag >> 5;
    for (int first = warp; first < items; first += kQuantBatch * warps) {
      float v[kQuantBatch][kQuantVals];
      float amax[kQuantBatch];
#pragma unroll
      for (int b = 0; b < kQuantBatch; ++b) {
        const int item = first + b * warps;
        const int t = item / per_row;
        const int c0 = (item - t * per_row) * a.ag;
        amax[b] = 0.0f;
#pragma unroll
        for (int i = 0; i < kQuantVals; ++i) {
          const int c = c0 + lane + 32 * i;
          v[b][i] = item < items && i < vals && c < width ? value(t, c) : 0.0f;
          amax[b] = fmaxf(amax[b], fabsf(v[b][i]));
        }
      }
#pragma unroll
      for (int b = 0; b < kQuantBatch; ++b) amax[b] = warp_max(amax[b]);
#pragma unroll
      for (int b = 0; b < kQuantBatch; ++b) {
        const int item = first + b * warps;
        if (item >= items) break;
        const int t = item / per_row;
        const int gi = item - t * per_row;
        const int c0 = gi * a.ag;
        // A group wholly past k1 (the last split's tail): zero bytes, its scale stored as 0.
        const float scale = act_group_scale(amax[b]);
        const float inv = __frcp_rn(scale);  // exact: a power of two
        uint8_t* dst = s.xq + t * xld + c0;
#pragma unroll
        for (int i = 0; i < kQuantVals; ++i) {
          if (i < vals) {
            dst[lane + 32 * i] = static_cast<uint8_t>(
                __nv_cvt_float_to_fp8(v[b][i] * inv, __NV_SATFINITE, __NV_E4M3));
          }
        }
        if (lane == 0) s.xs[t * per_row + gi] = c0 < width ? scale : 0.0f;
      }
    }
    return;
  }
  int t = warp / per_row;
  int gi = warp - t * per_row;
  while (t < a.m) {
    const int c0 = gi * a.ag;
    const int c1 = min(c0 + a.ag, width);
    uint8_t* dst = s.xq + t * xld + c0;
    float amax = 0.0f;
    for (int c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(value(t, c)));
    // A group wholly past k1 (the last split's tail): zero bytes, its scale stored as 0.
    const float scale = act_group_scale(warp_max(amax));
    const float inv = __frcp_rn(scale);  // exact: a power of two
    for (int j = lane; j < a.ag; j += 32) {
      const int c = c0 + j;
      dst[j] = c < c1 ? static_cast<uint8_t>(
                            __nv_cvt_float_to_fp8(value(t, c) * inv, __NV_SATFINITE, __NV_E4M3))
                      : uint8_t{0};
    }
    if (lane == 0) s.xs[t * per_row + gi] = c0 < c1 ? scale : 0.0f;
    gi += warps;
    while (gi >= per_row) {
      gi -= per_row;
      ++t;
    }
  }
}

// Phase 2, in chunks of kChunkCols columns: a lane's weight bytes of rows g and g + 8 and the
// two rows' weight scales of each of the chunk's KS-column steps, loaded together (one round
// trip), then multiplied.
constexpr int kChunkCols = 256;
template <int KS>
struct WeightChunk {
  static constexpr int kSteps = kChunkCols / KS;
  typename Frag<KS>::Raw ra[kSteps], rb[kSteps];
  float sa[kSteps], sb[kSteps];
};

// Issues chunk [kk, kk + kChunkCols)'s loads; steps at or past k1 load nothing (zeros).
template <int KS>
__device__ __forceinline__ void load_chunk(WeightChunk<KS>& c, const uint8_t* wa, const uint8_t* wb,
                                           const float* wsa, const float* wsb, int64_t kk,
                                           int64_t k1, int64_t lane_k, int bc_shift) {
  using F = Frag<KS>;
  using Raw = typename F::Raw;
#pragma unroll
  for (int u = 0; u < WeightChunk<KS>::kSteps; ++u) {
    const int64_t ks = kk + u * KS;
    const int64_t k = ks + lane_k;
    const bool in = k < k1;  // K % 16 == 0: a lane's bytes are all in or all out
    c.ra[u] = in ? F::load_stream(wa + k) : Raw{};
    c.rb[u] = in ? F::load_stream(wb + k) : Raw{};
    const bool step_in = ks < k1;
    c.sa[u] = step_in ? __ldg(wsa + (ks >> bc_shift)) : 0.0f;
    c.sb[u] = step_in ? __ldg(wsb + (ks >> bc_shift)) : 0.0f;
  }
}

// acc[j] (rows g, g + 8 of the warp's 16; tokens 2 q, 2 q + 1 of the j-th 8) += chunk [kk, ..)
// of columns [k0, k1), each KS-column step's f32 partial folded in times w_scale * x_scale.
template <int KS, int NT>
__device__ __forceinline__ void math_chunk(const Fp8GemvArgs& a, const SlabSmem& s,
                                           const WeightChunk<KS>& c, int64_t kk, int64_t k0,
                                           int64_t k1, float (&acc)[NT][4]) {
  using F = Frag<KS>;
  using Raw = typename F::Raw;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2;
  const int q = lane & 3;
  const int64_t lane_k = static_cast<int64_t>(q) * (KS / 4);
#pragma unroll
  for (int u = 0; u < WeightChunk<KS>::kSteps; ++u) {
    const int64_t ks = kk + u * KS;
    if (ks >= k1) break;
    const int64_t off = ks - k0;
    float part[NT][4] = {};
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const Raw xb = *reinterpret_cast<const Raw*>(s.xq + (g + 8 * j) * s.xld + off + lane_k);
#pragma unroll
      for (int st = 0; st < F::kWords / 2; ++st) {
        mma_e4m3(part[j], F::word(c.ra[u], 2 * st), F::word(c.rb[u], 2 * st),
                 F::word(c.ra[u], 2 * st + 1), F::word(c.rb[u], 2 * st + 1), F::word(xb, 2 * st),
                 F::word(xb, 2 * st + 1));
      }
    }
    const int gi = static_cast<int>(off >> a.ag_shift);
    const int per_row = static_cast<int>(s.per_row);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float x0 = s.xs[(2 * q + 8 * j) * per_row + gi];
      const float x1 = s.xs[(2 * q + 1 + 8 * j) * per_row + gi];
      acc[j][0] = fmaf(part[j][0], c.sa[u] * x0, acc[j][0]);
      acc[j][1] = fmaf(part[j][1], c.sa[u] * x1, acc[j][1]);
      acc[j][2] = fmaf(part[j][2], c.sb[u] * x0, acc[j][2]);
      acc[j][3] = fmaf(part[j][3], c.sb[u] * x1, acc[j][3]);
    }
  }
}

template <int KS, int NT>
__global__ void __launch_bounds__(kFp8GemvMaxWarps * 32) gemv_fp8_kernel(Fp8GemvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warps = static_cast<int>(blockDim.x >> 5);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int rows_cta = 16 * warps;  // warps is 4 or 8: a power of two
  const int rows_shift = 31 - __clz(rows_cta);
  const int64_t g = blockIdx.z;
  const int split = static_cast<int>(blockIdx.y);
  const int splits = static_cast<int>(gridDim.y);
  const int64_t k0 = split * a.slab;
  const int64_t k1 = k0 + a.slab < a.k ? k0 + a.slab : a.k;
  SlabSmem s;
  s.xld = slab_xld(a.slab);
  s.per_row = a.slab / a.ag;
  s.xq = smem;
  s.xs = reinterpret_cast<float*>(smem + 8 * NT * s.xld);
  s.part = s.xs + 8 * NT * s.per_row;

  // The weight this CTA's rows are of (a pair's second from first_tiles on; uniform per CTA).
  const bool second = static_cast<int>(blockIdx.x) >= a.first_tiles;
  const int64_t tile0 =
      static_cast<int64_t>(second ? static_cast<int>(blockIdx.x) - a.first_tiles : blockIdx.x) *
      rows_cta;
  const int64_t n = second ? a.n2 : a.n;
  const uint8_t* w = second ? a.w2 : a.w;
  const float* ws = second ? a.ws2 : a.ws;
  const int64_t ws_ld = second ? a.ws_ld2 : a.ws_ld;
  float* y = second ? a.y2 : a.y;
  const int64_t ldy = second ? n : a.ldy;
  const int64_t row0 = tile0 + warp * 16;
  // Rows past N read row N - 1 (valid memory) and are not stored.
  const int64_t ra = min(row0 + (lane >> 2), n - 1);
  const int64_t rb = min(row0 + (lane >> 2) + 8, n - 1);
  const uint8_t* wa = w + (g * n + ra) * a.k;
  const uint8_t* wb = w + (g * n + rb) * a.k;
  const float* wsa = ws + ((g * n + ra) >> a.br_shift) * ws_ld;
  const float* wsb = ws + ((g * n + rb) >> a.br_shift) * ws_ld;
  const int64_t lane_k = static_cast<int64_t>(lane & 3) * (KS / 4);
  // Before the wait for the previous kernel (a programmatic dependent launch, pdl.cuh; no kernel
  // writes weights): the first 512 columns of the warp's rows into L2, one 128-byte line of each
  // of its two rows per lane. On an H100 the decode step was 1-2% faster with it than without,
  // and faster than loading the first chunk into registers here (run 1 of session 36).
  const int64_t line = k0 + 128 * (lane & 3);
  if (line < k1) {
    prefetch_l2(wa + line);
    prefetch_l2(wb + line);
  }
  enter_dependent_grid();

  __shared__ float row_inv[8 * NT];
  if (a.norm_w != nullptr) block_rows_rms_inv(row_inv, a.x, a.m, a.ldx, a.k, a.norm_eps);
  quantize_slab<NT>(a, s, g, k0, k1, row_inv);
  __syncthreads();

  float acc[NT][4] = {};
  // One chunk in registers at a time: issuing the next chunk's loads (or the first before the
  // quantization) raised the registers to 110-180 and measured slower on the large weights (fewer
  // CTAs per SM), for at most 1.6 us gained on the others (session 19).
  for (int64_t kk = k0; kk < k1; kk += kChunkCols) {
    WeightChunk<KS> c;
    load_chunk<KS>(c, wa, wb, wsa, wsb, kk, k1, lane_k, a.bc_shift);
    math_chunk<KS, NT>(a, s, c, kk, k0, k1, acc);
  }

  // Phase 3: the partial tile in shared memory ([token][row of the CTA]), then y.
  const int q = lane & 3;
  const int lr = warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int t0 = 2 * q + 8 * j;
    s.part[t0 * rows_cta + lr] = acc[j][0];
    s.part[(t0 + 1) * rows_cta + lr] = acc[j][1];
    s.part[t0 * rows_cta + lr + 8] = acc[j][2];
    s.part[(t0 + 1) * rows_cta + lr + 8] = acc[j][3];
  }
  const int entries = a.m * rows_cta;
  if (splits == 1) {
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < entries; e += static_cast<int>(blockDim.x)) {
      const int64_t row = tile0 + (e & (rows_cta - 1));
      if (row < n) y[(e >> rows_shift) * ldy + g * n + row] = s.part[e];
    }
    return;
  }
  // reduce_splits: CTA `split` of the cluster stores its share of the tile, adding the partials
  // of splits 0..S-1 in order (the same order whichever CTA adds them).
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int begin = split * entries / splits;
  const int end = (split + 1) * entries / splits;
  for (int e = begin + static_cast<int>(threadIdx.x); e < end; e += static_cast<int>(blockDim.x)) {
    float v = *cluster.map_shared_rank(s.part + e, 0);
    for (int r = 1; r < splits; ++r) v += *cluster.map_shared_rank(s.part + e, r);
    const int64_t row = tile0 + (e & (rows_cta - 1));
    if (row < n) y[(e >> rows_shift) * ldy + g * n + row] = v;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

int log2_of_power_of_two(int v) {
  int shift = 0;
  while ((1 << shift) < v) ++shift;
  return shift;
}

template <int KS, int NT>
void launch_variant(const Fp8GemvArgs& a, const Fp8GemvConfig& c, int64_t groups,
                    KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream) {
  const size_t smem = gemv_fp8_smem(NT, c.slab, a.ag, c.warps);
  smem_limits.allow(gemv_fp8_kernel<KS, NT>, smem);
  ClusterLaunch l = fp8_split_cluster(c, groups, smem, stream);
  l.pdl = pdl;
  launch_clustered("linear (fp8 gemv)", l, gemv_fp8_kernel<KS, NT>, a);
}

}  // namespace

void launch_gemv_fp8(const float* x, const uint8_t* w, const float* w_scales, int64_t scale_ld,
                     float* y, const Fp8Problem& p, const Fp8GemvConfig& c,
                     KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream,
                     const Fp8GemvSecond* second, const float* x_norm_weight, float x_norm_eps) {
  Fp8GemvArgs a;
  a.x = x;
  a.w = w;
  a.ws = w_scales;
  a.y = y;
  a.ldx = p.groups * p.k;
  a.ws_ld = scale_ld;
  a.n = p.n;
  a.w2 = nullptr;
  a.ws2 = nullptr;
  a.y2 = nullptr;
  a.ws_ld2 = a.n2 = 0;
  a.first_tiles = static_cast<int>(c.row_tiles);
  if (second != nullptr) {
    a.n = p.n - second->n;
    a.w2 = second->w;
    a.ws2 = second->scales;
    a.y2 = second->y;
    a.ws_ld2 = second->scale_ld;
    a.n2 = second->n;
    a.first_tiles = static_cast<int>(a.n / (16 * c.warps));
  }
  a.ldy = p.groups * a.n;
  a.k = p.k;
  a.slab = c.slab;
  a.m = static_cast<int>(p.m);
  a.ag = p.act_group;
  a.norm_w = x_norm_weight;
  a.norm_eps = x_norm_eps;
  a.br_shift = log2_of_power_of_two(p.block_rows);
  a.bc_shift = log2_of_power_of_two(p.block_cols);
  a.ag_shift = log2_of_power_of_two(p.act_group);
  const bool two = p.m > 8;
  if (c.kstep == 64) {
    two ? launch_variant<64, 2>(a, c, p.groups, smem_limits, pdl, stream)
        : launch_variant<64, 1>(a, c, p.groups, smem_limits, pdl, stream);
  } else {
    two ? launch_variant<32, 2>(a, c, p.groups, smem_limits, pdl, stream)
        : launch_variant<32, 1>(a, c, p.groups, smem_limits, pdl, stream);
  }
}

}  // namespace deepinfer::cuda
