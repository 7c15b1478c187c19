// The consumer warpgroups of the key-split Hopper attention kernel
// (sm90/attention_wgmma_keysplit.cu, whose head comment describes the step): a warpgroup's scores,
// softmax and value products over its own and the other's key tiles, and the block's output.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda/attention/attention_keys.cuh"
#include "cuda/attention/sm90/attention_wgmma_keysplit_layout.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_output.cuh"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"

namespace deepinfer::cuda::attention_wgmma {

// The bf16 output of one split (the engine's call) by the bulk copy engine: warpgroup kWg stages
// its channels of the block's 64 rows in bf16 (store_output_staged's values) into rows of
// kStageRowBytes at `stage` (the key tiles, free once both warpgroups passed kDoneBarrier; a
// row's 16-byte shift against the last keeps the accumulators' stores free of bank conflicts),
// then 64 of its threads each hand one row's 512 bytes to cp.async.bulk and wait only for the
// reads. The block's 64 KB of output then leaves without 4,096 warp store instructions.
constexpr int kStageRowBytes = kDim * 2 + 16;
static_assert(kRows * kStageRowBytes <= 2 * KeySplitLayout::kKbBytes, "the stage fits the tiles");

template <int kWg>
__device__ __forceinline__ void store_output_bulk(const AttentionArgs& a, const float (&o)[kOAcc],
                                                  const float (&m_run)[2], const float (&d)[2],
                                                  const float (&sink)[2], int t, int h_first,
                                                  int row0, int qd, uint8_t* stage) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float f = output_row_factor(m_run[r], d[r], sink[r]);
    uint8_t* dst = stage + row * kStageRowBytes + kWg * kHalfDim * 2 + 4 * qd;
#pragma unroll
    for (int j = 0; j < kOAcc / 4; ++j) {
      // Channels 8j + 2qd, + 1 of the warpgroup's half.
      const __nv_bfloat162 v =
          __floats2bfloat162_rn(o[4 * j + 2 * r] * f, o[4 * j + 2 * r + 1] * f);
      memcpy(dst + 16 * j, &v, 4);
    }
  }
  fence_async_shared();  // the rows, for the bulk copies' reads
  named_barrier<kRows * 2>(kStageFirst + kWg);
  const int thread = threadIdx.x & 127;
  if (thread < kRows) {
    const int64_t idx = static_cast<int64_t>(t) * a.heads + h_first + thread;
    bulk_store_to_global(a.out_bf16 + idx * kDim + kWg * kHalfDim,
                         stage + thread * kStageRowBytes + kWg * kHalfDim * 2, kHalfDim * 2);
    bulk_store_commit();
    bulk_store_wait_read();
  }
}

// A consumer warpgroup's whole part after q's tile (the file's head comment): kWg 0 or 1, a
// compile-time constant so that its tiles' descriptors are uniform values (a runtime warpgroup
// index made ptxas keep 32 per-thread descriptors, spilled).
template <int kWg>
__device__ __forceinline__ void keysplit_consumer(const AttentionArgs& a, const DeviceLayout& l,
                                                  uint8_t* smem, int t, int h_first, int split,
                                                  int splits, int steps) {
  const KeySplitSmem sm{smem};
  uint8_t* qs = sm.q();
  auto kb_of = [&](int b) { return sm.kb(b); };
  auto ps_of = [&](int b) { return sm.ps(b); };
  int* flags = sm.flags();
  float* maxes = sm.maxes();
  float* dens = sm.dens();
  auto ready_bar = [&](int b, int h) { return sm.ready_bar(b, h); };
  auto free_bar = [&](int b, int h) { return sm.free_bar(b, h); };
  auto flags_bar = [&](int b) { return sm.flags_bar(b); };
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int row0 = 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's heads: row0, row0 + 8
  const int qd = lane & 3;
  const uint64_t q_desc = KeySplitTiles::kmajor(qs);
  constexpr int own = kWg;  // the tile this warpgroup scores
  constexpr int other = kWg ^ 1;
  uint8_t* kb_own = kb_of(own);
  const uint64_t k_desc = KeySplitTiles::kmajor(kb_own);
  // The channels of O this warpgroup owns, in its own tile and in the other's.
  const uint64_t v_own = KeySplitTiles::nmajor(kb_own + KeySplitTiles::value_channels(kWg));
  const uint64_t v_other = KeySplitTiles::nmajor(kb_of(other) + KeySplitTiles::value_channels(kWg));
  const uint64_t p_other = KeySplitTiles::kmajor(ps_of(other));
  float* max_own = maxes + kWg * kRows;
  const float* max_other = maxes + other * kRows;

  float o[kOAcc];
#pragma unroll
  for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // the common maximum after the last step
  float d[2] = {0.0f, 0.0f};                // this warpgroup's keys' denominator at m_run
  float s[32];

  // S of this warpgroup's tile of step st, a commit group per channel half, each issued once
  // its half landed (warpgroup 1's high half first: the producer refills kb[1]'s high half
  // first), so the first half's products run while the second half still loads.
  auto issue_score_half = [&](int st, int h, bool first) {
    mbarrier_wait(ready_bar(own, h), static_cast<uint32_t>(st & 1));
    fence_async_shared();
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDim / 32; ++k) {
      const int ks = h * (kDim / 32) + k;
      const uint64_t step = KeySplitTiles::kmajor_step(ks);
      wgmma_m64n64k16_bf16_kk(s, q_desc + step, k_desc + step, !(first && k == 0));
    }
    wgmma_commit();
  };
  auto issue_scores_of_step = [&](int st) {
    issue_score_half(st, kWg, true);
    issue_score_half(st, kWg ^ 1, false);
  };
  // Masks this warpgroup's scores of step st (-inf where no key) and returns each row's maximum
  // times the scale: the scores stay unscaled, exponentiate folds the scale into its one FFMA.
  auto masked_max = [&](int st, float(&mx)[2]) {
    mbarrier_wait(flags_bar(own), static_cast<uint32_t>(st & 1));
    const int* fl = flags + own * kKeys;
    mask_tile64(s, fl, qd, 1.0f);
    // The scale is positive: the maximum of the scaled scores, exactly.
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[r] = row_max_tile64(s, r) * a.scale;
  };
  // P = exp(scale S - m) as 2^(S scale log2(e) - m log2(e)), one FFMA and one MUFU per score
  // (0 where m is -inf: no real key yet, every score -inf), its row sums added to d after d is
  // rescaled by alpha.
  const float scale_log2 = a.scale * kLog2E;
  auto exponentiate = [&](const float(&m)[2], const float(&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_log2 = m[r] == -INFINITY ? 0.0f : m[r] * kLog2E;
      float sum = exp2_row_tile64(s, r, scale_log2, m_log2);
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      d[r] = d[r] * alpha[r] + sum;
    }
  };
  // O rescaled by f per row (skipped when the warp's factors are all 1).
  auto rescale_o = [&](const float(&f)[2]) {
    if (__any_sync(kFullMask, f[0] != 1.0f || f[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < kOAcc / 4; ++j) {
        o[4 * j] *= f[0];
        o[4 * j + 1] *= f[0];
        o[4 * j + 2] *= f[1];
        o[4 * j + 3] *= f[1];
      }
    }
  };
  // O += P (this thread's probabilities, as the A fragment) V over the tile's 64 keys. The
  // fragments are packed before the group: a register written between its products makes ptxas
  // insert a fence there.
  auto issue_own_values = [&]() {
    uint32_t frag[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      frag[ks][0] = pack_bf16(s[8 * ks], s[8 * ks + 1]);
      frag[ks][1] = pack_bf16(s[8 * ks + 2], s[8 * ks + 3]);
      frag[ks][2] = pack_bf16(s[8 * ks + 4], s[8 * ks + 5]);
      frag[ks][3] = pack_bf16(s[8 * ks + 6], s[8 * ks + 7]);
    }
    fence_accumulators(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma_m64n256k16_bf16_rn(o, frag[ks], v_own + KeySplitTiles::nmajor_step(ks), true);
    }
    wgmma_commit();
  };
  // O += P' V with the other warpgroup's probabilities from shared memory.
  auto issue_other_values = [&]() {
    fence_accumulators(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma_m64n256k16_bf16_kn(o, p_other + KeySplitTiles::kmajor_step(ks),
                               v_other + KeySplitTiles::nmajor_step(ks), true);
    }
    wgmma_commit();
  };
  // This thread's probabilities times f (per row), rounded to bf16, into P's tile b.
  auto store_probs = [&](int b, const float(&f)[2]) {
    uint8_t* ps = ps_of(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        *reinterpret_cast<uint32_t*>(ps + KeySplitTiles::offset(row0 + 8 * r, j) + 4 * qd) =
            pack_bf16(s[4 * j + 2 * r] * f[r], s[4 * j + 2 * r + 1] * f[r]);
      }
    }
    fence_async_shared();  // P, for the other warpgroup's wgmma
  };

  if constexpr (kWg == 0) {
    if (steps > 0) {
      issue_scores_of_step(0);
      wgmma_wait<0>();
      fence_accumulators(s);
    }
#pragma unroll 1
    for (int st = 0; st < steps; ++st) {
      float mx[2];
      masked_max(st, mx);
      float m0[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m0[r] = fmaxf(m_run[r], mx[r]);
        alpha[r] = m_run[r] == m0[r] ? 1.0f : __expf(m_run[r] - m0[r]);
        if (qd == 0) max_own[row0 + 8 * r] = m0[r];
      }
      named_barrier_arrive<kSplitConsumers>(kMax0);
      exponentiate(m0, alpha);
      rescale_o(alpha);
      issue_own_values();
      named_barrier<kSplitConsumers>(kMax1);  // warpgroup 1's common maximum m1
      float beta[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m1 = max_other[row0 + 8 * r];
        beta[r] = m1 == m0[r] ? 1.0f : __expf(m0[r] - m1);
        m_run[r] = m1;
        d[r] *= beta[r];
      }
      store_probs(0, beta);
      named_barrier_arrive<kSplitConsumers>(kProbs0);
      wgmma_wait<0>();  // this tile's own values
      fence_accumulators(o);
      mbarrier_arrive(free_bar(0, 0));
      rescale_o(beta);
      named_barrier<kSplitConsumers>(kProbs1);  // P1 stored
      issue_other_values();
      if (st + 1 < steps) {
        // The next scores' first half (kb[0]'s low half, refilled since mid-step) under the
        // shared values; the second half once those are done and kb[1]'s low half is released.
        issue_score_half(st + 1, 0, true);
        wgmma_wait<1>();  // the shared values (committed before the scores)
        fence_accumulators(o);
        mbarrier_arrive(free_bar(1, 0));
        issue_score_half(st + 1, 1, false);
        wgmma_wait<0>();
        fence_accumulators(s);
      } else {
        wgmma_wait<0>();
        fence_accumulators(o);
        mbarrier_arrive(free_bar(1, 0));
      }
    }
  } else {
#pragma unroll 1
    for (int st = 0; st < steps; ++st) {
      issue_scores_of_step(st);
      wgmma_wait<0>();
      fence_accumulators(s);
      float mx[2];
      masked_max(st, mx);
      named_barrier<kSplitConsumers>(kMax0);  // warpgroup 0's m0
      float m1[2], alpha[2], one[2] = {1.0f, 1.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m1[r] = fmaxf(max_other[row0 + 8 * r], mx[r]);
        alpha[r] = m_run[r] == m1[r] ? 1.0f : __expf(m_run[r] - m1[r]);
        if (qd == 0) max_own[row0 + 8 * r] = m1[r];
        m_run[r] = m1[r];
      }
      named_barrier_arrive<kSplitConsumers>(kMax1);
      exponentiate(m1, alpha);
      rescale_o(alpha);
      issue_own_values();
      store_probs(1, one);
      named_barrier_arrive<kSplitConsumers>(kProbs1);
      named_barrier<kSplitConsumers>(kProbs0);  // P0' stored
      issue_other_values();
      wgmma_wait<1>();  // its own values
      mbarrier_arrive(free_bar(1, 1));
      wgmma_wait<0>();
      fence_accumulators(o);
      mbarrier_arrive(free_bar(0, 1));
    }
  }

  // Both warpgroups' denominators at the common maximum, then the output through the key tiles
  // (no product reads them any more once both passed kDoneBarrier).
  if (qd == 0) {
    dens[kWg * kRows + row0] = d[0];
    dens[kWg * kRows + row0 + 8] = d[1];
  }
  named_barrier<kSplitConsumers>(kDoneBarrier);
  float den[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) den[r] = dens[row0 + 8 * r] + dens[kRows + row0 + 8 * r];
  if (splits == 1 && a.out_bf16 != nullptr) {
    const float sink[2] = {sm.sinks()[row0], sm.sinks()[row0 + 8]};
    store_output_bulk<kWg>(a, o, m_run, den, sink, t, h_first, row0, qd, kb_of(0));
    return;
  }
  store_output_staged(a, l, o, m_run, den, t, h_first, kWg, row0, qd, split, splits, kb_of(kWg),
                      kStageFirst + kWg);
}

}  // namespace deepinfer::cuda::attention_wgmma
