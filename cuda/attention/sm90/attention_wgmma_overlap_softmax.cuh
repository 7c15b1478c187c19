// The scorer's steps of the warp-specialised Hopper attention kernel
// (sm90/attention_wgmma_overlap.cu): S for a whole 64-key tile (one m64n64 product) and its
// online softmax, with the prefetching kernel's arithmetic. kBranchFree (the wgmma_overlap_ilp
// variant): the same operations and the same bits, but the "no real key yet" case selected
// instead of branched around, so the tile's 32 exponentials form one block that ptxas can
// interleave (the branchy form is 16 reconvergence regions on the scorer's critical path).
#pragma once

#include <cstdint>

#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"

namespace deepinfer::cuda::attention_wgmma {

// Issues S for all 64 heads x the tile's 64 keys over the 512 channels (one wgmma group).
__device__ __forceinline__ void issue_scores64(float (&s)[32], uint64_t q_desc, uint64_t k_desc) {
  using T = Tiles<true>;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks) {
    const uint64_t step = T::kmajor_step(ks);
    wgmma_m64n64k16_bf16_kk(s, q_desc + step, k_desc + step, ks > 0);
  }
  wgmma_commit();
}

// softmax_tile over the whole 64-key tile (s: columns 8j + 2qd + {0, 1}, keys 0..31 in j < 4,
// keys 32..63 in j >= 4), with its arithmetic: the two 32-key halves' sums kept apart (d_half[h],
// what warpgroup h kept there), so the denominators come out the same. P and alpha go to shared
// memory (alpha for warpgroup 1).
template <bool kBranchFree = false>
__device__ __forceinline__ void softmax_tile64(float (&s)[32], const int* valid, uint8_t* ps,
                                               float* alpha_s, float scale, int row0, int qd,
                                               float (&m_run)[2], float (&d_half)[2][2],
                                               float (&alpha)[2]) {
  using T = Tiles<true>;
  const int key0 = 2 * qd;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // The flags of keys 8j + 2qd and + 1: one 8-byte load (key0 is even, the flags 1 KB aligned).
    const int2 flags = *reinterpret_cast<const int2*>(valid + key0 + 8 * j);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool real = (e == 0 ? flags.x : flags.y) != 0;
      s[4 * j + e] = real ? s[4 * j + e] * scale : -INFINITY;
      s[4 * j + 2 + e] = real ? s[4 * j + 2 + e] * scale : -INFINITY;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The row's maximum over the whole tile, then across its 4 lanes: a maximum is exact in any
    // order, so this is the per-half maxima's value with half the shuffles on the chain.
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));  // the 4 lanes of a row
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2));
    const float m_new = fmaxf(m_run[r], m);
    const bool none = m_new == -INFINITY;  // no real key yet: nothing to add, nothing to rescale
    alpha[r] = none ? 1.0f : __expf(m_run[r] - m_new);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 4 * h; j < 4 * h + 4; ++j) {
        if constexpr (kBranchFree) {
          // none: the exponentials are NaN and dropped; sum stays +0 (0 + (0 + 0)), as the
          // branch leaves it.
          const float e0 = __expf(s[4 * j + 2 * r] - m_new);
          const float e1 = __expf(s[4 * j + 2 * r + 1] - m_new);
          s[4 * j + 2 * r] = none ? 0.0f : e0;
          s[4 * j + 2 * r + 1] = none ? 0.0f : e1;
          sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
        } else if (none) {
          s[4 * j + 2 * r] = s[4 * j + 2 * r + 1] = 0.0f;
        } else {
          s[4 * j + 2 * r] = __expf(s[4 * j + 2 * r] - m_new);
          s[4 * j + 2 * r + 1] = __expf(s[4 * j + 2 * r + 1] - m_new);
          sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
        }
      }
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      d_half[h][r] = d_half[h][r] * alpha[r] + sum;
    }
    m_run[r] = m_new;
    if (qd == 0) alpha_s[row0 + 8 * r] = alpha[r];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(ps + T::offset(row0 + 8 * r, j) + 4 * qd) =
          pack_bf16(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]);
    }
  }
}

}  // namespace deepinfer::cuda::attention_wgmma
