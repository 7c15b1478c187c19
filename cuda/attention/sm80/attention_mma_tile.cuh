// The per-tile steps of the mma.sync attention kernel (attention_mma.cu, whose header describes
// the block, its shared memory and the pipeline): the warp layouts, the key copies and their
// conversion to bf16 tiles, q's tile, S = Q K^T over a warp's slice of D, the slices' sums, the
// online softmax and O += P V.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/attention/attention_keys.cuh"
#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm80/attention_mma_config.h"
#include "cuda/cache/kv_record.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda::attention_mma {

// The warp layout of kSlices warps per row group of 16 heads: 2 (64 heads per block, 4 row groups
// x 2 halves of D) or 8 (16 heads per block, 1 row group x 8 slices of D).
template <int kSlices>
struct WarpLayout {
  static_assert(kSlices == 2 || kSlices == 8, "two warp layouts");
  static constexpr int kRowGroups = kMmaWarps / kSlices;
  static constexpr int kRows = 16 * kRowGroups;  // heads per block
};

// Barrier of the kSlices warps of a row group (ids 1..4; 0 is __syncthreads).
template <int kSlices>
__device__ __forceinline__ void row_group_barrier(int rg) {
  named_barrier<32 * kSlices>(1 + rg);
}

// Copies this thread's chunks cs + 8j of one key's row (src, null = masked: nothing to copy)
// into its row of the stage; 8 threads cover 8 adjacent chunks of a key per instruction. f32
// rows move in 16-byte chunks; fp8 records (584 bytes at D = 512) in 8-byte ones. (bf16 rows
// skip the stage: copy_bf16_key.)
template <int kDim, KvFormat kFmt>
__device__ __forceinline__ void issue_key_copy(uint8_t* my_stage, const uint8_t* src, int cs,
                                               int row_bytes) {
  if (src == nullptr) return;
  if constexpr (kFmt == KvFormat::kFp8) {
    for (int c = cs; c < row_bytes / 8; c += 8) cp_async_8(my_stage + 8 * c, src + 8 * c);
  } else {
    static_assert(kFmt == KvFormat::kF32, "bf16 rows go to kb directly (copy_bf16_key)");
    constexpr int kChunks = kDim * 4 / 16 / 8;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = cs + 8 * j;
      cp_async_16(my_stage + 16 * c, src + 16 * c);
    }
  }
}

// bf16 rows are already the tile's format: this thread's 16-byte chunks cs + 8j of its key go
// straight into its row of kb (no stage, no conversion pass), a masked key's chunks are zeroed
// there (0 * V must stay 0), and the key's valid flag is set. Called for the kb buffer the tile
// will use, at the points where issue_key_copy is (after the barrier that frees that buffer).
template <int kDim>
__device__ __forceinline__ void copy_bf16_key(__nv_bfloat16* kb, int* valid, const uint8_t* src,
                                              int cr, int cs) {
  constexpr int kChunks = kDim * 2 / 16 / 8;
  uint8_t* dst = reinterpret_cast<uint8_t*>(kb + cr * MmaLayout<kDim>::kStride);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = cs + 8 * j;
    if (src != nullptr) {
      cp_async_16(dst + 16 * c, src + 16 * c);
    } else {
      *reinterpret_cast<uint4*>(dst + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  if (cs == 0) valid[cr] = src != nullptr ? 1 : 0;
}

// Four q channels as the bf16 the products take: f32 rounded, bf16 as it is.
__device__ __forceinline__ uint2 query_bf16x4(float4 v) {
  return make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}
__device__ __forceinline__ uint2 query_bf16x4(uint2 v) {
  return v;
}

// kRows q rows of the group into qs, rounded to bf16 (rows past the heads are 0); loads batched
// so their latencies overlap. q in bf16 (a.q_bf16: rms_norm_rope's under bf16_output) is copied
// as it is, which is what rounding its exact f32 widening would give. Chunk: four channels of
// the source, float4 or uint2.
template <int kDim, int kRows, typename Chunk>
__device__ __forceinline__ void stage_query_rows(const Chunk* q4, __nv_bfloat16* qs, int nhb,
                                                 int tid) {
  constexpr int kStride = MmaLayout<kDim>::kStride;
  constexpr int kQ4 = kDim / 4;
  constexpr int kQIters = kRows * kQ4 / kMmaThreads;
  constexpr int kQBatch = kQIters < 16 ? kQIters : 16;
  static_assert(kQIters % kQBatch == 0, "q batches");
#pragma unroll 1
  for (int i0 = 0; i0 < kQIters; i0 += kQBatch) {
    Chunk v[kQBatch];
#pragma unroll
    for (int u = 0; u < kQBatch; ++u) {
      const int i = tid + (i0 + u) * kMmaThreads;
      v[u] = i / kQ4 < nhb ? __ldg(q4 + i) : Chunk{};
    }
#pragma unroll
    for (int u = 0; u < kQBatch; ++u) {
      const int i = tid + (i0 + u) * kMmaThreads;
      const int r = i / kQ4;
      *reinterpret_cast<uint2*>(qs + r * kStride + 4 * (i - r * kQ4)) = query_bf16x4(v[u]);
    }
  }
}

template <int kDim, int kRows>
__device__ __forceinline__ void load_query_tile(const AttentionArgs& a, __nv_bfloat16* qs, int t,
                                                int h_first, int nhb, int tid) {
  const int64_t q_first = (static_cast<int64_t>(t) * a.heads + h_first) * kDim;
  if (a.q_bf16 != nullptr) {  // uniform over the grid
    stage_query_rows<kDim, kRows>(reinterpret_cast<const uint2*>(a.q_bf16 + q_first), qs, nhb, tid);
  } else {
    stage_query_rows<kDim, kRows>(reinterpret_cast<const float4*>(a.q + q_first), qs, nhb, tid);
  }
}

// This thread's part of the staged key tile rounded into kb (a masked key is a zero row: 0 * V
// must stay 0), and whether its key is real.
template <int kDim>
__device__ __forceinline__ void round_key_tile(__nv_bfloat16* kb, int* valid, const float* my_stage,
                                               bool my_valid, int cr, int cs) {
  constexpr int kStride = MmaLayout<kDim>::kStride;
  constexpr int kChunks = kDim / 32;
  __nv_bfloat16* dst = kb + cr * kStride;
#pragma unroll 4
  for (int j = 0; j < kChunks; ++j) {
    const int c = cs + 8 * j;
    const float4 v = my_valid ? *reinterpret_cast<const float4*>(my_stage + 4 * c)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<uint2*>(dst + 4 * c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
  if (cs == 0) valid[cr] = my_valid ? 1 : 0;
}

// The fp8 twin of round_key_tile: this thread's channels 8(cs + 8j) .. +7 of its key, decoded
// from the staged record into kb. The decode is exact (e4m3 times a power of two and the bf16
// RoPE channels are bf16 values), so the tile equals the f32 path's rounding of the decoded key.
// The record's scale bytes were copied by other threads of the key (the same warp): the caller
// orders their copies before this with __syncwarp.
//
// V4's layout (the last 64 channels RoPE, so nope = D - 64 and a thread's chunk j is scale group
// j's, or the RoPE channels for the last j, known at compile time) decodes through integer
// operations (decode_e4m3_chunk, the wgmma producer's): the conversion units' decode ran at a
// quarter of the integer rate and was most of the small-batch kernel's first tile (1,570 cycles
// against 295 with bf16 rows on an H100, session 65). Every chunk is decoded and a masked key's
// zeros selected at the end, so the chunks form one straight-line block (a masked key's stage row
// holds older bytes: decoded and dropped). Other layouts (the tiny test models') take the
// conversion units. The same bits either way.
template <int kDim>
__device__ __forceinline__ void decode_key_tile(__nv_bfloat16* kb, int* valid,
                                                const uint8_t* my_stage, bool my_valid, int cr,
                                                int cs, int nope, int rope_dim) {
  constexpr int kStride = MmaLayout<kDim>::kStride;
  constexpr int kChunks = kDim / 64;  // this thread's: channels 8 cs + 64 j .. + 7
  constexpr int kRope = 64;
  __nv_bfloat16* dst = kb + cr * kStride;
  if constexpr (kDim > kRope && kDim - kRope <= 8 * kv_record::kFp8Group) {
    static_assert(kv_record::kFp8Group == 64, "a thread's chunk j in scale group j");
    if (rope_dim == kRope && nope == kDim - kRope) {  // uniform over the grid
      // The scales (kChunks - 1 bytes) start 8-byte aligned at nope + 2 * 64; the record's
      // padding to 8 bytes holds the rest of the word.
      const uint2 scale_bytes = *reinterpret_cast<const uint2*>(my_stage + kDim + kRope);
      uint4 v[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks - 1; ++j) {
        const uint32_t e = ((j < 4 ? scale_bytes.x : scale_bytes.y) >> (8 * (j % 4))) & 0xffu;
        v[j] = decode_e4m3_chunk(*reinterpret_cast<const uint2*>(my_stage + 8 * cs + 64 * j),
                                 e8m0_to_bf16x2(e));
      }
      v[kChunks - 1] = *reinterpret_cast<const uint4*>(my_stage + nope + 16 * cs);  // bf16
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        *reinterpret_cast<uint4*>(dst + 8 * cs + 64 * j) =
            my_valid ? v[j] : make_uint4(0u, 0u, 0u, 0u);
      }
      if (cs == 0) valid[cr] = my_valid ? 1 : 0;
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = 8 * (cs + 8 * j);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (my_valid) {
      v = fp8_record_chunk_bf16(my_stage, c, nope, rope_dim);
    }
    *reinterpret_cast<uint4*>(dst + c) = v;
  }
  if (cs == 0) valid[cr] = my_valid ? 1 : 0;
}

// S partial over this warp's slice of D: its 16 rows x the tile's 32 keys, written to ss_mine.
template <int kDim, int kSlices>
__device__ __forceinline__ void score_key_tile(const __nv_bfloat16* q_frag, const __nv_bfloat16* kb,
                                               int k_frag, float* ss_mine, int g, int qd) {
  constexpr int kStride = MmaLayout<kDim>::kStride;
  constexpr int kKSteps = kDim / kSlices / 16;  // k16 steps of S over a warp's slice of D
  float sacc[4][4];
#pragma unroll
  for (int n = 0; n < 4; ++n) sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t af[4];
    ldmatrix_x4(af, q_frag + 16 * ks);
#pragma unroll
    for (int kp = 0; kp < 2; ++kp) {
      uint32_t bf[4];
      ldmatrix_x4(bf, kb + k_frag + kp * 16 * kStride + 16 * ks);
      mma_bf16(sacc[2 * kp], af, bf[0], bf[1]);
      mma_bf16(sacc[2 * kp + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    *reinterpret_cast<float2*>(ss_mine + g * kMmaSStride + 8 * n + 2 * qd) =
        make_float2(sacc[n][0], sacc[n][1]);
    *reinterpret_cast<float2*>(ss_mine + (g + 8) * kMmaSStride + 8 * n + 2 * qd) =
        make_float2(sacc[n][2], sacc[n][3]);
  }
}

// The logits of rows g, g + 8 (this lane's columns 8n + 2qd + {0, 1}) of the warp's row group:
// the slices' partial sums of ss_rows added in slice order, times scale, masked keys -inf. Every
// warp of a row group gets bit-identical logits, so they run identical online softmaxes and keep
// identical (max, sum) registers: no second exchange is needed.
//  - 2 slices: each warp adds the two partials itself.
//  - 8 slices: warp `slice` adds the 8 partials of keys 4 slice .. 4 slice + 3 of the 16 rows into
//    ssum, and after a second barrier of the row group every warp reads ssum (each partial is
//    read once instead of by every warp).
template <int kSlices>
__device__ __forceinline__ void gather_logits(const float* ss_rows, float* ssum, const int* valid,
                                              float scale, int slice, int rg, int lane,
                                              float (&s)[4][4]) {
  constexpr int kPartStride = WarpLayout<kSlices>::kRows * kMmaSStride;  // between slices
  const int g = lane >> 2;
  const int qd = lane & 3;
  const float* sum_rows = ssum;
  if constexpr (kSlices == 8) {
    const int row = lane >> 1;
    const int col = 4 * slice + 2 * (lane & 1);
    float2 acc = *reinterpret_cast<const float2*>(ss_rows + row * kMmaSStride + col);
#pragma unroll
    for (int p = 1; p < kSlices; ++p) {
      const float2 x =
          *reinterpret_cast<const float2*>(ss_rows + p * kPartStride + row * kMmaSStride + col);
      acc.x += x.x;
      acc.y += x.y;
    }
    *reinterpret_cast<float2*>(ssum + row * kMmaSStride + col) = acc;
    row_group_barrier<kSlices>(rg);
  }
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int off = (g + 8 * r) * kMmaSStride + 8 * n + 2 * qd;
      float2 x;
      if constexpr (kSlices == 2) {
        const float2 x0 = *reinterpret_cast<const float2*>(ss_rows + off);
        const float2 x1 = *reinterpret_cast<const float2*>(ss_rows + kPartStride + off);
        x = make_float2(x0.x + x1.x, x0.y + x1.y);
      } else {
        x = *reinterpret_cast<const float2*>(sum_rows + off);
      }
      // The flags of keys 8n + 2qd and + 1 in one 8-byte load (the key even, valid 16-byte
      // aligned).
      const int2 flags = *reinterpret_cast<const int2*>(valid + 8 * n + 2 * qd);
      s[n][2 * r] = flags.x != 0 ? x.x * scale : -INFINITY;
      s[n][2 * r + 1] = flags.y != 0 ? x.y * scale : -INFINITY;
    }
  }
}

// The online softmax of rows g and g + 8 over the tile's logits s: the new running max and
// denominator, the rescale factor alpha of the old O, and P rounded to bf16 as the A fragments of
// the two k16 steps of P V (the C layout of n8 tiles 2k, 2k+1 is the A layout of k16 step k).
// e^x is __expf's 2^(x log2 e) without its steps for results under 2^-126 (exp2_approx flushes
// them, next to the 1 of the row's maximum): two instructions an exponential instead of five, 18
// of them a thread per tile.
__device__ __forceinline__ void online_softmax_update(float (&s)[4][4], float (&m_run)[2],
                                                      float (&d_run)[2], float (&alpha)[2],
                                                      uint32_t (&pa)[2][4]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));  // the 4 lanes of a row
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
    const float m_new = fmaxf(m_run[r], mx);
    float sum = 0.0f;
    if (m_new == -INFINITY) {  // no valid key yet: nothing to add, nothing to rescale
      alpha[r] = 1.0f;
#pragma unroll
      for (int n = 0; n < 4; ++n) s[n][2 * r] = s[n][2 * r + 1] = 0.0f;
    } else {
      alpha[r] = exp2_approx((m_run[r] - m_new) * kLog2E);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        s[n][2 * r] = exp2_approx((s[n][2 * r] - m_new) * kLog2E);
        s[n][2 * r + 1] = exp2_approx((s[n][2 * r + 1] - m_new) * kLog2E);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    d_run[r] = d_run[r] * alpha[r] + sum;
    m_run[r] = m_new;
  }
  // a0a1 (row g, keys 2qd..), a2a3 (row g+8), a4a5 (row g, keys 8+2qd..), a6a7 (row g+8, keys
  // 8+2qd..).
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    pa[k][0] = pack_bf16(s[2 * k][0], s[2 * k][1]);
    pa[k][1] = pack_bf16(s[2 * k][2], s[2 * k][3]);
    pa[k][2] = pack_bf16(s[2 * k + 1][0], s[2 * k + 1][1]);
    pa[k][3] = pack_bf16(s[2 * k + 1][2], s[2 * k + 1][3]);
  }
}

// O = O * alpha + P V over this warp's slice of D (V = the kb tile, read with ldmatrix.trans).
template <int kDim, int kSlices>
__device__ __forceinline__ void accumulate_values(float (&o)[kDim / kSlices / 8][4],
                                                  const float (&alpha)[2],
                                                  const uint32_t (&pa)[2][4],
                                                  const __nv_bfloat16* kb, int v_frag) {
  constexpr int kStride = MmaLayout<kDim>::kStride;
  constexpr int kNTiles = kDim / kSlices / 8;  // n8 tiles of a warp's O
  // Once the running maxima settle, most tiles leave every row's max unchanged (alpha 1): the
  // warp then skips the multiplications, which would not change O.
  if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, kb + v_frag + k * 16 * kStride + 16 * np);
      mma_bf16(o[2 * np], pa[k], bf[0], bf[1]);
      mma_bf16(o[2 * np + 1], pa[k], bf[2], bf[3]);
    }
  }
}

}  // namespace deepinfer::cuda::attention_mma
