// The key-split variant of the Hopper attention kernel (DEEPINFER_ATTENTION_KERNEL=
// wgmma_keysplit; sm_90a only; bf16 rows). In the overlap kernel (attention_wgmma_overlap.cu) one
// warpgroup scores every key and runs the softmax while the tensor cores wait for it; here the
// two consumer warpgroups take turns instead, each scoring its own 64 keys of every 128-key step,
// so that one's softmax runs under the other's products (the scheme of FlashMLA's SM90 sparse
// prefill, written here over this file's own barriers and tiles). Per block: 64 heads of one
// token and one key split; 384 threads.
//  - warpgroup 2, the producer (88 registers): resolves the keys of a step (two 64-key tiles),
//    one key per lane, in the three dependent loads of attention_wgmma_keys.cuh spread over the
//    three steps before it, and copies their bf16 rows by cp.async into two 128-byte-swizzled
//    tiles kb[0], kb[1], zero-filling masked keys, each tile in two channel halves (0..255,
//    256..511) with their own barriers, in the order the consumers free them; a copy's
//    completion arrives on the half's mbarrier by itself (cp.async.mbarrier.arrive), so the
//    producer never waits for a load.
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
// session 26): a bf16 prefill chunk of 4,096 queries at 64 heads 742.0 us against the ilp kernel's
// 1,043.8 and FlashMLA's 653.0 (657.4 back to back); decode at B = 256 76.1 against 88.8 us, but
// with splits (B = 64) 44.7 against 42.2: a split's few steps each wait for their keys' loads,
// which the one buffer per tile cannot start earlier.
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
#include "cuda/attention/sm90/attention_wgmma_keysplit_consumer.cuh"
#include "cuda/attention/sm90/attention_wgmma_keysplit_layout.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_output.cuh"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_mbarrier.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/ptx_sm90.cuh"

namespace deepinfer::cuda {

namespace attention_wgmma {
namespace {

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
    // Each lane resolves one key of every step (tile res_b, key res_key: the keys this warp's
    // copying threads take), in the three dependent loads of attention_wgmma_keys.cuh spread over
    // three steps: a step's row from the block-table entry loaded a step before, whose load took
    // the top-k column loaded a step before that. So no load is waited for inside the loop (all
    // three in a row cost the producer about 5,500 cycles a step, longer than the consumers'
    // step: session 26's trace). The copying threads take their keys' rows by shuffles.
    const int res_b = lane >> 4;
    const int res_key = 4 * (p >> 5) + (lane & 3) + 16 * ((lane >> 2) & 3);
    auto index_of = [&](int s) {
      return range.begin + int64_t{s} * kStepKeys + res_b * kKeys + res_key;
    };
    KeyIndex index_ahead[3];
#pragma unroll
    for (int s = 0; s < 3; ++s) index_ahead[s] = key_index(a, l, keys, index_of(s), range.end);
    const KeyLookup lookup0 = key_lookup(a, l, keys, index_ahead[0]);
    KeyLookup lookup_ahead = key_lookup(a, l, keys, index_ahead[1]);  // step s + 1's
    KeyIndex index_next = index_ahead[2];                             // step s + 2's
    const uint8_t* my_row = key_row(a, lookup0);                      // step s's
    // The rows of the step's keys this thread copies: keys kr + 16 i of tile b (null: masked or
    // past the split), from the lanes that resolved them.
    const uint8_t* rows[2][kProducerKeys];
    auto gather_rows = [&]() {
      const auto mine = reinterpret_cast<unsigned long long>(my_row);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kProducerKeys; ++i) {
          rows[b][i] = reinterpret_cast<const uint8_t*>(
              __shfl_sync(kFullMask, mine, (kr & 3) + 4 * i + 16 * b));
        }
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
          cp_async_16_zfill_l2_256(kb + KeySplitTiles::offset(key, c), base + (real ? 16 * c : 0),
                                   real);
        }
      }
      cp_async_mbarrier_arrive(ready_bar(b, h));
    };
    auto write_flags = [&](int b) {
      if (res_b == b) flags[b * kKeys + res_key] = my_row != nullptr ? 1 : 0;
      mbarrier_arrive(flags_bar(b));
    };
#pragma unroll 1
    for (int s = 0; s < steps; ++s) {
      // Phase parity of the consumers' releases of step s - 1 (the first step's pass at once).
      const uint32_t freed = (s & 1) ^ 1;
      gather_rows();
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
      // Each resolution stage a step further (loads issued now are looked at a step later).
      my_row = key_row(a, lookup_ahead);
      lookup_ahead = key_lookup(a, l, keys, index_next);
      index_next = key_index(a, l, keys, index_of(s + 3), range.end);
    }
    cp_async_wait_all();  // no copy outlives its thread
    return;
  }

  warpgroup_regs_inc<kSplitConsumerRegs>();
  const int ctid = tid;  // 0..255
  // The rows' sinks, for the output: loaded with q, as in the epilogue their L2 round trip would
  // hold it up.
  const float sink = ctid < kRows ? a.sinks[h_first + ctid] : 0.0f;
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
  if (ctid < kRows) sm.sinks()[ctid] = sink;
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
