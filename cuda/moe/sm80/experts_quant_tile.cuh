// Device pieces shared by the quantized expert GEMMs (experts_quant.cu: register prefetch;
// experts_quant_stream.cu: the shared-memory weight ring of the decode shape): the mma order of
// a slice's inputs (slice_input, piece_word), the in-register decode of MXFP4 / FP8 bytes to
// bf16, the activation slices in shared memory, the slice multiply and the epilogue. The layout
// and the exactness argument are written at the top of experts_quant.cu.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/activation.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/moe/moe_launch.h"
#include "cuda/moe/sm80/experts_quant_config.h"

namespace deepinfer::cuda::quant_tile {

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

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
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

// The four decoded pairs of MXFP4 word r (pair p: nibbles p, p + 4), bit for bit decode_pair's
// (checked for every 32-bit word), in 11 integer instructions instead of 15. Two selects each
// gather, for two pairs, every sign where a mask keeps it and every magnitude 6 bits to its
// right (w: pairs 2, 3 from r and r >> 6; v: pairs 0, 1 from r << 8 and r << 2). One mask, after
// a shift by 4 for pairs 0 and 2, then picks out a pair: the other bits a select leaves in place
// never reach the kept bits 6..8, 15 (+ 16). The selects are opaque (asm) so that the compiler
// does not fold them back into a mask per pair.
__device__ __forceinline__ uint32_t select_bits(uint32_t where_a, uint32_t a, uint32_t b) {
  uint32_t out;  // (a & where_a) | (b & ~where_a)
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(out) : "r"(a), "r"(where_a), "r"(b));
  return out;
}

__device__ __forceinline__ void decode_mx_word(uint32_t r, uint32_t (&pair)[4]) {
  constexpr uint32_t kSigns = 0x88008800u;  // bits 11, 15 (+ 16): signs of pairs 0, 2 and 1, 3
  constexpr uint32_t kKeep = 0x81C081C0u;   // sign bit 15 and magnitude bits 6..8 (+ 16)
  const uint32_t w = select_bits(kSigns, r, r >> 6);
  const uint32_t v = select_bits(kSigns, r << 8, r << 2);
  pair[0] = (v << 4) & kKeep;
  pair[1] = v & kKeep;
  pair[2] = (w << 4) & kKeep;
  pair[3] = w & kKeep;
}

// mx_multiplier's one factor (e <= 128) in one integer multiply-add: (e + 126) << 7 in both halves.
__device__ __forceinline__ uint32_t mx_multiplier_one(uint32_t e) {
  return e * 0x00800080u + 0x3F003F00u;
}

// kTwo: some multiplier of the warp's slice has two factors (m.two); without, the second
// multiply is left out of the code (a predicated one would still take an issue slot per pair).
template <bool kTwo>
__device__ __forceinline__ uint32_t apply_multiplier(uint32_t decoded, const Multiplier& m) {
  uint32_t v = mul_bf16x2(decoded, m.first);
  if (kTwo && m.two) v = mul_bf16x2(v, m.second);
  return v;
}

template <QuantFormat F, bool kTwo>
__device__ __forceinline__ uint32_t decode_scaled(const uint4& raw, int f, const Multiplier& m) {
  return apply_multiplier<kTwo>(decode_pair<F>(raw, f), m);
}

// Where a lane's weight rows live: rows g and g + 8 (hr = 0, 1) of each of its m16 tiles.
template <int kMTiles>
struct WeightRows {
  const uint8_t* values[kMTiles][2];  // the row's bytes
  const void* scales[kMTiles][2];     // MXFP4: the row's e8m0 bytes; FP8: its row of blocks
};

// The weight rows of the lane (g = lane / 4) in the warp whose first row is n_warp, in expert e:
// under kGateUp the first half of the m16 tiles are gate rows (lo), the second half up rows (hi).
// Rows are clamped to N - 1: tail rows load valid bytes and are never stored. value_offset and
// mx_scale_offset fold a lane's own offsets in (bytes into the row, e8m0 bytes into its scales).
template <QuantFormat F, int kMTiles, bool kGateUp>
__device__ __forceinline__ WeightRows<kMTiles> lane_weight_rows(
    const QuantMatrices& lo, const QuantMatrices& hi, int e, int64_t n_warp, int g, int64_t N,
    int64_t K, int block_rows, int block_cols_log2, int value_offset = 0, int mx_scale_offset = 0) {
  constexpr int kHalf = kGateUp ? kMTiles / 2 : kMTiles;  // m16 tiles per matrix
  WeightRows<kMTiles> wr;
  const int64_t row_bytes = QuantTraits<F>::kMx ? K / 2 : K;
  const int64_t kblocks = QuantTraits<F>::kMx ? K / 32 : ((K - 1) >> block_cols_log2) + 1;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const QuantMatrices& m = (kGateUp && mt >= kHalf) ? hi : lo;
    const uint8_t* values = m.values[e];
    const void* scales = m.scales[e];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      int64_t n = n_warp + 16 * (mt % kHalf) + g + 8 * hr;
      n = n < N ? n : N - 1;
      wr.values[mt][hr] = values + n * row_bytes + value_offset;
      if constexpr (QuantTraits<F>::kMx) {
        wr.scales[mt][hr] = static_cast<const uint8_t*>(scales) + n * kblocks + mx_scale_offset;
      } else {
        wr.scales[mt][hr] = static_cast<const float*>(scales) + (n / block_rows) * kblocks;
      }
    }
  }
  return wr;
}

// A lane's weight bytes and scales of one slice.
template <QuantFormat F, int kMTiles>
struct SliceWeights {
  static constexpr int kLoads = QuantTraits<F>::kLoads;
  uint4 raw[kMTiles][2][kLoads];
  uint32_t scale[kMTiles][2][kLoads];  // MXFP4: the e8m0 byte; FP8: the f32 bits
};

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
  // A compile-time count of pieces per thread (blockDim.x == C::kThreads): no loop at all for
  // one piece per thread (the decode shapes), a rolled one for more (fewer live registers).
  constexpr int kPerThread = (kPieces + C::kThreads - 1) / C::kThreads;
#pragma unroll 1
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * C::kThreads;
    if (kPieces % C::kThreads != 0 && idx >= kPieces) break;
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
// group of the tile (n8 of them) and plane, one shared load and 2 kMTiles mma. raw(mt, hr, l)
// gives the lane's 16-byte load l of row hr of m16 tile mt; each is fetched once, just before
// its first step (FP8's second load only halfway through the slice).
// kLean (MXFP4): the same values from fewer instructions, decode_mx_word per 32-bit word and
// mx_multiplier_one where no multiplier has two factors. kMaxN8: a compile-time bound on n8 (a
// caller that knows the tile has at most 8 rows passes 1: no predicated-off work for the second
// group of 8).
template <QuantFormat F, class C, int kPlanes, bool kTwo, bool kLean, int kMaxN8, class RawAt>
__device__ __forceinline__ void multiply_decoded(
    float (&acc)[C::kMTiles][C::kTok / 8][4], const RawAt& raw,
    const uint32_t (&scale)[C::kMTiles][2][QuantTraits<F>::kLoads], const uint32_t* buf, int n8,
    int g, int q) {
  using Tr = QuantTraits<F>;
  constexpr int kM = C::kMTiles;
  constexpr bool kWordDecode = kLean && Tr::kMx;
  Multiplier mul[kM][2][Tr::kLoads];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
      for (int l = 0; l < Tr::kLoads; ++l) {
        if constexpr (kWordDecode && !kTwo) {
          mul[mt][hr][l] = {mx_multiplier_one(scale[mt][hr][l]), 0u, false};
        } else {
          mul[mt][hr][l] = Tr::kMx ? mx_multiplier(scale[mt][hr][l])
                                   : fp8_multiplier(__uint_as_float(scale[mt][hr][l]));
        }
      }
    }
  }
  static_assert(Tr::kStepsPerLoad % 2 == 0, "both steps of a piece decode from one load");
  uint4 chunk[kM][2];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int l = 2 * t / Tr::kStepsPerLoad;
    if ((2 * t) % Tr::kStepsPerLoad == 0) {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        chunk[mt][0] = raw(mt, 0, l);
        chunk[mt][1] = raw(mt, 1, l);
      }
    }
    uint32_t af[2][kM][4];
    if constexpr (kWordDecode) {
      // Steps 2t, 2t + 1 take pairs 4t .. 4t + 3: the four pairs of word t (slice_input).
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        uint32_t pr[2][4];
        decode_mx_word(word_of(chunk[mt][0], t), pr[0]);
        decode_mx_word(word_of(chunk[mt][1], t), pr[1]);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          af[u][mt][0] = apply_multiplier<kTwo>(pr[0][2 * u], mul[mt][0][0]);
          af[u][mt][1] = apply_multiplier<kTwo>(pr[1][2 * u], mul[mt][1][0]);
          af[u][mt][2] = apply_multiplier<kTwo>(pr[0][2 * u + 1], mul[mt][0][0]);
          af[u][mt][3] = apply_multiplier<kTwo>(pr[1][2 * u + 1], mul[mt][1][0]);
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int sl = (2 * t + u) % Tr::kStepsPerLoad;
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          // a0a1: row g, k 2q..; a2a3: row g + 8; a4a5, a6a7: the same rows at k 2q + 8.
          af[u][mt][0] = decode_scaled<F, kTwo>(chunk[mt][0], 2 * sl, mul[mt][0][l]);
          af[u][mt][1] = decode_scaled<F, kTwo>(chunk[mt][1], 2 * sl, mul[mt][1][l]);
          af[u][mt][2] = decode_scaled<F, kTwo>(chunk[mt][0], 2 * sl + 1, mul[mt][0][l]);
          af[u][mt][3] = decode_scaled<F, kTwo>(chunk[mt][1], 2 * sl + 1, mul[mt][1][l]);
        }
      }
    }
    const int word = piece_word(q, t);
#pragma unroll
    for (int j = 0; j < kMaxN8; ++j) {
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

// multiply_decoded with the lane's scales (MXFP4: e8m0 bytes; FP8: f32 bits); the two-factor
// code only where some lane of the warp needs it (the branch is warp-uniform: mma.sync needs
// the whole warp).
template <QuantFormat F, class C, int kPlanes, bool kLean = false, int kMaxN8 = C::kTok / 8,
          class RawAt>
__device__ __forceinline__ void multiply_slice(
    float (&acc)[C::kMTiles][C::kTok / 8][4], const RawAt& raw,
    const uint32_t (&scale)[C::kMTiles][2][QuantTraits<F>::kLoads], const uint32_t* buf, int n8,
    int g, int q) {
  using Tr = QuantTraits<F>;
  bool two = false;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
      for (int l = 0; l < Tr::kLoads; ++l) {
        two = two || (Tr::kMx ? mx_multiplier(scale[mt][hr][l]).two
                              : fp8_multiplier(__uint_as_float(scale[mt][hr][l])).two);
      }
    }
  }
  if (__any_sync(0xffffffffu, two)) {
    multiply_decoded<F, C, kPlanes, true, kLean, kMaxN8>(acc, raw, scale, buf, n8, g, q);
  } else {
    multiply_decoded<F, C, kPlanes, false, kLean, kMaxN8>(acc, raw, scale, buf, n8, g, q);
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

}  // namespace deepinfer::cuda::quant_tile
