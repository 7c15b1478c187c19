// The key-split variant of the Hopper attention kernel (DEEPINFER_ATTENTION_KERNEL=
// wgmma_keysplit; sm_90a only; bf16 rows). In the overlap kernel (attention_wgmma_overlap.cu) one
// warpgroup scores every key and runs the softmax while the tensor cores wait for it; here the
// two consumer warpgroups take turns instead, each scoring its own 64 keys of every 128-key step,
// so that one's softmax runs under the other's products (the scheme of FlashMLA's SM90 sparse
// prefill, written here over this file's own barriers and tiles). Per block: 64 heads of one
// token and one key split; 384 threads.
//  - warpgroup 2, the producer (88 registers): resolves the keys of a step (two 64-key tiles) a
//    step ahead (attention_wgmma_keys.cuh) and copies their bf16 rows by cp.async into two
//    128-byte-swizzled tiles kb[0], kb[1], zero-filling masked keys, each tile in two channel
//    halves (0..255, 256..511) with their own barriers, in the order the consumers free them;
//    a copy's completion arrives on the half's mbarrier by itself (cp.async.mbarrier.arrive), so
//    the producer never waits for its loads.
//  - warpgroup 0 (208 registers) scores kb[0], warpgroup 1 kb[1]: S = q K^T, 64 heads x 64 keys.
//    Both own O's rows; warpgroup 0 its channels 0..255, warpgroup 1 256..511. A step:
//      w0: m0 = max(m, its rows' max); P0 = exp(S0 - m0); O0 = O0 a0 + P0 V0[:, 0:256]
//          (P0 from registers)                       | w1: waits for m0; m1 = max(m0, its max);
//                                                    |     P1 = exp(S1 - m1), to shared memory;
//                                                    |     O1 = O1 a1 + P1 V1[:, 256:512]
//      w0: waits for m1; P0 exp(m0 - m1) to shared   |
//          memory; O0 = O0 exp(m0 - m1) + P1 V1[:, 0:256]   | w1: O1 += P0' V0[:, 256:512]
//      w0: next S0 while its values run             | w1: next S1 once kb[1] is refilled
//    so both end a step at the common maximum m1, which is the next step's running maximum.
//    Each keeps the denominator of its own keys; the two are added at the end.
//  - the output, once both warpgroups are past their last products: in bf16 with one split (the
//    engine's call) staged through the key tiles and written by bulk copies (store_output_bulk);
//    otherwise as the overlap kernel's ilp variant (attention_wgmma_overlap_output.cuh), with
//    splits the partial rows and (max, denominator) for the combine.
// The arithmetic is the other wgmma kernels' (bf16 q, keys and P, f32 products, softmax and
// sums), in another order and with e^x as 2^(x log2(e)) folded into one FFMA per score:
// warpgroup 0's own probabilities are rounded to bf16 before the rescale to m1, the shared copy
// after it. So the result is close to theirs, not their bytes
// (tests/gpu/cpp/test_attention_wgmma_keysplit.cpp). Measured on the H200 (benchmarks/RESULTS.md,
// session 25): a bf16 prefill chunk of 4,096 queries at 64 heads 892.7 us against the ilp
// kernel's 1,034.4 and FlashMLA's 651.6 (695.3 back to back); decode is slower than the ilp
// kernel (B = 256: 102.5 against 88.8 us: its one buffer per tile exposes each step's DRAM loads).
//
// Synchronisation. mbarriers between the producer and the consumers, per tile b and channel half
// h: ready[b][h] (the 128 producer threads' copies landed, one phase per step) and free[b][h] (the
// one warpgroup that reads that half last arrives, 128 threads: kb[0] low by warpgroup 0 after its
// own values, kb[1] high by warpgroup 1 after its own, kb[0] high by warpgroup 1 and kb[1] low by
// warpgroup 0 after the shared ones; each later than its tile's scores, which precede the softmax
// the other warpgroup waited for); flags[b] (the producer's valid flags of tile b, written after
// free[b] of the tile's owner for the previous step, whose masking came before). Named barriers
// between the consumers, each arrived by one warpgroup and synced by the other once per step:
// kMax0 (m0 written), kMax1 (m1), kProbs0 (P0' stored), kProbs1 (P1 stored). Neither warpgroup
// arrives twice on one before the other synced it: each next arrival comes after a wait that the
// other's sync precedes (w0 syncs kMax1 after arriving kMax0; w1 arrives kMax1 only after syncing
// kMax0 and, a step later, only after its shared values of the step before completed, so
// P0's tile and m0's row are free when w0 rewrites them).
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "cuda/attention/attention_keys.cuh"
#include "cuda/attention/sm90/attention_wgmma_keys.cuh"
#include "cuda/attention/sm90/attention_wgmma_keysplit.h"
#include "cuda/attention/sm90/attention_wgmma_overlap_output.cuh"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"

namespace deepinfer::cuda {

namespace attention_wgmma {
namespace {

using T = Tiles<true>;

constexpr int kSplitThreads = 384;
constexpr int kSplitConsumers = 256;
constexpr int kSplitProducerThreads = 128;
constexpr int kSplitConsumerRegs = 208;
constexpr int kSplitProducerRegs = 88;
static_assert(2 * kSplitConsumerRegs + kSplitProducerRegs == 3 * 168,
              "setmaxnreg moves registers between the warpgroups, the total stays the block's");
constexpr int kStepKeys = 2 * kKeys;              // a step: a 64-key tile per consumer warpgroup
constexpr int kHalfBytes = kKeys * kHalfDim * 2;  // a tile's channel half: 32 KB

enum KeySplitBarrier : int {
  kQueryBarrier = 1,  // both consumers: q's tile stored
  kMax0 = 2,
  kMax1 = 3,
  kProbs0 = 4,
  kProbs1 = 5,
  kDoneBarrier = 6,  // both consumers past their last products, denominators exchanged
  kStageFirst = 7,   // + warpgroup: its rows staged (store_output_staged)
};

// Shared memory: q, the two key tiles, P0' and P1, the flags, the maxima and denominators
// exchanged, the mbarriers.
struct KeySplitLayout {
  static constexpr size_t kQBytes = size_t{kRows} * kDim * 2;
  static constexpr size_t kKbBytes = size_t{kKeys} * kDim * 2;
  static constexpr size_t kPBytes = size_t{kRows} * kKeys * 2;
  static constexpr size_t kQOff = 0;
  static constexpr size_t kKbOff = kQOff + kQBytes;  // tile b at kKbOff + b * kKbBytes
  static constexpr size_t kPOff = kKbOff + 2 * kKbBytes;
  static constexpr size_t kFlagsOff = kPOff + 2 * kPBytes;                // int [2][kKeys]
  static constexpr size_t kMaxOff = kFlagsOff + 2 * kKeys * sizeof(int);  // float [2][kRows]
  static constexpr size_t kDenOff = kMaxOff + 2 * kRows * sizeof(float);  // float [2][kRows]
  static constexpr size_t kBarOff = kDenOff + 2 * kRows * sizeof(float);
  // ready[2][2], free[2][2], flags[2]
  static constexpr int kBars = 10;
  static constexpr size_t kBytes = kBarOff + kBars * sizeof(uint64_t);
  static_assert(kKbOff % 1024 == 0 && kPOff % 1024 == 0 && kPBytes % 1024 == 0,
                "1 KB aligned tiles");
  static_assert(kFlagsOff % 8 == 0 && kBarOff % 8 == 0, "aligned flags and mbarriers");
  static_assert(kBytes <= 227 * 1024, "fits Hopper's opt-in shared memory per block");
};

constexpr float kLog2E = 1.4426950408889634f;

// 2^x by the MUFU (ex2.approx.ftz: about 2 ulp; 2^-inf = 0), as __expf computes e^x after its
// multiply by log2(e).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The layout's regions and mbarriers at a block's shared memory `base`.
struct KeySplitSmem {
  uint8_t* base;
  using L = KeySplitLayout;
  __device__ uint8_t* q() const { return base + L::kQOff; }
  __device__ uint8_t* kb(int b) const { return base + L::kKbOff + b * L::kKbBytes; }
  __device__ uint8_t* ps(int b) const { return base + L::kPOff + b * L::kPBytes; }
  __device__ int* flags() const { return reinterpret_cast<int*>(base + L::kFlagsOff); }
  __device__ float* maxes() const { return reinterpret_cast<float*>(base + L::kMaxOff); }
  __device__ float* dens() const { return reinterpret_cast<float*>(base + L::kDenOff); }
  __device__ uint64_t* bar(int i) const {
    return reinterpret_cast<uint64_t*>(base + L::kBarOff) + i;
  }
  // ready[b][h], free[b][h], flags[b]: L::kBars in all.
  __device__ uint64_t* ready_bar(int b, int h) const { return bar(2 * b + h); }
  __device__ uint64_t* free_bar(int b, int h) const { return bar(4 + 2 * b + h); }
  __device__ uint64_t* flags_bar(int b) const { return bar(8 + b); }
};

// The producer's share of a step: keys kr + 16 i (i < 4) of both tiles, channel chunks sub + 8 k
// of a half.
constexpr int kProducerKeys = 4;

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
                                                  int t, int h_first, int row0, int qd,
                                                  uint8_t* stage) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float f = output_row_factor(m_run[r], d[r], a.sinks[h_first + row]);
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
  const uint64_t q_desc = T::kmajor(qs);
  constexpr int own = kWg;  // the tile this warpgroup scores
  constexpr int other = kWg ^ 1;
  uint8_t* kb_own = kb_of(own);
  const uint64_t k_desc = T::kmajor(kb_own);
  // The channels of O this warpgroup owns, in its own tile and in the other's.
  const uint64_t v_own = T::nmajor(kb_own + T::value_channels(kWg));
  const uint64_t v_other = T::nmajor(kb_of(other) + T::value_channels(kWg));
  const uint64_t p_other = T::kmajor(ps_of(other));
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
      const uint64_t step = T::kmajor_step(ks);
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
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int2 f = *reinterpret_cast<const int2*>(fl + 8 * j + 2 * qd);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool real = (e == 0 ? f.x : f.y) != 0;
        s[4 * j + e] = real ? s[4 * j + e] : -INFINITY;
        s[4 * j + 2 + e] = real ? s[4 * j + 2 + e] : -INFINITY;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));  // the 4 lanes of a row
      // The scale is positive: the maximum of the scaled scores, exactly.
      mx[r] = fmaxf(m, __shfl_xor_sync(kFullMask, m, 2)) * a.scale;
    }
  };
  // P = exp(scale S - m) as 2^(S scale log2(e) - m log2(e)), one FFMA and one MUFU per score
  // (0 where m is -inf: no real key yet, every score -inf), its row sums added to d after d is
  // rescaled by alpha.
  const float scale_log2 = a.scale * kLog2E;
  auto exponentiate = [&](const float(&m)[2], const float(&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_log2 = m[r] == -INFINITY ? 0.0f : m[r] * kLog2E;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s[4 * j + 2 * r] = exp2_approx(fmaf(s[4 * j + 2 * r], scale_log2, -m_log2));
        s[4 * j + 2 * r + 1] = exp2_approx(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_log2));
        sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      }
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
      wgmma_m64n256k16_bf16_rn(o, frag[ks], v_own + T::nmajor_step(ks), true);
    }
    wgmma_commit();
  };
  // O += P' V with the other warpgroup's probabilities from shared memory.
  auto issue_other_values = [&]() {
    fence_accumulators(o);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma_m64n256k16_bf16_kn(o, p_other + T::kmajor_step(ks), v_other + T::nmajor_step(ks), true);
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
        *reinterpret_cast<uint32_t*>(ps + T::offset(row0 + 8 * r, j) + 4 * qd) =
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
    store_output_bulk<kWg>(a, o, m_run, den, t, h_first, row0, qd, kb_of(0));
    return;
  }
  store_output_staged(a, l, o, m_run, den, t, h_first, kWg, row0, qd, split, splits, kb_of(kWg),
                      kStageFirst + kWg);
}

__global__ void __launch_bounds__(kSplitThreads, 1)
    attention_wgmma_keysplit_kernel(AttentionArgs a, DeviceLayout l) {
  extern __shared__ int4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  // The swizzle is of absolute address bits: the tiles must start at multiples of 1 KB.
  if ((smem_addr(smem) & 1023u) != 0) __trap();
  const KeySplitSmem sm{smem};
  uint8_t* qs = sm.q();
  auto kb_of = [&](int b) { return sm.kb(b); };
  int* flags = sm.flags();
  auto ready_bar = [&](int b, int h) { return sm.ready_bar(b, h); };
  auto free_bar = [&](int b, int h) { return sm.free_bar(b, h); };
  auto flags_bar = [&](int b) { return sm.flags_bar(b); };

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int wg = tid >> 7;
  const int t = static_cast<int>(blockIdx.x);
  const int h_first = static_cast<int>(blockIdx.y) * kRows;
  const int split = static_cast<int>(blockIdx.z);
  const int splits = static_cast<int>(gridDim.z);
  if (tid == 0) {
    for (int i = 0; i < KeySplitLayout::kBars; ++i) mbarrier_init(sm.bar(i), kSplitProducerThreads);
    mbarrier_init_fence();
  }
  __syncthreads();

  // The token's key list: its dependent loads (position, sequence, context) come after the
  // consumers have issued q's copy, which they wait for anyway.
  auto steps_of = [&](const AttentionKeys& keys) {
    const KeyRange range = split_key_range<kStepKeys>(keys.n_keys, split, splits);
    return static_cast<int>((range.end - range.begin + kStepKeys - 1) / kStepKeys);
  };

  if (wg == 2) {
    warpgroup_regs_dec<kSplitProducerRegs>();
    const AttentionKeys keys(a, l, t);
    const KeyRange range = split_key_range<kStepKeys>(keys.n_keys, split, splits);
    const int steps = static_cast<int>((range.end - range.begin + kStepKeys - 1) / kStepKeys);
    const int p = tid - kSplitConsumers;
    const int kr = p >> 3;  // keys kr + 16 i
    const int sub = p & 7;  // chunks sub + 8 k of a half
    if (p < 32) prefetch_next_block_start(a, p, 32);
    // The rows of step s's keys (null: masked or past the split), resolved a step ahead in the
    // three dependent loads of attention_wgmma_keys.cuh, each issued for all 8 keys at once.
    const uint8_t* rows[2][kProducerKeys];
    auto resolve = [&](int s) {
      KeyIndex ki[2][kProducerKeys];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kProducerKeys; ++i) {
          const int64_t idx = range.begin + int64_t{s} * kStepKeys + b * kKeys + kr + 16 * i;
          ki[b][i] = key_index(a, l, keys, idx, range.end);
        }
      }
      KeyLookup kl[2][kProducerKeys];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kProducerKeys; ++i) kl[b][i] = key_lookup(a, l, keys, ki[b][i]);
      }
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kProducerKeys; ++i) rows[b][i] = key_row(a, kl[b][i]);
      }
    };
    // Tile b's channel half h of this step: 4 keys x 4 chunks per thread (8 consecutive threads
    // one key's 8 consecutive chunks: 8 different 16-byte positions of the swizzle), then the
    // arrival on ready[b][h] when they land.
    auto copy_half = [&](int b, int h) {
      uint8_t* kb = kb_of(b);
#pragma unroll
      for (int i = 0; i < kProducerKeys; ++i) {
        const int key = kr + 16 * i;
        const uint8_t* src = rows[b][i];
        const bool real = src != nullptr;
        const uint8_t* base = real ? src : a.kv;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int c = h * (kChunks / 2) + sub + 8 * k;
          cp_async_16_zfill_l2_256(kb + T::offset(key, c), base + (real ? 16 * c : 0), real);
        }
      }
      cp_async_mbarrier_arrive(ready_bar(b, h));
    };
    auto write_flags = [&](int b) {
      if (sub == 0) {
#pragma unroll
        for (int i = 0; i < kProducerKeys; ++i) {
          flags[b * kKeys + kr + 16 * i] = rows[b][i] != nullptr ? 1 : 0;
        }
      }
      mbarrier_arrive(flags_bar(b));
    };
    if (steps > 0) resolve(0);
#pragma unroll 1
    for (int s = 0; s < steps; ++s) {
      // Phase parity of the consumers' releases of step s - 1 (the first step's pass at once).
      const uint32_t freed = (s & 1) ^ 1;
      mbarrier_wait(free_bar(0, 0), freed);  // warpgroup 0's own values of s - 1 done
      copy_half(0, 0);
      write_flags(0);
      mbarrier_wait(free_bar(1, 1), freed);  // warpgroup 1's own values done
      copy_half(1, 1);
      write_flags(1);
      mbarrier_wait(free_bar(0, 1), freed);  // warpgroup 1's shared values done
      copy_half(0, 1);
      mbarrier_wait(free_bar(1, 0), freed);  // warpgroup 0's shared values done
      copy_half(1, 0);
      if (s + 1 < steps) resolve(s + 1);  // its loads fly while the consumers work
    }
    cp_async_wait_all();  // no copy outlives its thread
    return;
  }

  warpgroup_regs_inc<kSplitConsumerRegs>();
  const int ctid = tid;  // 0..255
  int steps = 0;
  if (a.q_bf16 != nullptr) {
    copy_query_bf16<kSplitConsumers, kChunks>(a, t, h_first, 0, ctid, qs);
    steps = steps_of(AttentionKeys(a, l, t));
    cp_async_wait_all();
  } else {
    float4 q_loads[kQueryLoads];
    issue_query_loads(a, t, h_first, ctid, q_loads);
    store_query_tile<true>(qs, ctid, q_loads);
    steps = steps_of(AttentionKeys(a, l, t));  // (before the stores, q's registers spilled)
  }
  fence_async_shared();  // q, for wgmma
  named_barrier<kSplitConsumers>(kQueryBarrier);

  if (wg == 0) {
    keysplit_consumer<0>(a, l, smem, t, h_first, split, splits, steps);
  } else {
    keysplit_consumer<1>(a, l, smem, t, h_first, split, splits, steps);
  }
}

}  // namespace
}  // namespace attention_wgmma

size_t attention_wgmma_keysplit_smem_bytes() {
  return attention_wgmma::KeySplitLayout::kBytes;
}

void launch_attention_wgmma_keysplit(const AttentionArgs& a, const DeviceLayout& l,
                                     const AttentionMmaPlan& p, int64_t tokens,
                                     KernelSmemLimits& smem_limits, cudaStream_t stream) {
  using attention_wgmma::KeySplitLayout;
  if (a.kvf.format != KvFormat::kBf16 || a.entf.format != KvFormat::kBf16) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the key-split wgmma kernel takes bf16 rows, got a cache of format " +
                    std::to_string(static_cast<int>(a.kvf.format)));
  }
  if (p.splits > 1 && (a.part_acc == nullptr || a.part_md == nullptr)) {
    throw Error(ErrorCode::kInternal,
                "attention: the key-split wgmma kernel's splits need the split outputs");
  }
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(p.head_groups),
                  static_cast<unsigned>(p.splits));
  auto* kernel = attention_wgmma::attention_wgmma_keysplit_kernel;
  smem_limits.allow(kernel, KeySplitLayout::kBytes);
  kernel<<<grid, attention_wgmma::kSplitThreads, KeySplitLayout::kBytes, stream>>>(a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("attention (the key-split wgmma kernel)");
}

}  // namespace deepinfer::cuda
