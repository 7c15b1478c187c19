// The prefill shape of the quantized expert GEMMs on Hopper's FP8 tensor cores (wgmma
// m64nNk32 e4m3 x e4m3 -> f32, sm_90a only), for passes whose activations are quantized
// (act_group > 0 on both GEMMs): selected by the backend's DEEPINFER_MOE_QUANT_PREFILL=wgmma_fp8
// (moe_heuristics.h, quant_wgmma_fp8_fits). Same tile list (128-row tiles), outputs (SwiGLU
// into act, y in pair order) and activation quantization as experts_quant_wgmma.cu.
//
// Why. bf16 tensor cores peak at about half of FP8's (1,251 TFLOP/s measured on the H200); the
// bf16 wgmma prefill kernel reached ~240 TFLOP/s. With quantized activations both operands are
// e4m3 values times scales, so the products can be formed by FP8 tensor cores, as DeepSeek's
// own FP8 GEMMs do: every 128-input slice is multiplied into wgmma accumulators and promoted
// into f32 totals times (activation scale x weight scale) of the slice.
//
// Numerics (against the CPU reference, which multiplies dequantized f32 values):
// - Activations: the pass quantizes them exactly as the other kernels (launch_quantize_activations,
//   bit-identical to the CPU op); stage_fp8_kernel then writes each 128-input slice of a row as
//   e4m3 codes times one power-of-two scale, S = act_group_scale(max |slice|). With act_group a
//   multiple of 128 (FP8 experts: 128) this is exact (S is at most the group's scale, and an
//   e4m3 value times 2^k, k >= 0, stays e4m3 while at most 448). With smaller groups (MXFP4
//   experts: 32) a group whose scale is 2^-d of S loses the bits that fall below e4m3's
//   subnormal step: each such value moves by at most 2^-10 S (round to nearest), under 5e-6 of
//   the slice's largest |x| (above 224 S); values that stay e4m3 normals are exact.
// - FP8 weights: e4m3 bytes as shipped (exact), one f32 scale per 128 x block_cols block
//   (block_cols >= 128, else the pass keeps the other kernels), applied at promotion.
// - MXFP4 weights: an e2m1 value times its per-32 scale 2^(s_j - 127) is written as the e4m3 of
//   e2m1 x 2^(6 - d), d = s_max - s_j (s_max: the largest of the row's four scales in the slice),
//   times 2^(s_max - 133) applied at promotion. Exact for d <= 14: the smallest e2m1 step (0.5)
//   times 2^(6 - 14) is 2^-9, e4m3's smallest subnormal, every e2m1 value times 2^(6 - d) is a
//   multiple of 2^(5 - d) with at most two significant bits, and 6 x 2^6 = 384 <= 448. Beyond
//   (d >= 15) the values are rounded to nearest e4m3 (mx_table): |error| <= 2^-10 x 2^(s_max -
//   133) = 2^(s_max - 143) per weight, 2^-16 of the slice's largest scale (groups past d = 31
//   flush to 0, within the same bound).
// - Sums: the tensor cores add the 32 products of a k-step and the four k-steps of a slice into
//   f32 accumulators with limited alignment precision (DeepSeek-V3 reports ~14 bits kept on
//   Hopper's FP8 MMA), so each slice's sum carries a relative error of order 2^-14 of its
//   largest partial sums; slices are promoted into f32 totals (exact power-of-two scaling for
//   MXFP4 weights, one f32 rounding for FP8 block scales). Unlike the bf16 kernels this is not
//   exact up to summation order; the op table's act-quantized tolerance (5e-3 of max |y|) holds.
//
// Layouts. "Swap AB" as in the other kernels: A (64 weight rows x 32 k per wgmma) comes from
// registers, in the mma.sync m16n8k32 fragment of each warp: lane (g, q) holds 4 e4m3 of row g at
// k 4q .. 4q + 3 (a0), of row g + 8 (a1), and the same rows at k 16 + 4q .. (a2, a3). Which input
// of a slice feeds which k is free as long as the activations are staged in the same order
// (fp8_slice_input): a lane's weight bytes are its 16-byte chunks (FP8: inputs 64 l + 16 q .. of
// load l = 0, 1; MXFP4: inputs 32 q .. 32 q + 31, one scale group), used without any shuffle. B
// (32 k x N tokens) comes from shared memory, K-major without swizzle: core matrices of 8 tokens x
// 16 k (128 bytes) laid out [token / 8][k / 16], leading byte offset 128 (next 16 k), stride byte
// offset 8 x 128 (next 8 tokens); the staged rows hold each 16-k chunk of a step contiguously, so
// one cp.async per chunk.
//
// Weight rows: CTA blockIdx.x works on tile blockIdx.x % max_tiles and column block
// blockIdx.x / max_tiles of 128 weight rows; warpgroup wg (two per CTA) owns one m64 wgmma tile,
// warp w of it rows 16 w .. 16 w + 15. Gate/up: row g of a warp's m16 block is column n of w1
// and row g + 8 the same column of w3 (64 columns per CTA), so a lane holds both sums of its
// SwiGLU outputs; down: 128 rows of w2.
//
// Pipeline of a CTA: a ring of kStages slices in shared memory (MXFP4 8, FP8 6), each the
// tile's e4m3 activation rows and scales and every lane's own weight chunks, filled by cp.async
// kStages - 2 slices ahead (the first slices' weight copies go out before the barrier that
// publishes the tile's rows: they need no pair index). One __syncthreads per slice. A warpgroup
// multiplies slice s into one of two accumulator sets (four wgmma, the first one overwriting) while
// it promotes slice s - 1 from the other set, so its tensor-core work runs back to back while the
// other warpgroup's MMAs fill the gaps: per slice it waits for slice s - 1's MMAs, moves slice s's
// A fragments into registers (FP8: four 16-byte shared loads; MXFP4: two, and a prmt table lookup
// per four nibbles), issues slice s and promotes slice s - 1. The slot refilled at slice s held
// slice s - 2, whose MMAs every warpgroup waited for before the barrier of slice s.
//
// Resources (ptxas -v, sm_90a, nvcc 13.0): 255 registers per thread, no spills
// (__launch_bounds__(256, 1): one CTA of eight warps per SM; two accumulator sets of kN / 2 plus
// the f32 totals are 192 at n 128; the activation copy loop is kept rolled to stay there);
// dynamic shared memory 196 KB for MXFP4 (8 x 24.5 KB) and 195 KB for FP8 (6 x 32.5 KB), plus
// 1 KB of static row offsets and the 256-byte MXFP4 table.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/activation.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/sm80/experts_quant_tile.cuh"
#include "cuda/moe/sm90/experts_quant_wgmma_fp8.h"
#include "cuda/moe/sm90/experts_quant_wgmma_fp8_mma.cuh"
#include "cuda/quant/quant_launch.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

using quant_tile::QuantTraits;
using Tile = ExpertQuantWgmmaFp8;
using experts_wgmma_fp8::wgmma_e4m3;

// The input (within a 128-input slice) that k 16 h + 4 q + b of k-step s (0 .. 3) of the wgmma
// multiplies: byte b of lane q's A registers a[2 h] (row g) and a[2 h + 1] (row g + 8), i.e. of
// word 2 (s & 1) + h of the rows' FP8 chunk s / 2, or of nibble 4 h + b of word s of their MXFP4
// chunk.
template <QuantFormat F>
__host__ __device__ constexpr int fp8_slice_input(int s, int h, int q, int b) {
  if constexpr (F == QuantFormat::kMxfp4) {
    return 32 * q + 8 * s + 4 * h + b;
  } else {
    return 64 * (s >> 1) + 16 * q + 8 * (s & 1) + 4 * h + b;
  }
}

// Bytes of a staged matrix of `rows` rows: e4m3 [rows, Kp], then f32 scales [rows, Kp / 128].
int64_t staged_scales_offset(int64_t rows, int64_t Kp) {
  return rows * Kp;
}

// ---- staging: quantized activations -> e4m3 slices + one scale per slice
// --------------------------

// One warp per (row, slice): lane 4 c + q writes bytes 4 q .. 4 q + 3 of the row's 16-byte chunk
// c = 2 s + h (k-step s, k 16 h ..) in fp8_slice_input's order; inputs past K are 0. src holds
// quantized values (launch_quantize_activations); see the head comment for the exactness.
template <QuantFormat F>
__global__ void stage_fp8_kernel(const float* __restrict__ src, int64_t rows, int64_t K, int64_t Kp,
                                 uint8_t* __restrict__ dst, float* __restrict__ scales) {
  const int64_t slices = Kp / kQuantSliceK;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (item >= rows * slices) return;  // uniform over the warp
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = item / slices;
  const int64_t slice = item - row * slices;
  const int c = lane >> 2, q = lane & 3;
  const float* s = src + row * K + slice * kQuantSliceK;
  const int64_t left = K - slice * kQuantSliceK;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int k = fp8_slice_input<F>(c >> 1, c & 1, q, b);
    v[b] = k < left ? s[k] : 0.0f;
    amax = fmaxf(amax, fabsf(v[b]));
  }
  const float scale = act_group_scale(warp_max(amax));
  const float inv = 1.0f / scale;  // exact: a normal power of two
  uint32_t packed = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t code = __nv_cvt_float_to_fp8(v[b] * inv, __NV_SATFINITE, __NV_E4M3);
    packed |= code << (8 * b);
  }
  reinterpret_cast<uint32_t*>(dst + row * Kp + slice * kQuantSliceK)[lane] = packed;
  if (lane == 0) scales[row * slices + slice] = scale;
}

// ---- MXFP4 -> e4m3 in registers
// ----------------------------------------------------------------------

// Entry d (0 .. 31): the e4m3 codes of e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} times
// 2^(6 - d), codes 0..3 in x and 4..7 in y (prmt's byte order), rounded to nearest.
__device__ __forceinline__ uint2 mx_table_entry(int d) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    const uint32_t code = __nv_cvt_float_to_fp8(ldexpf(kMag[m], 6 - d), __NV_SATFINITE, __NV_E4M3);
    w[m >> 2] |= code << (8 * (m & 3));
  }
  return make_uint2(w[0], w[1]);
}

// The e4m3 codes of the four e2m1 nibbles in the low 16 bits of `x` (nibble b -> byte b):
// magnitude by table, sign bit 3 of the nibble to bit 7 of the byte.
__device__ __forceinline__ uint32_t mx_to_e4m3x4(uint32_t x, uint2 table) {
  const uint32_t mag = __byte_perm(table.x, table.y, x & 0x7777u);
  const uint32_t sign = __byte_perm(0u, 0x80808080u, (x >> 1) & 0x4444u);
  return mag | sign;
}

// ---- the GEMM
// ------------------------------------------------------------------------------------

// A lane's per-slice weight scales: raw as loaded (MXFP4 the e8m0 byte of its own group, FP8
// the f32 bits), then resolved for the slice (promotion factor, MXFP4 table entry).
struct RawScales {
  uint32_t v[2];  // rows g, g + 8
};
struct SliceScales {
  float w[2];      // weight factor of rows g, g + 8
  uint2 table[2];  // MXFP4: the rows' e2m1 -> e4m3 table entries
};

// One CTA's tile of one GEMM on wgmma n kN (see the head comment). Lives in registers.
template <QuantFormat F, bool kGateUp, int kN>
struct TileGemm {
  using Tr = QuantTraits<F>;
  static constexpr int kLoads = Tr::kLoads;
  static constexpr int kStages = Tile::stages(kLoads);
  static constexpr int kAhead = kStages - 2;  // slices in flight
  static constexpr size_t kStageBytes = Tile::stage_bytes(kLoads);
  static constexpr int kAcc = kN / 2;  // f32 accumulators per thread
  static_assert(kAhead >= 1, "a ring of at least three slices");

  uint8_t* smem;
  const uint8_t* act;        // staged e4m3 rows
  const float* act_scales;   // staged scales [rows, slices]
  const int64_t* row_src;    // shared: staged row of each tile row
  const uint2* mx_table;     // shared: mx_table_entry(0 .. 31)
  const uint8_t* values[2];  // the lane's weight rows g, g + 8
  const void* wscales[2];    // their scales (MXFP4: e8m0 row; FP8: row of blocks)
  int rows;
  int64_t K, Kp;
  int slices;
  int block_cols_log2;
  int tid, q;

  __device__ __forceinline__ uint8_t* slot(int s) const {
    return smem + (s % kStages) * kStageBytes;
  }

  // cp.async of slice `s`: the tile's activation rows (16-byte chunk c of row r to core matrix
  // [r / 8][c], 8 lanes per 128 contiguous shared bytes) and their scales (issue_acts), the lane's
  // weight chunks (issue_weights; zeros past K: an e4m3 NaN code times a zero activation would
  // not vanish).
  __device__ __forceinline__ void issue_acts(int s) const {
    uint8_t* dst = slot(s);
    constexpr int kChunks = Tile::kTok * (kQuantSliceK / 16);
    static_assert(kChunks % Tile::kThreads == 0);
#pragma unroll 1
    for (int i = 0; i < kChunks / Tile::kThreads; ++i) {
      const int idx = tid + i * Tile::kThreads;
      const int r8 = idx & 7, c = (idx >> 3) & 7, group = idx >> 6;
      const int r = 8 * group + r8;
      if (r < rows) {
        cp_async_16(dst + (group * 8 + c) * 128 + r8 * 16,
                    act + row_src[r] * Kp + static_cast<int64_t>(s) * kQuantSliceK + c * 16);
      }
    }
    if (tid < rows) {
      cp_async_4(dst + Tile::kActStageBytes + 4 * tid, act_scales + row_src[tid] * slices + s);
    }
  }
  __device__ __forceinline__ void issue_weights(int s) const {
    uint8_t* w = slot(s) + Tile::kActStageBytes + Tile::kActScaleBytes;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const int64_t k0 = static_cast<int64_t>(s) * kQuantSliceK + l * 64 + q * Tr::kChunk;
        uint8_t* d = w + ((hr * kLoads + l) * Tile::kThreads + tid) * 16;
        if (k0 < K) {
          cp_async_16(d, values[hr] + (Tr::kMx ? k0 / 2 : k0));
        } else {
          *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
  __device__ __forceinline__ void issue(int s) const {
    issue_acts(s);
    issue_weights(s);
  }

  // The lane's raw scales of slice `s` (MXFP4: its own group's byte, 0 past K so that it never
  // raises the row's largest; FP8: the block's f32).
  __device__ __forceinline__ RawScales fetch_scales(int s) const {
    RawScales r;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t k0 = static_cast<int64_t>(s) * kQuantSliceK + q * 32;
      if constexpr (Tr::kMx) {
        r.v[hr] = k0 < K ? __ldg(static_cast<const uint8_t*>(wscales[hr]) + k0 / 32) : 0u;
      } else {
        const int64_t block = (static_cast<int64_t>(s) * kQuantSliceK) >> block_cols_log2;
        r.v[hr] = s < slices
                      ? __float_as_uint(__ldg(static_cast<const float*>(wscales[hr]) + block))
                      : 0u;
      }
    }
    return r;
  }

  // The slice's factors: MXFP4 the row's largest scale s_max over its four lanes (the warp's
  // lanes q = 0 .. 3 of row g), 2^(s_max - 133) and the table entry of d = s_max - s_j.
  __device__ __forceinline__ SliceScales resolve(const RawScales& r) const {
    SliceScales sc;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      if constexpr (Tr::kMx) {
        uint32_t smax = r.v[hr];
        smax = max(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
        smax = max(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
        const uint32_t d = smax - r.v[hr];
        sc.table[hr] = mx_table[d < 31u ? d : 31u];
        sc.w[hr] = e8m0_to_float(static_cast<uint8_t>(smax)) * 0x1p-6f;
      } else {
        sc.table[hr] = make_uint2(0u, 0u);
        sc.w[hr] = __uint_as_float(r.v[hr]);
      }
    }
    return sc;
  }

  // The A fragments of the slice's four k-steps from the lane's chunks in `dst`.
  __device__ __forceinline__ void load_a(const uint8_t* dst, const SliceScales& sc,
                                         uint32_t (&a)[4][4]) const {
    const uint8_t* w = dst + Tile::kActStageBytes + Tile::kActScaleBytes;
    uint4 chunk[2][kLoads];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        chunk[hr][l] =
            *reinterpret_cast<const uint4*>(w + ((hr * kLoads + l) * Tile::kThreads + tid) * 16);
      }
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if constexpr (Tr::kMx) {
          const uint32_t x = quant_tile::word_of(chunk[hr][0], s);
          a[s][hr] = mx_to_e4m3x4(x, sc.table[hr]);
          a[s][2 + hr] = mx_to_e4m3x4(x >> 16, sc.table[hr]);
        } else {
          const uint4& c = chunk[hr][s >> 1];
          a[s][hr] = quant_tile::word_of(c, 2 * (s & 1));
          a[s][2 + hr] = quant_tile::word_of(c, 2 * (s & 1) + 1);
        }
      }
    }
  }

  // acc = the slice's four k-steps (the first overwrites).
  __device__ __forceinline__ void multiply(float (&acc)[kAcc], const uint8_t* dst,
                                           const uint32_t (&a)[4][4]) const {
    const uint64_t desc = wgmma_desc(dst, 128, 8 * 128);
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      // k-step s: core matrices 2 s, 2 s + 1 along k (128 bytes each).
      wgmma_e4m3<kN>(acc, a[s], desc + ((2 * s * 128) >> 4), s > 0);
    }
    wgmma_commit();
  }

  // total += acc x (weight factor of the row x activation scale of the token) of slice `s`.
  __device__ __forceinline__ void promote(float (&total)[kAcc], float (&acc)[kAcc], int s,
                                          const float (&w)[2]) const {
    fence_accumulators(acc);
    const float* as = reinterpret_cast<const float*>(slot(s) + Tile::kActStageBytes);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const float2 x = *reinterpret_cast<const float2*>(as + 8 * j + 2 * q);
      total[4 * j + 0] += acc[4 * j + 0] * (w[0] * x.x);
      total[4 * j + 1] += acc[4 * j + 1] * (w[0] * x.y);
      total[4 * j + 2] += acc[4 * j + 2] * (w[1] * x.x);
      total[4 * j + 3] += acc[4 * j + 3] * (w[1] * x.y);
    }
  }

  // One slice: kBuf is s % 2 (the accumulator set it multiplies into).
  template <int kBuf>
  __device__ __forceinline__ void step(int s, float (&total)[kAcc], float (&acc)[2][kAcc],
                                       RawScales& raw, float (&prev)[2]) const {
    cp_async_wait<kAhead - 1>();
    fence_async_shared();  // this thread's copies of slice s visible to wgmma
    // Slice s landed for every thread; slot s - 2, refilled below, is free (head comment).
    __syncthreads();
    if (s + kAhead < slices) issue(s + kAhead);
    cp_async_commit();
    const SliceScales cur = resolve(raw);
    raw = fetch_scales(s + 1);  // in flight during the slice
    uint32_t a[4][4];
    wgmma_wait<0>();  // slice s - 1's MMAs: its accumulators are final, its A registers free
    fence_accumulators(acc[kBuf ^ 1]);
    load_a(slot(s), cur, a);
    multiply(acc[kBuf], slot(s), a);
    if (s > 0) promote(total, acc[kBuf ^ 1], s - 1, prev);
    prev[0] = cur.w[0];
    prev[1] = cur.w[1];
  }

  __device__ __forceinline__ void run(float (&total)[kAcc]) const {
    float acc[2][kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[0][i] = acc[1][i] = total[i] = 0.0f;
    // The first slices' weights and scales before the barrier that publishes the tile's rows
    // (their loads do not wait for the tile's pair indices), in one group ahead of the
    // activations' groups: waiting for slice s's activations waits for it too.
    for (int st = 0; st < kAhead && st < slices; ++st) issue_weights(st);
    cp_async_commit();
    RawScales raw = fetch_scales(0);
    __syncthreads();  // row_src and mx_table written
#pragma unroll
    for (int st = 0; st < kAhead; ++st) {
      if (st < slices) issue_acts(st);
      cp_async_commit();
    }
    float prev[2] = {0.0f, 0.0f};  // slice s - 1's weight factors
#pragma unroll 1
    for (int s = 0; s < slices; s += 2) {
      step<0>(s, total, acc, raw, prev);
      if (s + 1 < slices) step<1>(s + 1, total, acc, raw, prev);
    }
    wgmma_wait<0>();
    if ((slices & 1) != 0) {
      promote(total, acc[0], slices - 1, prev);
    } else {
      promote(total, acc[1], slices - 1, prev);
    }
    cp_async_wait_all();  // nothing left in flight at exit (the last commits are empty)
  }
};

// kGateUp: act[row, n] = swiglu(x[token] . w1_e[n], x[token] . w3_e[n]) for the tile's rows and
// 64 columns n (a = staged x [tokens], K = H, N = I). Otherwise y[pair, n] = act[row] . w2_e[n]
// for 128 rows n (a = staged act [pairs], K = I, N = H).
template <QuantFormat F, bool kGateUp>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    expert_quant_wgmma_fp8_kernel(const uint8_t* __restrict__ a, const float* __restrict__ a_scales,
                                  int64_t K, int64_t N, int top_k,
                                  const int32_t* __restrict__ sorted_pair, TileList tiles,
                                  int max_tiles, QuantMatrices lo, QuantMatrices hi, int block_rows,
                                  int block_cols_log2, float limit, float* __restrict__ out) {
  extern __shared__ __align__(128) uint8_t wgmma_fp8_smem_raw[];
  __shared__ int64_t row_src[Tile::kTok];
  __shared__ uint2 mx_table[32];

  const int tile = static_cast<int>(blockIdx.x % static_cast<unsigned>(max_tiles));
  const int col = static_cast<int>(blockIdx.x / static_cast<unsigned>(max_tiles));
  if (tile >= *tiles.count) return;  // uniform over the CTA: before any barrier
  const int e = tiles.expert[tile];
  const int start = tiles.start[tile];
  const int rows = tiles.rows[tile];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int q = lane & 3;
  const int wg = warp >> 2;
  const int wq = warp & 3;

  if (tid < Tile::kTok) {
    int64_t src = 0;
    if (tid < rows) src = kGateUp ? sorted_pair[start + tid] / top_k : start + tid;
    row_src[tid] = src;
  }
  if (QuantTraits<F>::kMx && tid < 32) mx_table[tid] = mx_table_entry(tid);
  // Published by the barrier in TileGemm::run, after the first weight copies are issued.

  // The lane's weight rows: gate/up column n of w1 (row g) and w3 (row g + 8); down rows n, n + 8
  // of w2. Clamped to N - 1 for the loads (tail rows are never stored).
  int64_t n_out[2];
  if constexpr (kGateUp) {
    n_out[0] = n_out[1] =
        static_cast<int64_t>(col) * (Tile::kWeightRows / 2) + wg * 32 + wq * 8 + g;
  } else {
    n_out[0] = static_cast<int64_t>(col) * Tile::kWeightRows + wg * 64 + wq * 16 + g;
    n_out[1] = n_out[0] + 8;
  }
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int64_t row_bytes = QuantTraits<F>::kMx ? K / 2 : K;
  const int64_t kblocks = QuantTraits<F>::kMx ? K / 32 : ((K - 1) >> block_cols_log2) + 1;

  auto run = [&](auto n_tag) {
    constexpr int kN = decltype(n_tag)::value;
    TileGemm<F, kGateUp, kN> t;
    t.smem = wgmma_fp8_smem_raw;
    t.act = a;
    t.act_scales = a_scales;
    t.row_src = row_src;
    t.mx_table = mx_table;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const QuantMatrices& m = (kGateUp && hr == 1) ? hi : lo;
      const int64_t n = n_out[hr] < N ? n_out[hr] : N - 1;
      t.values[hr] = m.values[e] + n * row_bytes;
      if constexpr (QuantTraits<F>::kMx) {
        t.wscales[hr] = static_cast<const uint8_t*>(m.scales[e]) + n * kblocks;
      } else {
        t.wscales[hr] = static_cast<const float*>(m.scales[e]) + (n / block_rows) * kblocks;
      }
    }
    t.rows = rows;
    t.K = K;
    t.Kp = Kp;
    t.slices = static_cast<int>(Kp / kQuantSliceK);
    t.block_cols_log2 = block_cols_log2;
    t.tid = tid;
    t.q = q;
    float total[kN / 2];
    t.run(total);
    // The epilogue from the accumulator layout: total[4 j + 2 hr + c] is row g + 8 hr, token
    // 8 j + 2 q + c.
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = 8 * j + 2 * q + c;
        if (r >= rows) continue;
        if constexpr (kGateUp) {
          if (n_out[0] < N) {
            out[static_cast<int64_t>(start + r) * N + n_out[0]] =
                swiglu(total[4 * j + c], total[4 * j + 2 + c], limit);
          }
        } else {
          const int64_t pair = sorted_pair[start + r];
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            if (n_out[hr] < N) out[pair * N + n_out[hr]] = total[4 * j + 2 * hr + c];
          }
        }
      }
    }
  };
  // The smallest wgmma n of 32, 64, 96, 128 that covers the tile's rows (uniform over the CTA).
  if (rows <= 32) {
    run(std::integral_constant<int, 32>{});
  } else if (rows <= 64) {
    run(std::integral_constant<int, 64>{});
  } else if (rows <= 96) {
    run(std::integral_constant<int, 96>{});
  } else {
    run(std::integral_constant<int, 128>{});
  }
}

// Activation quantization (bit-identical to the CPU op) into `qbuf` (may be `src`), then the
// e4m3 slices into `staged`.
template <QuantFormat F>
void quantize_and_stage_fp8(const float* src, float* qbuf, int64_t rows, int64_t K, int group,
                            uint8_t* staged, cudaStream_t stream) {
  if (rows == 0) return;
  launch_quantize_activations(src, qbuf, rows, K, group, stream);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int64_t warps = rows * (Kp / kQuantSliceK);
  constexpr int kWarpsPerBlock = 8;
  stage_fp8_kernel<F><<<ceil_div(warps, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      qbuf, rows, K, Kp, staged, reinterpret_cast<float*>(staged + staged_scales_offset(rows, Kp)));
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template <QuantFormat F, bool kGateUp>
void launch_gemm(const QuantExpertsArgs& p, int64_t rows, const uint8_t* staged, float* out,
                 KernelSmemLimits& smem_limits, cudaStream_t stream) {
  const int64_t K = kGateUp ? p.hidden : p.inter;
  const int64_t N = kGateUp ? p.inter : p.hidden;
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int64_t block_cols = Tile::kWeightRows / (kGateUp ? 2 : 1);
  const int64_t cols = (N + block_cols - 1) / block_cols;
  const size_t smem = Tile::smem_bytes(QuantTraits<F>::kLoads);
  auto kernel = expert_quant_wgmma_fp8_kernel<F, kGateUp>;
  if (p.max_tiles * cols == 0) return;
  smem_limits.allow(kernel, smem);
  // Grid size: checked against gridDim.x's limit by the caller.
  kernel<<<static_cast<unsigned>(p.max_tiles * cols), Tile::kThreads, smem, stream>>>(
      staged, reinterpret_cast<const float*>(staged + staged_scales_offset(rows, Kp)), K, N,
      p.top_k, p.sorted_pair, p.tiles, static_cast<int>(p.max_tiles), kGateUp ? p.w1 : p.w2,
      kGateUp ? p.w3 : p.w2, p.block_rows, p.block_cols_log2, p.limit, out);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template <QuantFormat F>
void run_pass(const QuantExpertsArgs& p, const float* x, int64_t tokens, float* xq, uint8_t* xs,
              float* act, uint8_t* as, float* y, KernelSmemLimits& smem_limits,
              cudaStream_t stream) {
  const int64_t pairs = tokens * p.top_k;
  quantize_and_stage_fp8<F>(x, xq, tokens, p.hidden, p.in_group, xs, stream);
  launch_gemm<F, true>(p, tokens, xs, act, smem_limits, stream);
  quantize_and_stage_fp8<F>(act, act, pairs, p.inter, p.down_group, as, stream);
  launch_gemm<F, false>(p, pairs, as, y, smem_limits, stream);
}

}  // namespace

void launch_experts_quant_wgmma_fp8(const QuantExpertsArgs& p, const float* x, int64_t tokens,
                                    float* xq, void* xs, float* act, void* as, float* y,
                                    KernelSmemLimits& smem_limits, cudaStream_t stream) {
  if (p.in_group <= 0 || p.down_group <= 0) {
    throw Error(ErrorCode::kInternal,
                "moe_experts: the FP8 wgmma prefill kernel needs quantized activations");
  }
  auto* xs8 = static_cast<uint8_t*>(xs);
  auto* as8 = static_cast<uint8_t*>(as);
  if (p.format == QuantFormat::kMxfp4) {
    run_pass<QuantFormat::kMxfp4>(p, x, tokens, xq, xs8, act, as8, y, smem_limits, stream);
  } else {
    run_pass<QuantFormat::kFp8>(p, x, tokens, xq, xs8, act, as8, y, smem_limits, stream);
  }
}

}  // namespace deepinfer::cuda
