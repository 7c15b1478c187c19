// The warp-specialised variant of the Hopper attention kernel (DEEPINFER_ATTENTION_KERNEL=
// wgmma_overlap, opt-in; sm_90a only). The prefetching kernel (attention_wgmma_prefetch.cu) runs a
// tile's phases one after another in the same 8 warps (decode, scores, softmax with a max exchange
// between its two warpgroups, probabilities to shared memory, values): at B >= 64 it is latency
// bound (0.36 eligible warps per scheduler; a 64-key tile took ~8 us where its products take ~1.1).
// Here three warpgroups (384 threads) each keep one job, so the phases of neighbouring tiles
// overlap (the kernel: attention_wgmma_overlap_kernel.cuh; this file launches it):
//  - warpgroup 2, the producer (setmaxnreg: 120 registers): decodes V4's fp8 records (held in
//    registers, loaded a tile ahead, prefetched into L2 a tile before that; a key's address
//    resolved over the three tiles before, one dependent load per tile) or copies bf16 rows
//    (cp.async a tile ahead, the same L2 prefetch) into two 128-byte-swizzled key buffers. Its
//    stores are conflict-free: 8 consecutive lanes write one chunk of 8 consecutive keys, 8
//    different 16-byte positions of the swizzle (the prefetching kernel's 4 threads per key wrote 2
//    keys x 4 chunks of one 64-byte half, a 2-way conflict).
//  - warpgroup 0, the scorer (216 registers): S = q K^T for all 64 keys of a tile (m64n64: no max
//    exchange), the online softmax, P and the rescale alpha to shared memory (double-buffered, for
//    warpgroup 1), then O = O alpha + P V over channels 0..255. The values of tile i stay in flight
//    while it waits for and scores tile i + 1.
//  - warpgroup 1 (168 registers): O = O alpha + P V over channels 256..511 as soon as P is there.
// The arithmetic is the prefetching kernel's (bf16 q, keys and P, f32 products and softmax, the
// denominator summed per 32-key half and the halves added at the end, in the same order), so the
// output is meant to be byte-identical to attention_wgmma_kernel's; the one difference is that the
// scores of a tile are one m64n64 product instead of two m64n32 halves
// (tests/gpu/cpp/test_attention_wgmma_overlap.cpp checks both).
//
// For few tokens (DEEPINFER_ATTENTION_KERNEL=wgmma_overlap_pdl / _fused) the same body runs as a
// programmatic dependent launch of the kv rows' encoding (kPdl: the producer resolves its first
// keys' addresses while that grid runs and waits for it before it loads a key; the combine after
// it starts early likewise) and, with kMerge, with a token's splits one cluster that merges them
// (attention_wgmma_merge.cuh) instead of the combine kernel.
//
// Synchronisation: named barriers only (no phases to track), each used by a fixed pair of roles:
//   kTileFull + b   producer arrives (tile decoded into buffer b), scorer syncs       256 threads
//   kTileEmpty + b  scorer and warpgroup 1 arrive once done with buffer b, producer   384 threads
//                   syncs before it rewrites b; only for tiles i with i + 2 < tiles (the tiles
//                   whose buffer is rewritten), so every arrival has its sync
//   kProbsReady + b scorer arrives (P[b], alpha[b] written), warpgroup 1 syncs        256 threads
//   kProbsFree + b  warpgroup 1 arrives (done reading P[b]; again only if i + 2 < tiles), the
//                   scorer syncs before writing P[b] at tile i + 2                    256 threads
//   kRowsReady      scorer arrives (final max and denominator), warpgroup 1 syncs     256 threads
//   kIlp only: kOutputBarrier (both consumer warpgroups sync once, past their last products:
//   the key buffers become the output's stage) and kStageBarrier + wg (each warpgroup's 128
//   threads sync once, rows staged). kTrace adds no synchronisation (timing stamps only).
// No role arrives twice on a barrier before its partner synced (each next arrival needs a sync of
// the partner first), and no wait depends on itself: the scorer releases buffer i - 1 after it has
// synced tile i, which the producer published before it waited for buffer i - 1.
//
// Cluster-pair mode (kPair; DEEPINFER_ATTENTION_KERNEL=wgmma_overlap_pair, opt-in, 128 heads or a
// multiple): the two 64-head blocks of a token and split (head groups 2k, 2k + 1) are one
// cluster (1, 2, 1). Each producer loads and decodes 32 keys of every tile (rank r: keys
// 32r .. 32r + 31, 4 threads per key) and stores them, and their valid flags, into its own
// buffer (plain stores) and the peer's (st.async, each store completing its bytes on the peer's
// full[b], as FlashMLA's paired decode does). The tile handshakes become mbarriers in each block:
//   full[b]   this block's producer threads arrive once per tile (release.cta, after
//             fence.proxy.async), the first arming the kPairPeerBytes the peer's producers
//             store into this block; the phase of tile i (parity (i / 2) & 1) completes when
//             both halves are there. The consumers wait for it (acquire.cluster) and fence the
//             async proxy before their wgmma reads the peer's bytes
//   empty[b]  each consumer warp of both blocks arrives on both blocks' empty[b] when done
//             with buffer b (the same tiles as kTileEmpty's arrivals); a producer waits for the
//             phase of tile i - 2 before writing tile i, so neither overwrites a buffer that a
//             consumer of either block still reads, and no peer store of tile i reaches full[b]
//             before its phase of tile i - 2 completed
// The other barriers stay named and per block. Both blocks have the same key range and number of
// tiles, so every arrival has its wait in both; every thread of both blocks passes a cluster
// barrier once at the start (initialised mbarriers, peer running, before any remote access) and
// once at the end (no block exits while the peer may still store or arrive into it).
//
// Persistent pairs (kWalks: fp8 records, bf16 q, bf16 output of one split, more units than
// clusters fit at once): cluster c walks units c, c + clusters, ... (a unit: a token's 128 heads
// and a split, OverlapWork). The key buffers and their mbarriers count the cluster's tiles g across
// units (buffer g & 1, phase (g / 2) & 1), so the producer goes on to the next unit's addresses and
// first records as soon as its last tile went, and rewrites a buffer once both blocks released
// it: with a unit after, the consumers also release the unit's last two buffers (the scorer the
// last one after its final wait). P, alpha and their named barriers count the unit's own tiles
// (kOutputBarrier ends a unit's use of them). Between units each consumer warpgroup stages its
// rows in its half of q's tile, writes them out, then copies its half of the next unit's q there;
// warpgroup 1 arrives on kQueryReady once its half is stored, which the scorer syncs before the
// next unit's first scores.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm90/attention_wgmma_overlap.h"
#include "cuda/attention/sm90/attention_wgmma_overlap_kernel.cuh"
#include "cuda/attention/sm90/attention_wgmma_overlap_layout.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

namespace attention_wgmma {
namespace {

// p.pdl: a programmatic dependent launch; p.cluster_merge: clusters (1, 1, splits) that merge
// (the kPdl instantiation either way: griddepcontrol.wait returns at once in an ordinary launch).
// p.ilp: the wgmma_overlap_ilp variant (unmerged, no pdl; with p.pair in cluster pairs);
// trace.stamps: the traced instantiation of the plain, the ilp or the pair launch (fp8).
template <KvFormat kFmt>
void launch(const AttentionArgs& a, const DeviceLayout& l, const AttentionMmaPlan& p,
            int64_t tokens, KernelSmemLimits& smem_limits, cudaStream_t stream,
            const OverlapTraceBuffer& trace) {
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(p.head_groups),
                  static_cast<unsigned>(p.splits));
  if (p.cluster_merge) {
    if (p.splits > kWgmmaClusterMergeMaxSplits) {
      throw Error(ErrorCode::kUnsupported,
                  "attention: the overlapping wgmma kernel merges at most " +
                      std::to_string(kWgmmaClusterMergeMaxSplits) + " splits in a cluster, got " +
                      std::to_string(p.splits));
    }
    auto* kernel = attention_wgmma_overlap_kernel<kFmt, true, true, false>;
    smem_limits.allow(kernel, OverlapLayout::kBytes);
    ClusterLaunch cl;
    cl.grid = grid;
    cl.block = dim3(kOverlapThreads);
    cl.cluster = dim3(1, 1, static_cast<unsigned>(p.splits));
    cl.smem = OverlapLayout::kBytes;
    cl.stream = stream;
    cl.pdl = p.pdl;
    launch_clustered("attention (the overlapping wgmma kernel, merging its splits)", cl, kernel, a,
                     l, OverlapWork{}, OverlapTraceBuffer{});
    return;
  }
  if (p.pair) {
    // The ilp instantiation: the plan asks for it with every pair (traced: fp8 only).
    using PairKernel = void (*)(AttentionArgs, DeviceLayout, OverlapWork, OverlapTraceBuffer);
    PairKernel kernel = attention_wgmma_overlap_kernel<kFmt, false, false, true, false, true>;
    if constexpr (kFmt == KvFormat::kFp8) {
      if (trace.stamps != nullptr) {
        kernel = attention_wgmma_overlap_kernel<kFmt, false, false, true, true, true>;
      }
    }
    smem_limits.allow(kernel, OverlapLayout::kPairBytes);
    OverlapWork w;
    w.tokens = static_cast<int>(tokens);
    w.head_pairs = static_cast<int>(p.head_groups / kPairBlocks);
    w.splits = static_cast<int>(p.splits);
    const int64_t units = tokens * w.head_pairs * p.splits;
    if (units <= 0 || units > (int64_t{1} << 30)) {
      throw Error(ErrorCode::kUnsupported,
                  "attention: the overlapping wgmma kernel's cluster pairs take 1 to 2^30 units "
                  "(tokens x head pairs x splits), got " +
                      std::to_string(units));
    }
    w.units = static_cast<int>(units);
    w.clusters = w.units;
    ClusterLaunch cl;
    cl.block = dim3(kOverlapThreads);
    cl.cluster = dim3(kPairBlocks, 1, 1);
    cl.smem = OverlapLayout::kPairBytes;
    cl.stream = stream;
    // Persistent (p.persistent, fp8 records, bf16 q, bf16 output of one split, untraced) where
    // the units outnumber the clusters the device runs at once: that many clusters, each walking
    // its units, so that a unit's start (its keys' addresses and first records) overlaps the
    // previous unit's last tiles. f32 q goes through registers between units, which made the
    // walk slower than a cluster per unit (benchmarks/RESULTS.md, session 23).
    if constexpr (kFmt == KvFormat::kFp8) {
      if (p.persistent && a.q_bf16 != nullptr && a.out_bf16 != nullptr && p.splits == 1 &&
          trace.stamps == nullptr) {
        auto* walking = attention_wgmma_overlap_kernel<kFmt, false, false, true, false, true, true>;
        smem_limits.allow(walking, OverlapLayout::kPairBytes);
        const int fit = smem_limits.max_active_clusters(walking, cl.block, cl.cluster, cl.smem);
        if (fit < w.units) {
          w.clusters = fit;
          kernel = walking;
        }
      }
    }
    cl.grid = dim3(static_cast<unsigned>(kPairBlocks * w.clusters));
    launch_clustered("attention (the overlapping wgmma kernel, cluster pairs)", cl, kernel, a, l, w,
                     trace);
    return;
  }
  using Kernel = void (*)(AttentionArgs, DeviceLayout, OverlapWork, OverlapTraceBuffer);
  Kernel kernel = p.pdl ? attention_wgmma_overlap_kernel<kFmt, true, false, false>
                        : attention_wgmma_overlap_kernel<kFmt, false, false, false>;
  if (p.ilp) kernel = attention_wgmma_overlap_kernel<kFmt, false, false, false, false, true>;
  if constexpr (kFmt == KvFormat::kFp8) {
    if (trace.stamps != nullptr) {
      kernel = p.ilp ? attention_wgmma_overlap_kernel<kFmt, false, false, false, true, true>
                     : attention_wgmma_overlap_kernel<kFmt, false, false, false, true, false>;
    }
  }
  smem_limits.allow(kernel, OverlapLayout::kBytes);
  launch_programmatic("attention's overlapping wgmma kernel", grid, dim3(kOverlapThreads),
                      OverlapLayout::kBytes, stream, p.pdl, kernel, a, l, OverlapWork{}, trace);
}

}  // namespace
}  // namespace attention_wgmma

void launch_attention_wgmma_overlap(const AttentionArgs& a, const DeviceLayout& l,
                                    const AttentionMmaPlan& p, int64_t tokens,
                                    KernelSmemLimits& smem_limits, cudaStream_t stream,
                                    const OverlapTraceBuffer& trace) {
  if (p.pair && (a.heads % (2 * kWgmmaAttnRows) != 0 || p.head_groups % 2 != 0)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the overlapping wgmma kernel's cluster pairs take a multiple of 128 "
                "heads, got " +
                    std::to_string(a.heads) + " heads in " + std::to_string(p.head_groups) +
                    " head groups");
  }
  if ((p.ilp && (p.cluster_merge || p.pdl)) || (p.pair && !p.ilp)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the overlapping wgmma kernel's ilp variant is unmerged and launched "
                "without pdl, and its pairs are the ilp variant's");
  }
  if (trace.stamps != nullptr &&
      (a.kvf.format != KvFormat::kFp8 || p.cluster_merge || p.pdl || trace.ctas < 0)) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the overlapping wgmma kernel's trace takes fp8 records and its plain, "
                "ilp or pair launch (no merge or pdl)");
  }
  if (trace.stamps != nullptr && p.pair && (trace.ablate & kAblateDecode) != 0) {
    throw Error(ErrorCode::kUnsupported,
                "attention: the paired kernel's trace cannot leave out the decode (the peer "
                "waits for its bytes)");
  }
  if (a.kvf.format == KvFormat::kBf16) {
    return attention_wgmma::launch<KvFormat::kBf16>(a, l, p, tokens, smem_limits, stream, trace);
  }
  return attention_wgmma::launch<KvFormat::kFp8>(a, l, p, tokens, smem_limits, stream, trace);
}

}  // namespace deepinfer::cuda
