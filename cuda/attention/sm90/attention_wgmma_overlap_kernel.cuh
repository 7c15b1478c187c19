// The warp-specialised Hopper attention kernel (DEEPINFER_ATTENTION_KERNEL=wgmma_overlap and its
// variants): its three roles, their synchronisation, the cluster pairs and the persistent walk,
// as the head comment of sm90/attention_wgmma_overlap.cu describes them; that file launches it.
// The roles' steps live beside it: the key buffers' decode (attention_wgmma_overlap_share.cuh,
// attention_wgmma_tiles.cuh), the softmax (attention_wgmma_overlap_softmax.cuh), the output
// (attention_wgmma_overlap_output.cuh), the block's barriers and layout
// (attention_wgmma_overlap_layout.cuh).
#pragma once

#include <cstdint>

#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_keys.cuh"
#include "cuda/attention/sm90/attention_wgmma_merge.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_layout.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_output.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_share.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_softmax.cuh"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/attention/sm90/attention_wgmma_trace.cuh"
#include "cuda/common/ptx_cluster.cuh"
#include "cuda/common/ptx_mbarrier.cuh"

namespace deepinfer::cuda::attention_wgmma {

using OverlapTiles = Tiles<true>;  // 128-byte swizzled tiles only

// Persistent pairs, between units: warpgroup wg stages its rows of unit `done` in its half of
// q's tile and writes them out, then (more: a unit follows) copies its half of unit `next`'s q
// (bf16: the walk takes no other) into that half by cp.async.
__device__ __forceinline__ void output_then_next_query(const AttentionArgs& a,
                                                       const float (&o)[kOAcc],
                                                       const float (&m_run)[2], const float (&d)[2],
                                                       const OverlapUnit& done, bool more,
                                                       const OverlapUnit& next, uint8_t* qs, int wg,
                                                       int row0, int qd) {
  uint8_t* stage = qs + wg * (OverlapLayout::kQBytes / 2);
  stage_output_bf16(a, o, m_run, d, done.h_first, row0, qd, stage, kStageBarrier + wg);
  copy_output_bf16(a, done.t, done.h_first, wg, stage);
  if (!more) return;
  named_barrier<kConsumerThreads / 2>(kStageBarrier + wg);  // the stage read out
  copy_query_bf16<kConsumerThreads / 2, kChunks / 2>(a, next.t, next.h_first, wg * kChunks / 2,
                                                     threadIdx.x & 127, qs);
  cp_async_wait_all();
  fence_async_shared();  // q, for the next unit's wgmma
}

// kPdl: a programmatic dependent launch of the kv rows' encoding (the griddepcontrol
// instructions are only in that instantiation). kMerge: launched in clusters of a token's splits,
// which merge them (AttentionMmaPlan::cluster_merge). kPair: the cluster-pair mode (grid (2 x
// clusters), cluster (2, 1, 1), cluster c taking unit c of OverlapWork; the file's head comment).
// kWalks (pairs over fp8, untraced): each cluster walks units c, c + clusters, ... (persistent;
// the other pair instantiations take one unit per cluster and leave the walk's code out, which
// costs registers). kMerge and kPair exclude each other (one cluster shape). kTrace: records the
// roles' timing into `trace` (attention_wgmma_trace.h; fp8, unmerged only; paired: not the decode
// ablation), leaving out the work that trace.ablate names; the other instantiations ignore `trace`
// and contain no trace code. kIlp: the wgmma_overlap_ilp variant (unmerged, no pdl; unpaired or in
// pairs): the producer's fp8 decode through integer operations (decode_e4m3_chunk: no conversion
// units) and the scorer's softmax without branches, in the key-split kernel's arithmetic
// (softmax_tile64: close to the plain kernel's result, not its bytes), the output staged through
// the free key buffers, or in pairs with bf16 output of one split through q's tile
// (attention_wgmma_overlap_output.cuh).
template <KvFormat kFmt, bool kPdl, bool kMerge, bool kPair, bool kTrace = false, bool kIlp = false,
          bool kWalks = false>
__global__ void __launch_bounds__(kOverlapThreads, 1)
    attention_wgmma_overlap_kernel(AttentionArgs a, DeviceLayout l, OverlapWork w,
                                   OverlapTraceBuffer trace) {
  static_assert(kFmt == KvFormat::kBf16 || kFmt == KvFormat::kFp8, "bf16 rows or fp8 records");
  static_assert(!(kMerge && kPair), "one cluster shape: the splits' or the pair's");
  static_assert(!(kTrace && kMerge), "traced: unmerged");
  static_assert(!(kIlp && (kMerge || kPdl)), "ilp: unmerged, no pdl");
  static_assert(!kPair || kIlp, "the pairs run the ilp variant");
  static_assert(!kTrace || kFmt == KvFormat::kFp8, "the trace's producer events are fp8's");
  static_assert(!kWalks || (kPair && kFmt == KvFormat::kFp8 && !kTrace),
                "the untraced pairs over fp8 walk units");
  static_assert(kMergeSmemBytes <= OverlapLayout::kPBytes * 2, "the merge's scratch in P's place");
  // The combine (a programmatic dependent launch of this grid) may start: it waits for this grid
  // to end before it reads anything.
  if constexpr (kPdl) let_dependents_launch();
  extern __shared__ int4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  using L = OverlapLayout;
  uint8_t* qs = smem + L::kQOff;
  // The swizzle is of absolute address bits: the tiles must start at multiples of 1 KB.
  if ((smem_addr(smem) & 1023u) != 0) __trap();
  auto kb_of = [&](int b) { return smem + L::kKbOff + b * L::kKbBytes; };
  auto ps_of = [&](int b) { return smem + L::kPOff + b * L::kPBytes; };
  auto valid_of = [&](int b) { return reinterpret_cast<int*>(smem + L::kValidOff) + b * kKeys; };
  auto alpha_of = [&](int b) { return reinterpret_cast<float*>(smem + L::kAlphaOff) + b * kRows; };
  float* rows_m = reinterpret_cast<float*>(smem + L::kRowsOff);
  float* rows_d = rows_m + kRows;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int wg = tid >> 7;
  // Trace builds: each role's first thread clears its events; the scorer's keeps the header.
  const OverlapTraceRecorder<kTrace> rec(trace, tid);
  const int ablate = kTrace ? trace.ablate : 0;
  if constexpr (kTrace) {
    if (wg == 0) {
      rec.header_clock(kTraceClockStart);
      rec.header_timer(kTraceTimerStart);
      rec.header(kTraceSm, trace_smid());
    }
    rec.clear(wg == 2   ? kProducerTop
              : wg == 0 ? kScorerTop
                        : kValueTop,
              wg == 2   ? kScorerTop
              : wg == 0 ? kValueTop
                        : kOverlapTraceEvents);
  }

  // Pair mode: this block's mbarriers (full[b]: both producers' threads arrive once per tile of
  // buffer b; empty[b]: each warp of both blocks' consumers once), their shared::cluster
  // addresses here and in the peer, and the start rendezvous (its wait comes before any remote
  // access; every thread of both blocks passes it once, and once more at the end).
  const uint32_t bar_base = smem_addr(smem + L::kBarOff);
  uint32_t rank = 0;
  uint32_t bar_local = 0;
  uint32_t bar_peer = 0;
  if constexpr (kPair) {
    if (tid == 0) {
      uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBarOff);
      for (int b = 0; b < 2; ++b) {
        mbarrier_init(bars + b, kPairFullArrivals);
        mbarrier_init(bars + 2 + b, kPairEmptyArrivals);
      }
      mbarrier_init_fence();
    }
    cluster_arrive_release();
    rank = cluster_block_rank();
    bar_local = map_shared_to_rank(bar_base, rank);
    bar_peer = map_shared_to_rank(bar_base, rank ^ 1u);
  }
  auto full_bar = [&](int b) { return static_cast<uint32_t>(8 * b); };
  auto empty_bar = [&](int b) { return static_cast<uint32_t>(8 * (2 + b)); };
  // empty[b] in this block and the peer: the consumer's wgmma reads of the buffer completed
  // (wgmma.wait_group), so the arrival only signals (CTA-scope release, as CUTLASS's cluster
  // pipelines release a stage); a cluster-scope release cost the value warpgroup ~1,100 cycles
  // per tile (its release step 1,296 -> 171 cycles, session 21's trace).
  auto arrive_both = [&](uint32_t off) {
    mbarrier_arrive_remote(bar_local + off);
    mbarrier_arrive_remote(bar_peer + off);
  };
  // Every thread of both blocks once at the end, so no block exits while its peer may still
  // store into its buffers or arrive on its mbarriers.
  auto pair_finish = [&]() {
    if constexpr (kPair) {
      cluster_arrive_release();
      cluster_wait_acquire();
    }
  };

  // The units of work: unpaired, the block's (token, head group, split); pair mode, cluster
  // blockIdx.x / 2 walks units of w (OverlapWork), this block the head group of its rank. Both
  // blocks of a pair have the same token and split: the same range and number of tiles. keys,
  // range and tiles are the current unit's (next_unit moves them on).
  const int unit_first = kPair ? static_cast<int>(blockIdx.x >> 1) : 0;
  const int unit_step = kPair ? w.clusters : 1;
  const int unit_end = kPair ? w.units : 1;
  const int splits = kPair ? w.splits : static_cast<int>(gridDim.z);
  auto unit_at = [&](int u) {
    if constexpr (kPair) {
      const int rest = u / w.tokens;
      return OverlapUnit{u % w.tokens, (2 * (rest % w.head_pairs) + static_cast<int>(rank)) * kRows,
                         rest / w.head_pairs};
    } else {
      return OverlapUnit{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y) * kRows,
                         static_cast<int>(blockIdx.z)};
    }
  };
  // The pairs stage bf16 output of one split through q's tile (a walking cluster's key buffers
  // may hold the next unit's tiles by then); other outputs go through the key buffers, which
  // only a cluster per unit leaves free (the launch sees to it).
  const bool stage_in_q = kPair && a.out_bf16 != nullptr && splits == 1;
  if (w.clusters < w.units && !(kWalks && stage_in_q && a.q_bf16 != nullptr)) __trap();
  OverlapUnit unit = unit_at(unit_first);
  AttentionKeys keys(a, l, unit.t, seq_of_row_warp(l, unit.t));
  KeyRange range = split_key_range<kKeys>(keys.n_keys, unit.split, splits);
  auto tiles_of = [](const KeyRange& r) {
    return static_cast<int>((r.end - r.begin + kKeys - 1) / kKeys);
  };
  int tiles = tiles_of(range);
  auto next_unit = [&](int u) {  // the producer's
    unit = unit_at(u);
    keys = AttentionKeys(a, l, unit.t, seq_of_row_warp(l, unit.t));
    range = split_key_range<kKeys>(keys.n_keys, unit.split, splits);
    tiles = tiles_of(range);
  };
  auto tiles_at = [&](int u) {  // the consumers' (they keep no unit's keys)
    const OverlapUnit n = unit_at(u);
    const AttentionKeys k(a, l, n.t, seq_of_row_warp(l, n.t));
    return tiles_of(split_key_range<kKeys>(k.n_keys, n.split, splits));
  };
  if constexpr (kTrace) {
    if (wg == 0) {
      rec.header(kTraceTiles, tiles);
      rec.header_clock(kTraceClockKeys);
    }
  }

  if (wg == 2) {
    // Producer role: key `key` of each tile, chunks kParts i + part; lanes 8k .. 8k + 7 hold 8
    // consecutive keys (conflict-free swizzled stores). Unpaired: 2 threads per key, all 64
    // keys; pair mode: 4 threads per key, the block's 32 keys 32 rank .. + 31.
    constexpr int kParts = kPair ? kQuarterParts : 2;
    const int pt = tid - kConsumerThreads;
    const int key = kPair ? static_cast<int>(rank) * kPairKeys + (pt & 7) + 8 * (pt >> 5)
                          : (pt & 7) + 8 * (pt >> 4);
    const int part = kPair ? (pt >> 3) & 3 : (pt >> 3) & 1;
    auto index_at = [&](int i) {
      return key_index(a, l, keys, range.begin + int64_t{kKeys} * i + key, range.end);
    };
    auto lookup = [&](KeyIndex k) { return key_lookup(a, l, keys, k); };
    // The key's address pipeline (attention_wgmma_keys.cuh), at the top of tile i: src_next is
    // tile i + 1's row, src_ahead tile i + 2's, looked tile i + 3's (its block-table load in
    // flight), index tile i + 4's (its top-k load in flight). Each advance looks at what landed
    // during the tile before it. Tile i + 2's row is prefetched into L2 once it is known (the
    // end of tile i), a whole tile before its loads (the end of tile i + 1): the register half
    // holds one tile, so without it a tile's loads wait for DRAM while nothing else is in flight.
    KeyIndex index{nullptr, 0, false};
    KeyLookup looked{nullptr, 0, 0, false};
    const uint8_t* src_next = nullptr;
    const uint8_t* src_ahead = nullptr;
    constexpr int kRowBytes =
        kFmt == KvFormat::kFp8 ? kWgmmaPrefetchRecordBytes : kWgmmaAttnDim * 2;
    auto start_addresses = [&]() {  // tile 0's row; tiles 1..4 in the pipeline
      const KeyIndex k0 = index_at(0);
      const KeyIndex k1 = index_at(1);
      const KeyIndex k2 = index_at(2);
      const KeyIndex k3 = index_at(3);
      index = index_at(4);
      const KeyLookup l0 = lookup(k0);
      const KeyLookup l1 = lookup(k1);
      const KeyLookup l2 = lookup(k2);
      looked = lookup(k3);
      src_next = key_row(a, l1);
      src_ahead = key_row(a, l2);
      return key_row(a, l0);
    };
    auto advance_addresses = [&](int i) {  // at the end of tile i, once tile i + 1's loads went
      prefetch_row_l2<kParts>(src_ahead, kRowBytes, part);
      src_next = src_ahead;
      src_ahead = key_row(a, looked);
      looked = lookup(index);
      index = index_at(i + 5);
    };
    if constexpr (kPair) {
      PairQuarter<kFmt> share{};  // a masked key decodes defined bytes, then drops them
      bool share_real = false;
      uint32_t kb_peer = 0;
      uint32_t valid_peer = 0;
      int g = 0;  // the cluster's tiles so far: tile g in buffer g & 1, phase (g / 2) & 1
#pragma unroll 1
      for (int u = unit_first;;) {
        // The unit's first keys: after the previous unit's last tile went, so their addresses
        // and records land while the consumers finish that unit.
        if (tiles > 0) {
          const uint8_t* src0 = start_addresses();
          if constexpr (kTrace) {  // as unpaired
            trace_wait_for(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src0)));
            rec.header_clock(kTraceClockProducerAddresses);
          }
          load_quarter(share, src0, part);
          share_real = src0 != nullptr;
          prefetch_row_l2<kParts>(src_next, kRowBytes, part);
        }
        if (u == unit_first) {
          named_barrier<kOverlapThreads>(kStartBarrier);
          cluster_wait_acquire();  // the peer runs, its mbarriers are initialised
          warpgroup_regs_dec<kProducerRegs>();
          kb_peer = map_shared_to_rank(smem_addr(kb_of(0)), rank ^ 1u);
          valid_peer = map_shared_to_rank(smem_addr(valid_of(0)), rank ^ 1u);
        }
#pragma unroll 1
        for (int i = 0; i < tiles; ++i, ++g) {
          const int b = g & 1;
          rec.stamp(kProducerTop, i);
          // Tile g - 2 consumed in both blocks (the (g / 2 - 1)-th phase of empty[b]).
          if (g >= 2) mbarrier_wait_cluster(bar_base + empty_bar(b), ((g >> 1) - 1) & 1);
          rec.stamp(kProducerFree, i);
          if constexpr (kTrace) trace_wait_for(fp8_share_digest(share));
          rec.stamp(kProducerLanded, i);
          const PairKeyBuffer buf{
              kb_of(b), valid_of(b), kb_peer + static_cast<uint32_t>(b * L::kKbBytes),
              valid_peer + static_cast<uint32_t>(b * kKeys * sizeof(int)), bar_peer + full_bar(b)};
          store_quarter(buf, share, share_real, key, part);
          fence_async_shared();  // this block's copy of the half tile, for its wgmma
          // The (g / 2)-th phase of this block's full[b]: its producer threads arrive, the first
          // also arming the bytes the peer's producers store into it.
          if (pt == 0) {
            mbarrier_arrive_expect_tx_at(bar_base + full_bar(b), kPairPeerBytes);
          } else {
            mbarrier_arrive_at(bar_base + full_bar(b));
          }
          rec.stamp(kProducerPublished, i);
          if (i + 1 < tiles && !(ablate & kAblateLoads)) {
            load_quarter(share, src_next, part);
            share_real = src_next != nullptr;
            advance_addresses(i);
          }
          rec.stamp(kProducerIssued, i);
        }
        u += unit_step;
        if (!kWalks || u >= unit_end) break;
        next_unit(u);
      }
      if constexpr (kTrace) rec.header_clock(kTraceClockProducerEnd);
      pair_finish();
    } else if constexpr (kFmt == KvFormat::kFp8) {
      Fp8Half half;
      // A masked key decodes (kIlp) or digests (kTrace) defined bytes, then drops them.
      if constexpr (kIlp || kTrace) half = Fp8Half{};
      bool half_real = false;
      if (tiles > 0) {
        const uint8_t* src0 = start_addresses();
        if constexpr (kTrace) {  // once tile 0's row is known (its block-table entry landed)
          trace_wait_for(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src0)));
          rec.header_clock(kTraceClockProducerAddresses);
        }
        // A sliding key may be one of this call's kv rows: the encoding's output.
        if constexpr (kPdl) wait_for_previous_grid();
        load_fp8_half(half, src0, part);
        half_real = src0 != nullptr;
        prefetch_row_l2<kParts>(src_next, kRowBytes, part);  // tile 1 while tile 0 lands
      }
      named_barrier<kOverlapThreads>(kStartBarrier);
      warpgroup_regs_dec<kProducerRegs>();
#pragma unroll 1
      for (int i = 0; i < tiles; ++i) {
        const int b = i & 1;
        rec.stamp(kProducerTop, i);
        if (i >= 2) named_barrier<kOverlapThreads>(kTileEmpty + b);  // tile i - 2 consumed
        rec.stamp(kProducerFree, i);
        if constexpr (kTrace) trace_wait_for(fp8_share_digest(half));
        rec.stamp(kProducerLanded, i);
        if (!(ablate & kAblateDecode)) {
          decode_fp8_half<kIlp>(kb_of(b), valid_of(b), half, half_real, key, part);
        }
        fence_async_shared();  // the tile, for wgmma
        named_barrier_arrive<kConsumerThreads>(kTileFull + b);
        rec.stamp(kProducerPublished, i);
        // Tile i + 1's records land while tile i is consumed.
        if (i + 1 < tiles && !(ablate & kAblateLoads)) {
          load_fp8_half(half, src_next, part);
          half_real = src_next != nullptr;
          advance_addresses(i);
        }
        rec.stamp(kProducerIssued, i);
      }
      if constexpr (kTrace) rec.header_clock(kTraceClockProducerEnd);
    } else {
      if (tiles > 0) {
        const uint8_t* src0 = start_addresses();
        if constexpr (kPdl) wait_for_previous_grid();  // as for fp8
        copy_bf16_half(kb_of(0), valid_of(0), src0, key, part);
        prefetch_row_l2<kParts>(src_next, kRowBytes, part);
      }
      named_barrier<kOverlapThreads>(kStartBarrier);
      warpgroup_regs_dec<kProducerRegs>();
#pragma unroll 1
      for (int i = 0; i < tiles; ++i) {
        const int b = i & 1;
        cp_async_wait_all();
        fence_async_shared();  // this thread's copies and zero rows of tile i, for wgmma
        named_barrier_arrive<kConsumerThreads>(kTileFull + b);
        if (i + 1 < tiles) {  // tile i + 1's rows fly while tile i is consumed
          if (i + 1 >= 2) named_barrier<kOverlapThreads>(kTileEmpty + (b ^ 1));  // tile i - 1
          copy_bf16_half(kb_of(b ^ 1), valid_of(b ^ 1), src_next, key, part);
          advance_addresses(i);
        }
      }
    }
    return;
  }

  // Consumers: q first (all 256 threads) into its tile, bf16 q as it is, f32 q rounded (not in
  // a walk: the launch walks with bf16 q only).
  if (kWalks || a.q_bf16 != nullptr) {
    copy_query_bf16<kConsumerThreads, kChunks>(a, unit.t, unit.h_first, 0, tid, qs);
    cp_async_wait_all();
  } else {
    float4 q_loads[kQueryLoads];
    issue_query_loads(a, unit.t, unit.h_first, tid, q_loads);
    store_query_tile<true>(qs, tid, q_loads);
  }
  if constexpr (kTrace) {
    if (wg == 0) rec.header_clock(kTraceClockQuery);
  }
  fence_async_shared();  // q, for wgmma
  named_barrier<kOverlapThreads>(kStartBarrier);
  if constexpr (kPair) cluster_wait_acquire();  // the start rendezvous (see above)
  if constexpr (kTrace) {
    if (wg == 0) rec.header_clock(kTraceClockPrologue);
  }
  // Tile g (the cluster's count; unpaired the block's) in buffer b: published by the producer
  // (pair mode: by both producers, the (g / 2)-th phase of full[b]).
  auto wait_tile = [&](int g, int b) {
    if constexpr (kPair) {
      mbarrier_wait_cluster(bar_base + full_bar(b), (g >> 1) & 1);
      fence_async_shared();  // the peer's asynchronous stores, seen here, for this wgmma
    } else {
      named_barrier<kConsumerThreads>(kTileFull + b);
    }
  };
  // This warpgroup is done with buffer b (its wgmma reads completed): the producer (pair mode:
  // both blocks' producers, one arrival per warp) may rewrite it.
  auto release_tile = [&](int b) {
    if constexpr (kPair) {
      if (lane == 0) arrive_both(empty_bar(b));
    } else {
      named_barrier_arrive<kOverlapThreads>(kTileEmpty + b);
    }
  };
  // The unit after u that some SM starts next (persistent: this cluster's), for the scorer's
  // prefetch into L2: one unit per cluster, the clusters start in unit order as others end.
  auto prefetch_next_unit = [&](int u) {
    if constexpr (kPair) {
      const int next = u + min(w.clusters, max(a.sms / kPairBlocks, 1));
      if (next < unit_end) {
        const OverlapUnit n = unit_at(next);
        prefetch_unit_start(a, n.t, n.h_first, tid, kConsumerThreads / 2);
      }
    } else {
      prefetch_next_block_start(a, tid, kConsumerThreads / 2);
    }
  };
  const int row0 = 16 * ((tid >> 5) & 3) + (lane >> 2);  // the thread's heads: row0, row0 + 8
  const int qd = lane & 3;
  const uint64_t q_desc = OverlapTiles::kmajor(qs);
  float o[kOAcc];

  if (wg == 0) {
    warpgroup_regs_inc<kScorerRegs>();
    int g0 = 0;  // the cluster's tiles before this unit (unpaired: 0)
    int unit_tiles = tiles;
#pragma unroll 1
    for (int u = unit_first;;) {
      const int u_next = u + unit_step;
      const bool more = kWalks && u_next < unit_end;       // the key buffers then hold its tiles
      const int next_tiles = more ? tiles_at(u_next) : 0;  // its loads land during this unit
#pragma unroll
      for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
      float m_run[2] = {-INFINITY, -INFINITY};
      float d_half[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // softmax_tile64's sums
#pragma unroll 1
      for (int i = 0; i < unit_tiles; ++i) {
        const int b = (g0 + i) & 1;  // the key buffer
        const int pb = i & 1;        // P's (the unit's own)
        rec.stamp(kScorerTop, i);
        wait_tile(g0 + i, b);
        rec.stamp(kScorerFull, i);
        float s[32];
        issue_scores64(s, q_desc, OverlapTiles::kmajor(kb_of(b)));
        if (i > 0) {
          wgmma_wait<1>();  // the values of tile i - 1 (committed before the scores)
          fence_accumulators(o);
          if (i + 1 < unit_tiles || more) release_tile(b ^ 1);
        }
        rec.stamp(kScorerPrevValues, i);
        wait_products(s);
        rec.stamp(kScorerScores, i);
        if (i >= 2) named_barrier<kConsumerThreads>(kProbsFree + pb);  // warpgroup 1 read P[pb]
        rec.stamp(kScorerProbsFree, i);
        float alpha[2] = {1.0f, 1.0f};
        if (!(ablate & kAblateSoftmax)) {
          softmax_tile64<kIlp>(s, valid_of(b), ps_of(pb), alpha_of(pb), a.scale, row0, qd, m_run,
                               d_half, alpha);
        }
        fence_async_shared();  // P, for both warpgroups' wgmma
        named_barrier_arrive<kConsumerThreads>(kProbsReady + pb);
        rec.stamp(kScorerPublished, i);
        if (!(ablate & kAblateValues)) {
          issue_values<true>(o, alpha, OverlapTiles::kmajor(ps_of(pb)),
                             OverlapTiles::nmajor(kb_of(b) + OverlapTiles::value_channels(0)));
        } else {
          wgmma_fence();
          wgmma_commit();
        }
        // kIlp: three tiles before the end (while its products run), the next unit's q and
        // top-k row into L2, so that its prologue does not wait for DRAM. Not traced: in the
        // traced instantiation the addresses spill the scorer's registers.
        if (kIlp && !kTrace && i == max(unit_tiles - 3, 0)) prefetch_next_unit(u);
        rec.stamp(kScorerIssued, i);
      }
      rec.header_clock(kTraceClockLoopEnd);
      wait_products(o);  // also with no tiles: an unconditional wait lets ptxas see O settled
      if (more && unit_tiles > 0) release_tile((g0 + unit_tiles - 1) & 1);
      rec.header_clock(kTraceClockValuesDone);
      const float d[2] = {softmax_row_sum<kIlp>(d_half, 0), softmax_row_sum<kIlp>(d_half, 1)};
      if (qd == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          rows_m[row0 + 8 * r] = m_run[r];
          rows_d[row0 + 8 * r] = d[r];
        }
      }
      named_barrier_arrive<kConsumerThreads>(kRowsReady);
      const OverlapUnit this_unit = unit_at(u);
      if constexpr (kIlp) {
        named_barrier<kConsumerThreads>(kOutputBarrier);  // both warpgroups' products done
        rec.header_clock(kTraceClockOutputReady);
        if (stage_in_q) {
          output_then_next_query(a, o, m_run, d, this_unit, more, unit_at(u_next), qs, 0, row0, qd);
        } else {
          store_output_staged(a, l, o, m_run, d, this_unit.t, this_unit.h_first, 0, row0, qd,
                              this_unit.split, splits, kb_of(0), kStageBarrier + 0);
        }
      } else {
        store_output(a, l, o, m_run, d, this_unit.t, this_unit.h_first, 0, row0, qd,
                     this_unit.split, splits);
      }
      rec.header_clock(kTraceClockEnd);
      rec.header_timer(kTraceTimerEnd);
      if constexpr (kMerge) {
        merge_cluster_splits<kConsumerThreads, kMergeBarrier>(
            a, l, this_unit.t, this_unit.h_first, tid, reinterpret_cast<float*>(smem + L::kPOff));
      }
      if (!more) break;
      // Both halves of the next unit's q stored (this warpgroup's fenced above).
      named_barrier<kConsumerThreads>(kQueryReady);
      g0 += unit_tiles;
      unit_tiles = next_tiles;
      u = u_next;
    }
    pair_finish();
    return;
  }

  // Warpgroup 1: the values over channels 256..511.
  int g0 = 0;
  int unit_tiles = tiles;
#pragma unroll 1
  for (int u = unit_first;;) {
    const int u_next = u + unit_step;
    const bool more = kWalks && u_next < unit_end;
    const int next_tiles = more ? tiles_at(u_next) : 0;
#pragma unroll
    for (int i = 0; i < kOAcc; ++i) o[i] = 0.0f;
#pragma unroll 1
    for (int i = 0; i < unit_tiles; ++i) {
      const int b = (g0 + i) & 1;
      const int pb = i & 1;
      rec.stamp(kValueTop, i);
      named_barrier<kConsumerThreads>(kProbsReady + pb);
      if constexpr (kPair) fence_async_shared();  // the peer's bytes, as the scorer's
      rec.stamp(kValueReady, i);
      const float* alpha_s = alpha_of(pb);
      const float alpha[2] = {alpha_s[row0], alpha_s[row0 + 8]};
      if (!(ablate & kAblateValues)) {
        issue_values<true>(o, alpha, OverlapTiles::kmajor(ps_of(pb)),
                           OverlapTiles::nmajor(kb_of(b) + OverlapTiles::value_channels(1)));
      }
      wait_products(o);
      rec.stamp(kValueDone, i);
      if (i + 2 < unit_tiles) named_barrier_arrive<kConsumerThreads>(kProbsFree + pb);
      if (i + 2 < unit_tiles || more) release_tile(b);
    }
    named_barrier<kConsumerThreads>(kRowsReady);
    const float m_run[2] = {rows_m[row0], rows_m[row0 + 8]};
    const float d[2] = {rows_d[row0], rows_d[row0 + 8]};
    const OverlapUnit this_unit = unit_at(u);
    if constexpr (kIlp) {
      named_barrier<kConsumerThreads>(kOutputBarrier);  // both warpgroups' products done
      if (stage_in_q) {
        output_then_next_query(a, o, m_run, d, this_unit, more, unit_at(u_next), qs, 1, row0, qd);
      } else {
        store_output_staged(a, l, o, m_run, d, this_unit.t, this_unit.h_first, 1, row0, qd,
                            this_unit.split, splits, kb_of(1), kStageBarrier + 1);
      }
    } else {
      store_output(a, l, o, m_run, d, this_unit.t, this_unit.h_first, 1, row0, qd, this_unit.split,
                   splits);
    }
    rec.header_clock(kTraceClockValueEnd);
    if constexpr (kMerge) {
      merge_cluster_splits<kConsumerThreads, kMergeBarrier>(
          a, l, this_unit.t, this_unit.h_first, tid, reinterpret_cast<float*>(smem + L::kPOff));
    }
    if (!more) break;
    named_barrier_arrive<kConsumerThreads>(kQueryReady);  // its half of the next q stored
    g0 += unit_tiles;
    unit_tiles = next_tiles;
    u = u_next;
  }
  pair_finish();
}

}  // namespace deepinfer::cuda::attention_wgmma
