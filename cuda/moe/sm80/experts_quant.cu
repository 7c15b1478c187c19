// The expert GEMMs on weights kept in their shipped bytes: MXFP4 (e2m1 pairs + one e8m0 scale
// per 32 inputs) and block-scaled FP8 (e4m3 + f32 block scales). One kernel for the decode shape
// (16-row tiles) and the prefill shape (64-row tiles), on tensor cores: mma.sync m16n8k16
// bf16 x bf16 -> f32, sm_80+ instructions built for sm_90a and sm_100a.
//
// Why bf16 tensor cores reproduce the CPU reference (which multiplies dequantized f32 weights
// with f32 activations): e2m1 and e4m3 values times power-of-two scales are exact in bf16, and so
// are activations after DeepSeek's activation quantization (e4m3 values times a power-of-two
// group scale). Each product is then exact and sums are f32: the result differs from the CPU
// only by summation order. Without activation quantization (act_group 0) the f32 activations are
// split into three bf16 planes (hi + mid + lo == x exactly) and multiplied as three products, so
// the same holds. FP8 block scales that are not powers of two (not DeepSeek V4's, whose scales
// are ue8m0) are rounded to bf16 when folded into the weights.
//
// The layout is "swap AB": the weights are the A operand (M = weight rows), the tile's token
// rows the B operand (N = tokens), so even one token uses the tensor cores with 16 weight rows
// per mma, and the weights go from global memory straight into registers. A warp owns kMTiles
// m16 tiles of weight rows; lane (g, q) (g = lane / 4, q = lane % 4) loads 16 bytes of rows g and
// g + 8 of each: MXFP4 32 inputs (one scale group), FP8 16 inputs (two loads per 128-input
// slice). The 4 lanes of a row read 64 contiguous bytes. The bytes are decoded in registers to
// bf16 pairs (bit moves into a bf16's exponent and mantissa, then one bf16x2 multiply by
// 2^bias * scale, exact), and an m16n8k16 step uses 4 inputs of each lane's chunk: which input of
// the chunk feeds which k of the mma is free, as long as the activations use the same order. The
// activations are therefore staged (stage_activations_kernel, once per pass) as bf16 in that
// order, 128 inputs per slice, and a CTA copies one slice of its tile's rows into shared memory
// per step (cp.async, double-buffered) while its lanes hold the next slice's weight bytes in
// flight (register prefetch).
//
// Phases of a GEMM CTA: tile_rows (the tile's activation rows), load_weights (16-byte loads of a
// slice's weight bytes and scales), stage_slice (cp.async of a slice of activations), and per
// slice multiply_slice (decode + mma), then store_tile (SwiGLU into act, or y in pair order).
// Every output element is reduced over K in slice order with a fixed order inside a slice: it
// depends on its own weight row and token row only (deterministic).
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/activation.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

// Per-format constants: k per 16-byte load and loads per 128-input slice.
template <QuantFormat F>
struct QuantTraits {
  static constexpr bool kMx = F == QuantFormat::kMxfp4;
  static constexpr int kChunk = kMx ? 32 : 16;                // inputs per 16-byte load
  static constexpr int kLoads = kQuantSliceK / (4 * kChunk);  // loads per row per slice
  static constexpr int kStepsPerLoad = kChunk / 4;            // m16n8k16 steps per load
};

// The input (within a 128-input slice) that lane q feeds to k slot pair `w` (0: k 2q, 2q + 1;
// 1: k 2q + 8, 2q + 9) of mma step s, half h of the bf16 pair. It is where the decode puts it:
// MXFP4 decoded pair f = 4j + p of 32-bit word j holds nibbles p and p + 4 (inputs 8j + p,
// 8j + p + 4 of the lane's 32), FP8 pair f = 2j + p holds bytes p and p + 2 (inputs 4j + p,
// 4j + p + 2 of the lane's 16); step s uses pairs 2s and 2s + 1 of its load.
template <QuantFormat F>
__host__ __device__ constexpr int slice_input(int q, int s, int w, int h) {
  if constexpr (F == QuantFormat::kMxfp4) {
    const int f = 2 * s + w;
    return 32 * q + 8 * (f >> 2) + (f & 3) + 4 * h;
  } else {
    const int f = 2 * (s & 3) + w;
    return 64 * (s >> 2) + 16 * q + 4 * (f >> 1) + (f & 1) + 2 * h;
  }
}

// Word offset in a staged slice row of lane q's 16-byte piece t (steps 2t, 2t + 1). Rotating the
// pieces of lanes 2, 3 by one puts the 8 lanes of a 16-byte shared-memory phase (two token rows
// 8 banks apart, lanes q = 0..3 each) on 8 distinct bank quads.
__device__ __forceinline__ int piece_word(int q, int t) {
  return 16 * q + 4 * ((t + (q >> 1)) & 3);
}

// ---- staging: activations -> bf16 planes in mma order
// ---------------------------------------------

// dst [rows, kPlanes, Kp] (Kp = K rounded up to 128): 8 consecutive elements of a plane row are
// the inputs slice_input lists for lane q's piece t (the 16 pieces of a slice in order 4q + t);
// inputs past K are 0. kPlanes == 3: hi + mid + lo == x (exact for normal f32).
template <QuantFormat F, int kPlanes>
__global__ void stage_activations_kernel(const float* __restrict__ src, int64_t rows, int64_t K,
                                         int64_t Kp, __nv_bfloat16* __restrict__ dst) {
  const int64_t pieces = Kp / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * pieces) return;
  const int64_t row = idx / pieces;
  const int64_t pc = idx - row * pieces;
  const int64_t k0 = (pc / 16) * kQuantSliceK;
  const int pp = static_cast<int>(pc % 16);
  const int q = pp >> 2, t = pp & 3;
  const float* s = src + row * K;
  uint32_t out[kPlanes][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t k = k0 + slice_input<F>(q, 2 * t + (i >> 1), i & 1, h);
      v[h] = k < K ? s[k] : 0.0f;
    }
#pragma unroll
    for (int pl = 0; pl < kPlanes; ++pl) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[0], v[1]);
      memcpy(&out[pl][i], &b, sizeof(uint32_t));
      v[0] -= __low2float(b);  // exact: the rest of v beyond its bf16 rounding
      v[1] -= __high2float(b);
    }
  }
  __nv_bfloat16* d = dst + row * kPlanes * Kp + pc * 8;
#pragma unroll
  for (int pl = 0; pl < kPlanes; ++pl) {
    *reinterpret_cast<uint4*>(d + pl * Kp) =
        make_uint4(out[pl][0], out[pl][1], out[pl][2], out[pl][3]);
  }
}

// ---- weights: loads and in-register decode
// ---------------------------------------------------------

// 16 bytes of weights, read once: not allocated in L1 (which keeps the scales).
__device__ __forceinline__ uint4 load_weights16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x, y;
  memcpy(&x, &a, sizeof(a));
  memcpy(&y, &b, sizeof(b));
  const __nv_bfloat162 r = __hmul2(x, y);
  uint32_t out;
  memcpy(&out, &r, sizeof(out));
  return out;
}

// The two multipliers of a load's decoded pairs, bf16 in both halves: the format's bias (the
// decode leaves e2m1 values 2^-126 and e4m3 values 2^-120 too small) times the scale, in one
// factor when that is a bf16 normal, else the bias first and the scale second (`two`).
struct Multiplier {
  uint32_t first;
  uint32_t second;
  bool two;
};

__device__ __forceinline__ uint32_t bf16_pair(uint32_t bits) {
  return bits | (bits << 16);
}

// MXFP4: 2^126 * 2^(e - 127) = 2^(e - 1), a normal bf16 (exponent field e + 126) for e <= 128.
__device__ __forceinline__ Multiplier mx_multiplier(uint32_t e) {
  if (e <= 128u) return {bf16_pair((e + 126u) << 7), 0u, false};
  return {bf16_pair(253u << 7), bf16_pair(e << 7), true};
}

// FP8: 2^120 * scale.
__device__ __forceinline__ Multiplier fp8_multiplier(float scale) {
  const float c = scale * 0x1p120f;
  if (fabsf(c) < 0x1p127f) {
    return {bf16_pair(__bfloat16_as_ushort(__float2bfloat16_rn(c))), 0u, false};
  }
  return {bf16_pair(247u << 7), bf16_pair(__bfloat16_as_ushort(__float2bfloat16_rn(scale))), true};
}

// Decoded pair f of a load (see slice_input), before the multiplier: the magnitude bits moved to
// the bottom of a bf16's exponent and top of its mantissa, the sign to bit 15 (Marlin's trick).
// e2m1 code (e, m) becomes the bf16 2^(e - 127) (1 + m / 2) (e > 0) or m 2^-127 (e == 0, a
// subnormal): 2^-126 times its value. e4m3 likewise becomes 2^-120 times its value.
template <QuantFormat F>
__device__ __forceinline__ uint32_t decode_pair(const uint4& raw, int f) {
  if constexpr (F == QuantFormat::kMxfp4) {
    const uint32_t r = word_of(raw, f >> 2);
    const int p = f & 3;
    // Nibble p + 4i to bits 6..8 (+ 16i), its sign bit 4p + 3 (+ 16i) to bit 15 (+ 16i).
    uint32_t sign, mag;
    if (p == 3) {
      sign = r;
      mag = r >> 6;
    } else if (p == 2) {
      sign = r << 4;
      mag = r >> 2;
    } else if (p == 1) {
      sign = r << 8;
      mag = r << 2;
    } else {
      sign = r << 12;
      mag = r << 6;
    }
    return (sign & 0x80008000u) | (mag & 0x01C001C0u);
  } else {
    const uint32_t r = word_of(raw, f >> 1);
    if ((f & 1) != 0) return (r & 0x80008000u) | ((r >> 4) & 0x07F007F0u);
    return ((r << 8) & 0x80008000u) | ((r << 4) & 0x07F007F0u);
  }
}

template <QuantFormat F>
__device__ __forceinline__ uint32_t decode_scaled(const uint4& raw, int f, const Multiplier& m) {
  uint32_t v = mul_bf16x2(decode_pair<F>(raw, f), m.first);
  if (m.two) v = mul_bf16x2(v, m.second);
  return v;
}

// Where a lane's weight rows live: rows g and g + 8 (hr = 0, 1) of each of its m16 tiles.
template <int kMTiles>
struct WeightRows {
  const uint8_t* values[kMTiles][2];  // the row's bytes
  const void* scales[kMTiles][2];     // MXFP4: the row's e8m0 bytes; FP8: its row of blocks
};

// A lane's weight bytes and scales of one slice.
template <QuantFormat F, int kMTiles>
struct SliceWeights {
  static constexpr int kLoads = QuantTraits<F>::kLoads;
  uint4 raw[kMTiles][2][kLoads];
  uint32_t scale[kMTiles][2][kLoads];  // MXFP4: the e8m0 byte; FP8: the f32 bits
};

// The lane's loads of slice `slice`; chunks at or past K (wholly, K being a multiple of the
// chunk) are zero and never read.
template <QuantFormat F, int kMTiles>
__device__ __forceinline__ void load_weights(SliceWeights<F, kMTiles>& w,
                                             const WeightRows<kMTiles>& rows, int slice, int q,
                                             int64_t K, int block_cols_log2) {
  using Tr = QuantTraits<F>;
#pragma unroll
  for (int l = 0; l < Tr::kLoads; ++l) {
    const int64_t k0 =
        static_cast<int64_t>(slice) * kQuantSliceK + l * 4 * Tr::kChunk + q * Tr::kChunk;
    const bool in = k0 < K;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        if (in) {
          if constexpr (Tr::kMx) {
            w.raw[mt][hr][l] = load_weights16(rows.values[mt][hr] + k0 / 2);
            w.scale[mt][hr][l] = __ldg(static_cast<const uint8_t*>(rows.scales[mt][hr]) + k0 / 32);
          } else {
            w.raw[mt][hr][l] = load_weights16(rows.values[mt][hr] + k0);
            w.scale[mt][hr][l] = __float_as_uint(
                __ldg(static_cast<const float*>(rows.scales[mt][hr]) + (k0 >> block_cols_log2)));
          }
        } else {
          w.raw[mt][hr][l] = make_uint4(0, 0, 0, 0);
          w.scale[mt][hr][l] = Tr::kMx ? 127u : __float_as_uint(1.0f);
        }
      }
    }
  }
}

// ---- activations: shared-memory slices
// --------------------------------------------------------------

// Copies slice `slice` of the tile's staged rows (row_src: element offset of a row's planes, -1
// past the tile's pairs) into `buf` [kPlanes][kTok][kQuantRowWords] words, rows below `staged`
// only (the rest is never read); pieces rotated as piece_word says.
template <class C, int kPlanes>
__device__ __forceinline__ void stage_slice(uint32_t* buf, const __nv_bfloat16* a,
                                            const int64_t* row_src, int staged, int slice,
                                            int64_t Kp) {
  constexpr int kPieces = kPlanes * C::kTok * 16;
  for (int idx = static_cast<int>(threadIdx.x); idx < kPieces; idx += C::kThreads) {
    const int pp = idx & 15;
    const int rest = idx >> 4;
    const int r = rest % C::kTok;
    const int pl = rest / C::kTok;
    if (r >= staged) continue;
    uint32_t* d = buf + (pl * C::kTok + r) * kQuantRowWords + piece_word(pp >> 2, pp & 3);
    const int64_t src = row_src[r];
    if (src >= 0) {
      cp_async_16(d, a + src + pl * Kp + static_cast<int64_t>(slice) * kQuantSliceK + pp * 8);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// acc += the lane's weight rows x the staged token rows over one slice: per 16-byte piece t of
// activations (steps 2t, 2t + 1), decode the A fragments of both steps, then for each 8-token
// group of the tile (n8 of them) and plane, one shared load and 2 kMTiles mma.
template <QuantFormat F, class C, int kPlanes>
__device__ __forceinline__ void multiply_slice(float (&acc)[C::kMTiles][C::kTok / 8][4],
                                               const SliceWeights<F, C::kMTiles>& w,
                                               const uint32_t* buf, int n8, int g, int q) {
  using Tr = QuantTraits<F>;
  constexpr int kM = C::kMTiles;
  Multiplier mul[kM][2][Tr::kLoads];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
      for (int l = 0; l < Tr::kLoads; ++l) {
        mul[mt][hr][l] = Tr::kMx ? mx_multiplier(w.scale[mt][hr][l])
                                 : fp8_multiplier(__uint_as_float(w.scale[mt][hr][l]));
      }
    }
  }
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    uint32_t af[2][kM][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int s = 2 * t + u;
      const int l = s / Tr::kStepsPerLoad;
      const int sl = s % Tr::kStepsPerLoad;
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        // a0a1: row g, k 2q..; a2a3: row g + 8; a4a5, a6a7: the same rows at k 2q + 8.
        af[u][mt][0] = decode_scaled<F>(w.raw[mt][0][l], 2 * sl, mul[mt][0][l]);
        af[u][mt][1] = decode_scaled<F>(w.raw[mt][1][l], 2 * sl, mul[mt][1][l]);
        af[u][mt][2] = decode_scaled<F>(w.raw[mt][0][l], 2 * sl + 1, mul[mt][0][l]);
        af[u][mt][3] = decode_scaled<F>(w.raw[mt][1][l], 2 * sl + 1, mul[mt][1][l]);
      }
    }
    const int word = piece_word(q, t);
#pragma unroll
    for (int j = 0; j < C::kTok / 8; ++j) {
      if (j >= n8) break;
#pragma unroll
      for (int pl = 0; pl < kPlanes; ++pl) {
        const uint4 b = *reinterpret_cast<const uint4*>(
            buf + (pl * C::kTok + 8 * j + g) * kQuantRowWords + word);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          mma_bf16(acc[mt][j], af[0][mt], b.x, b.y);
          mma_bf16(acc[mt][j], af[1][mt], b.z, b.w);
        }
      }
    }
  }
}

// The epilogue from the accumulator layout (c0, c1: weight row g, tokens 2q, 2q + 1 of the n8
// group; c2, c3: row g + 8). Gate/up: act[row, n] = swiglu(w1 tile mt, w3 tile mt + kM / 2) in
// f32; down: y[pair, n] in f32.
template <bool kGateUp, class C>
__device__ __forceinline__ void store_tile(const float (&acc)[C::kMTiles][C::kTok / 8][4],
                                           int64_t N, int64_t n_warp, const int32_t* sorted_pair,
                                           int start, int rows, int n8, float limit, float* out,
                                           int g, int q) {
  constexpr int kOut = kGateUp ? C::kMTiles / 2 : C::kMTiles;
#pragma unroll
  for (int mt = 0; mt < kOut; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t n = n_warp + 16 * mt + g + 8 * hr;
      if (n >= N) continue;
#pragma unroll
      for (int j = 0; j < C::kTok / 8; ++j) {
        if (j >= n8) break;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int r = 8 * j + 2 * q + c;
          if (r >= rows) continue;
          if constexpr (kGateUp) {
            out[static_cast<int64_t>(start + r) * N + n] =
                swiglu(acc[mt][j][2 * hr + c], acc[mt + kOut][j][2 * hr + c], limit);
          } else {
            out[static_cast<int64_t>(sorted_pair[start + r]) * N + n] = acc[mt][j][2 * hr + c];
          }
        }
      }
    }
  }
}

// kGateUp: act[row, n] = swiglu(x[token] . w1_e[n], x[token] . w3_e[n]) for the tile's rows and
// 128 columns n (a = staged x [tokens], K = H, N = I). Otherwise y[pair, n] = act[row] . w2_e[n]
// for 256 columns (a = staged act [pairs], K = I, N = H). CTA blockIdx.x works on tile
// blockIdx.x % max_tiles and column block blockIdx.x / max_tiles (the row tiles of one expert
// are neighbours, so they share its weight blocks through L2).
template <QuantFormat F, bool kGateUp, class C, int kPlanes>
__global__ void __launch_bounds__(C::kThreads)
    expert_quant_kernel(const __nv_bfloat16* __restrict__ a, int64_t K, int64_t N, int top_k,
                        const int32_t* __restrict__ sorted_pair, TileList tiles, int max_tiles,
                        QuantMatrices lo, QuantMatrices hi, int block_rows, int block_cols_log2,
                        float limit, float* __restrict__ out) {
  constexpr int kM = C::kMTiles;
  constexpr int kHalf = kGateUp ? kM / 2 : kM;  // m16 tiles per matrix
  constexpr int kStageWords = kPlanes * C::kTok * kQuantRowWords;
  extern __shared__ int4 quant_smem_raw[];
  uint32_t* smem = reinterpret_cast<uint32_t*>(quant_smem_raw);
  __shared__ int64_t row_src[C::kTok];

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

  // tile_rows: where each token row's staged planes start.
  if (tid < C::kTok) {
    int64_t src = -1;
    if (tid < rows) {
      const int64_t row = kGateUp ? sorted_pair[start + tid] / top_k : start + tid;
      src = row * kPlanes * Kp;
    }
    row_src[tid] = src;
  }

  // The lane's weight rows (clamped to N - 1: tail rows load valid bytes and are never stored).
  const int64_t n_warp = static_cast<int64_t>(col) * (C::kWeightRows / (kGateUp ? 2 : 1)) +
                         static_cast<int64_t>(warp) * 16 * kHalf;
  WeightRows<kM> wr;
  const int64_t row_bytes = QuantTraits<F>::kMx ? K / 2 : K;
  const int64_t kblocks = QuantTraits<F>::kMx ? K / 32 : ((K - 1) >> block_cols_log2) + 1;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const QuantMatrices& m = (kGateUp && mt >= kHalf) ? hi : lo;
    const uint8_t* values = m.values[e];
    const void* scales = m.scales[e];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      int64_t n = n_warp + 16 * (mt % kHalf) + g + 8 * hr;
      n = n < N ? n : N - 1;
      wr.values[mt][hr] = values + n * row_bytes;
      if constexpr (QuantTraits<F>::kMx) {
        wr.scales[mt][hr] = static_cast<const uint8_t*>(scales) + n * kblocks;
      } else {
        wr.scales[mt][hr] = static_cast<const float*>(scales) + (n / block_rows) * kblocks;
      }
    }
  }

  float acc[kM][C::kTok / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int j = 0; j < C::kTok / 8; ++j)
      acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
  }

  const int slices = static_cast<int>(Kp / kQuantSliceK);
  SliceWeights<F, kM> cur, nxt;
  load_weights<F, kM>(cur, wr, 0, q, K, block_cols_log2);
  __syncthreads();  // row_src
  stage_slice<C, kPlanes>(smem, a, row_src, 8 * n8, 0, Kp);
  cp_async_commit();
#pragma unroll 1
  for (int s = 0; s < slices; ++s) {
    // Slice s + 1's weights in flight during slice s (zeros past the end: no load).
    load_weights<F, kM>(nxt, wr, s + 1, q, K, block_cols_log2);
    // Slice s landed for every thread; every warp is done with the buffer refilled below.
    cp_async_wait_all();
    __syncthreads();
    if (s + 1 < slices) {
      stage_slice<C, kPlanes>(smem + ((s + 1) & 1) * kStageWords, a, row_src, 8 * n8, s + 1, Kp);
    }
    cp_async_commit();
    multiply_slice<F, C, kPlanes>(acc, cur, smem + (s & 1) * kStageWords, n8, g, q);
    cur = nxt;
  }

  store_tile<kGateUp, C>(acc, N, n_warp, sorted_pair, start, rows, n8, limit, out, g, q);
}

template <QuantFormat F, int kPlanes>
void launch_stage(const float* src, int64_t rows, int64_t K, __nv_bfloat16* dst,
                  cudaStream_t stream) {
  const int64_t Kp = (K + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK;
  const int64_t n = rows * (Kp / 8);
  if (n == 0) return;
  stage_activations_kernel<F, kPlanes><<<ceil_div(n, 256), 256, 0, stream>>>(src, rows, K, Kp, dst);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

// Activation quantization (bit-identical to the CPU op) into `qbuf` (may be `src`), then staging.
template <QuantFormat F>
void quantize_and_stage(const float* src, float* qbuf, int64_t rows, int64_t K, int group,
                        __nv_bfloat16* dst, cudaStream_t stream) {
  if (group > 0) {
    launch_quantize_activations(src, qbuf, rows, K, group, stream);
    DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
    launch_stage<F, 1>(qbuf, rows, K, dst, stream);
  } else {
    launch_stage<F, 3>(src, rows, K, dst, stream);
  }
}

template <QuantFormat F, bool kGateUp, class C, int kPlanes>
void launch_gemm(const QuantExpertsArgs& p, const __nv_bfloat16* a, float* out,
                 cudaStream_t stream) {
  const int64_t K = kGateUp ? p.hidden : p.inter;
  const int64_t N = kGateUp ? p.inter : p.hidden;
  const int64_t cols =
      (N + C::kWeightRows / (kGateUp ? 2 : 1) - 1) / (C::kWeightRows / (kGateUp ? 2 : 1));
  const int smem = static_cast<int>(C::smem_bytes(kPlanes));
  auto kernel = expert_quant_kernel<F, kGateUp, C, kPlanes>;
  DEEPINFER_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // Grid size: checked against gridDim.x's limit by the caller.
  kernel<<<static_cast<unsigned>(p.max_tiles * cols), C::kThreads, smem, stream>>>(
      a, K, N, p.top_k, p.sorted_pair, p.tiles, static_cast<int>(p.max_tiles),
      kGateUp ? p.w1 : p.w2, kGateUp ? p.w3 : p.w2, p.block_rows, p.block_cols_log2, p.limit, out);
  DEEPINFER_CUDA_LAUNCH_CHECK("moe_experts");
}

template <QuantFormat F, bool kGateUp, class C>
void launch_gemm_planes(const QuantExpertsArgs& p, int group, const __nv_bfloat16* a, float* out,
                        cudaStream_t stream) {
  if (group > 0) {
    launch_gemm<F, kGateUp, C, 1>(p, a, out, stream);
  } else {
    launch_gemm<F, kGateUp, C, 3>(p, a, out, stream);
  }
}

template <QuantFormat F, class C>
void run_pass(const QuantExpertsArgs& p, const float* x, int64_t tokens, float* xq,
              __nv_bfloat16* xs, float* act, __nv_bfloat16* as, float* y, cudaStream_t stream) {
  const int64_t pairs = tokens * p.top_k;
  quantize_and_stage<F>(x, xq, tokens, p.hidden, p.in_group, xs, stream);
  launch_gemm_planes<F, true, C>(p, p.in_group, xs, act, stream);
  quantize_and_stage<F>(act, act, pairs, p.inter, p.down_group, as, stream);
  launch_gemm_planes<F, false, C>(p, p.down_group, as, y, stream);
}

}  // namespace

int64_t quant_staged_elems(int64_t rows, int64_t k, int planes) {
  return rows * planes * ((k + kQuantSliceK - 1) / kQuantSliceK * kQuantSliceK);
}

void launch_experts_quant(const QuantExpertsArgs& p, ExpertsKernel kernel, const float* x,
                          int64_t tokens, float* xq, __nv_bfloat16* xs, float* act,
                          __nv_bfloat16* as, float* y, cudaStream_t stream) {
  const bool decode = kernel == ExpertsKernel::kQuantDecode;
  if (p.format == QuantFormat::kMxfp4) {
    if (decode) {
      run_pass<QuantFormat::kMxfp4, ExpertQuantDecode>(p, x, tokens, xq, xs, act, as, y, stream);
    } else {
      run_pass<QuantFormat::kMxfp4, ExpertQuantPrefill>(p, x, tokens, xq, xs, act, as, y, stream);
    }
  } else {
    if (decode) {
      run_pass<QuantFormat::kFp8, ExpertQuantDecodeFp8>(p, x, tokens, xq, xs, act, as, y, stream);
    } else {
      run_pass<QuantFormat::kFp8, ExpertQuantPrefill>(p, x, tokens, xq, xs, act, as, y, stream);
    }
  }
}

}  // namespace deepinfer::cuda
