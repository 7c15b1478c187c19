// The scorer's steps of the warp-specialised Hopper attention kernel
// (sm90/attention_wgmma_overlap.cu): S for a whole 64-key tile (one m64n64 product) and its
// online softmax: the plain overlap kernel with the prefetching kernel's arithmetic, the
// wgmma_overlap_ilp variant (kBranchFree) with the key-split kernel's (softmax_tile64).
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

// The tile's probabilities P (s: columns 8j + 2qd + {0, 1}, keys 0..31 in j < 4, keys 32..63 in
// j >= 4) into P's shared tile, the rows' rescale factors alpha (also to shared memory, for
// warpgroup 1), the running maxima m_run (of the scaled scores) and denominators d.
//  - kBranchFree = false (the plain overlap kernel): softmax_tile's arithmetic over the whole
//    tile (the scores scaled first, e^x by __expf), the two 32-key halves' sums kept apart in
//    d[h][r] and each reduced across the row's 4 lanes at every tile, so the bytes are the other
//    wgmma kernels'.
//  - kBranchFree = true (wgmma_overlap_ilp and its pairs): the key-split kernel's arithmetic, e^x
//    as 2^(s scale log2(e) - m log2(e)), one FFMA and one MUFU per score with the scale folded in,
//    a masked key's -inf giving 0 (also before any real key, where m is taken as 0); the row's
//    sum kept per thread in d[0][r] and reduced across the 4 lanes once, by the caller at the
//    end (softmax_row_sum). No branch and no per-tile shuffle of the sums on the scorer's chain
//    (the softmax was 2,300 of a pair tile's 5,000 cycles: session 27's trace). Close to the
//    other kernels' result, not their bytes.
template <bool kBranchFree = false>
__device__ __forceinline__ void softmax_tile64(float (&s)[32], const int* valid, uint8_t* ps,
                                               float* alpha_s, float scale, int row0, int qd,
                                               float (&m_run)[2], float (&d)[2][2],
                                               float (&alpha)[2]) {
  using T = Tiles<true>;
  mask_tile64(s, valid, qd, kBranchFree ? 1.0f : scale);  // branch-free: scaled in the exp
  const float scale_log2 = scale * kLog2E;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The row's maximum over the whole tile (the per-half maxima's value with half the shuffles
    // on the chain).
    const float m = row_max_tile64(s, r);
    // Branch-free: the raw maximum scaled (the scale is positive and rounding monotonic, so the
    // maximum of the scaled scores, exactly).
    const float m_new = fmaxf(m_run[r], kBranchFree ? m * scale : m);
    const bool none = m_new == -INFINITY;  // no real key yet: nothing to add, nothing to rescale
    alpha[r] = none ? 1.0f : __expf(m_run[r] - m_new);
    if constexpr (kBranchFree) {
      const float m_log2 = none ? 0.0f : m_new * kLog2E;
      d[0][r] = d[0][r] * alpha[r] + exp2_row_tile64(s, r, scale_log2, m_log2);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 4 * h; j < 4 * h + 4; ++j) {
          if (none) {
            s[4 * j + 2 * r] = s[4 * j + 2 * r + 1] = 0.0f;
          } else {
            s[4 * j + 2 * r] = __expf(s[4 * j + 2 * r] - m_new);
            s[4 * j + 2 * r + 1] = __expf(s[4 * j + 2 * r + 1] - m_new);
            sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
          }
        }
        sum += __shfl_xor_sync(kFullMask, sum, 1);
        sum += __shfl_xor_sync(kFullMask, sum, 2);
        d[h][r] = d[h][r] * alpha[r] + sum;
      }
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

// The rows' denominators from softmax_tile64's sums: kBranchFree, each thread's d[0][r] summed
// over the row's 4 lanes (every lane gets the row's value); otherwise the two halves' sums.
template <bool kBranchFree>
__device__ __forceinline__ float softmax_row_sum(const float (&d)[2][2], int r) {
  if constexpr (kBranchFree) {
    float sum = d[0][r] + __shfl_xor_sync(kFullMask, d[0][r], 1);
    return sum + __shfl_xor_sync(kFullMask, sum, 2);
  } else {
    return d[0][r] + d[1][r];
  }
}

}  // namespace deepinfer::cuda::attention_wgmma
