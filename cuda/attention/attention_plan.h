// How the tensor-core attention kernel (sm80/attention_mma.cu) cuts a call into blocks: heads
// per block (its two warp layouts), key splits, and whether the splits are merged inside the
// kernel (the last block of a token's head group combines, "fused") or by the separate combine
// kernel (attention_combine.cu). Plain C++ on host metadata (shapes, the host's bound on the key
// list), so host tests check it (tests/cpp/test_attention_plan.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer::cuda {

// Choices a benchmark or a device run may force (CudaBackend reads DEEPINFER_ATTENTION_COMBINE,
// DEEPINFER_ATTENTION_ROWS and DEEPINFER_ATTENTION_SPLITS at creation; benchmarks set them per
// call). Defaults: the fused combine and the cost model's rows and splits.
struct AttentionMmaChoice {
  // true: the combine fused into the split kernel (opt-in, DEEPINFER_ATTENTION_COMBINE=fused: on
  // the H200 it measured 1-2.4 us slower per call than the separate combine at B = 1..64).
  bool fused_combine = false;  // false: 64 heads per block, the separate combine kernel
  int64_t rows = 0;            // heads per block, 16 or 64; 0: the cost model's
  int64_t splits = 0;          // key splits per token; 0: the cost model's
};

// What the kernel runs with.
struct AttentionMmaPlan {
  int64_t rows = 64;        // heads per block: 64 (4 row groups x 2 halves of D) or 16 (1 x 8)
  int64_t slices = 2;       // warps sharing a row group, each over D / slices channels
  int64_t head_groups = 1;  // ceil(heads / rows)
  int64_t splits = 1;       // key splits per token
  bool fused = false;       // splits > 1 merged by the kernel's last block (needs counters)
  bool prefetch = false;    // the wgmma kernel's prefetching variant (sm90/*_prefetch.cu)
  bool pdl = false;         // prefetch: programmatic dependent launches (encode -> it -> combine)
  bool swizzle = false;     // prefetch: the tiles in wgmma's 128-byte swizzle
  // overlap, 128 heads or a multiple: the two blocks of a token's 128 heads a cluster sharing the
  // key tiles (the overlap kernel's pair mode)
  bool pair = false;
  bool overlap = false;  // the wgmma kernel's warp-specialised variant (sm90/*_overlap.cu)
  // overlap, unmerged: its wgmma_overlap_ilp variant (the integer fp8 decode, the branch-free
  // softmax in the key-split kernel's arithmetic, the output staged through shared memory;
  // bf16-close); the pair mode's always (wgmma_overlap_pair)
  bool ilp = false;
  // overlap, splits > 1: a token's splits one thread-block cluster that merges them itself
  // (no combine kernel); at most kWgmmaClusterMergeMaxSplits splits
  bool cluster_merge = false;
  // pair: persistent clusters, as many as the device runs at once, each walking units (a
  // token's 128 heads, a split) so that a unit's start overlaps the previous unit's end; the
  // launch takes it over fp8 records with bf16 q, bf16 output and one split (else a cluster per
  // unit)
  bool persistent = false;
  // the key-split kernel (sm90/attention_wgmma_keysplit.cu, bf16 rows): two consumer warpgroups
  // each scoring its own 64 keys of every 128, so one's softmax runs under the other's products
  bool keysplit = false;
};

// Arrival counters of the fused combine a backend keeps: the most (token, head group) pairs a
// fused launch may have.
constexpr int64_t kAttentionCounterSlots = 8192;

// The threads of a block (8 warps): rows = 16 x (8 / slices).
constexpr int64_t kMmaPlanWarps = 8;
constexpr int64_t kMmaPlanKeys = 32;  // keys per tile (attention_mma_config.h's kMmaKeys)

// The 16-row layout splits D over 8 warps, each taking whole k16 steps: D a multiple of 128.
constexpr bool mma_rows16_supported(int64_t dim) {
  return dim % (kMmaPlanWarps * 16) == 0;
}

// The fused path's cost model, in estimated microseconds on an H200 (to be tuned with the
// DEEPINFER_ATTENTION_ROWS / _SPLITS overrides): a 32-key tile of 64 heads takes about 4 us in the
// steady state (B = 256: 158.8 us for two waves of 20 tiles); the 16-head layout does a quarter of
// the products per tile with all 8 warps, with a little less overlap. A block starts with
// dependent loads (top-k index, block table, first keys, q). The last block of a head group reads
// every split's partial sums (rows x D f32 each) alone, at about 100 GB/s from L2.
constexpr double kMmaTileUs64 = 4.0;
constexpr double kMmaTileUs16 = 1.3;
constexpr double kMmaStartUs = 3.0;
constexpr double kMmaCombineFixedUs = 0.5;
constexpr double kMmaCombineBytesPerUs = 1.0e5;

// Estimated time of one candidate (rows, splits) for `tokens` tokens.
inline double mma_plan_cost(int64_t tokens, int64_t heads, int64_t dim, int64_t tiles, int64_t sms,
                            int64_t rows, int64_t splits) {
  const int64_t blocks = tokens * ((heads + rows - 1) / rows) * splits;
  const int64_t waves = (blocks + sms - 1) / sms;
  const double tile_us = rows == 64 ? kMmaTileUs64 : kMmaTileUs16;
  double us = static_cast<double>(waves) *
              (static_cast<double>((tiles + splits - 1) / splits) * tile_us + kMmaStartUs);
  if (splits > 1) {
    const double bytes = static_cast<double>(splits * std::min(rows, heads) * (dim + 2) * 4);
    us += kMmaCombineFixedUs + bytes / kMmaCombineBytesPerUs;
  }
  return us;
}

// The separate-combine plan (the kernel before fusion): 64 heads per block, the split count
// that minimises waves x (tiles per split + overhead_tiles); ties go to fewer splits.
inline AttentionMmaPlan separate_mma_plan(int64_t tokens, int64_t heads, int64_t max_keys,
                                          int64_t sms, int64_t max_splits, int64_t overhead_tiles) {
  AttentionMmaPlan p;
  p.head_groups = (heads + 63) / 64;
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kMmaPlanKeys - 1) / kMmaPlanKeys);
  const int64_t blocks = tokens * p.head_groups;
  sms = std::max<int64_t>(1, sms);
  int64_t best = -1;
  for (int64_t s = 1; s <= std::min(tiles, max_splits); ++s) {
    const int64_t waves = (blocks * s + sms - 1) / sms;
    const int64_t cost = waves * ((tiles + s - 1) / s + overhead_tiles);
    if (best < 0 || cost < best) {
      best = cost;
      p.splits = s;
    }
  }
  return p;
}

// The plan for `choice`. Unforced and not fused: separate_mma_plan, the kernel as it was before
// the fused combine. Otherwise the (rows, splits) of least mma_plan_cost among those the choice
// allows, ties to 64 rows and fewer splits. The 16-row layout is a candidate only for D a
// multiple of 128 and, unless forced, for few tokens (its blocks read each key once per 16 heads,
// which costs L2 bandwidth once 64-row blocks alone fill the SMs). The fused combine needs a
// counter per (token, head group): a plan with more than `counter_slots` of them and splits > 1
// is no candidate.
inline AttentionMmaPlan choose_mma_plan(int64_t tokens, int64_t heads, int64_t dim,
                                        int64_t max_keys, int64_t sms, int64_t max_splits,
                                        int64_t overhead_tiles, int64_t counter_slots,
                                        const AttentionMmaChoice& choice) {
  sms = std::max<int64_t>(1, sms);
  if (!choice.fused_combine && choice.rows == 0 && choice.splits == 0)
    return separate_mma_plan(tokens, heads, max_keys, sms, max_splits, overhead_tiles);
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kMmaPlanKeys - 1) / kMmaPlanKeys);
  const int64_t split_cap = std::max<int64_t>(1, std::min(tiles, max_splits));
  const bool few_tokens = tokens * ((heads + 63) / 64) * 2 <= sms;
  const bool rows16_ok = mma_rows16_supported(dim) && (few_tokens || choice.rows == 16);
  AttentionMmaPlan best;
  double best_cost = -1;
  bool found = false;
  for (const int64_t rows : {int64_t{64}, int64_t{16}}) {
    if (rows == 16 && !rows16_ok) continue;
    if (choice.rows != 0 && choice.rows != rows) continue;
    const int64_t groups = (heads + rows - 1) / rows;
    const bool counters_fit = tokens * groups <= counter_slots;
    for (int64_t s = 1; s <= split_cap; ++s) {
      if (choice.splits != 0 && s != std::min(choice.splits, split_cap)) continue;
      if (choice.fused_combine && s > 1 && !counters_fit) continue;
      const double cost = mma_plan_cost(tokens, heads, dim, tiles, sms, rows, s);
      if (!found || cost < best_cost) {
        found = true;
        best_cost = cost;
        best.rows = rows;
        best.slices = kMmaPlanWarps / (rows / 16);
        best.head_groups = groups;
        best.splits = s;
        best.fused = choice.fused_combine && s > 1;
      }
    }
  }
  if (!found) return separate_mma_plan(tokens, heads, max_keys, sms, max_splits, overhead_tiles);
  return best;
}

// Auto at small batches (attention.cu; on sm_90 devices, over the shapes the Hopper kernels
// take): mma.sync with 16-head blocks and about one 32-key tile per split, merged by the separate
// combine, where the query rows times the 16-head groups are at most kSmallBatchMaxGroups at up
// to kSmallBatchMaxHeads heads. There a call is a chain of dependent latencies (top-k index,
// block table, key, softmax, merge) that the Hopper kernels' deeper pipelines lengthen. Session
// 33, the V4-Flash CSA shape (fp8 KV, 64 heads, 640 keys), the engine's call (bf16 q, keys
// encoded, bf16 output), graph replay, against the ilp kernel: on an H100, B = 1 10.9-11.0 us
// (20 splits) against 13.9, B = 2 13.0 (10 splits) against 14.1, B = 1 with s_q = 2 12.8
// against 13.9; B = 4 lost (19.2 at 5 splits against 14.9) and so did B = 8. Session 34, an
// H100, 128 heads (V4-Pro) at B = 1: 12.95 us at 10 splits (13.23 at 16, 15.93 at 20) against
// 14.62 for the paired Hopper kernel; over bf16 rows 11.14 against 13.66 (ilp).
constexpr int64_t kSmallBatchMaxGroups = 8;
constexpr int64_t kSmallBatchMaxHeads = 128;

inline bool small_batch_mma_takes(int64_t tokens, int64_t heads, int64_t dim) {
  return heads <= kSmallBatchMaxHeads && mma_rows16_supported(dim) &&
         tokens * ((heads + 15) / 16) <= kSmallBatchMaxGroups;
}

// Its plan: as few 32-key tiles per split as keep the blocks (rows x groups x splits) within one
// wave of `sms`, the splits then as few as that tile count allows (14 splits of 2 tiles measured
// slower than 10); `splits_override` (DEEPINFER_ATTENTION_SPLITS) where set.
inline AttentionMmaChoice small_batch_mma_choice(int64_t tokens, int64_t heads, int64_t max_keys,
                                                 int64_t sms, int64_t splits_override) {
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kMmaPlanKeys - 1) / kMmaPlanKeys);
  const int64_t units = std::max<int64_t>(1, tokens * ((heads + 15) / 16));
  const int64_t max_splits = std::max<int64_t>(1, sms / units);
  const int64_t tiles_per_split = (tiles + max_splits - 1) / max_splits;
  AttentionMmaChoice choice;
  choice.fused_combine = false;
  choice.rows = 16;
  choice.splits =
      splits_override > 0 ? splits_override : (tiles + tiles_per_split - 1) / tiles_per_split;
  return choice;
}

// Which tensor-core kernel runs bf16_math attention where both take the shape: mma.sync
// (sm80/attention_mma.cu) or Hopper's wgmma (sm90/attention_wgmma.cu: 64 heads or a multiple,
// D = 512, bf16 or fp8 KV, sm_90a builds on sm_90 devices; elsewhere mma.sync runs). The
// kernels descend from kWgmmaOverlap, the warp-specialised variant
// (sm90/attention_wgmma_overlap.cu: a producer warpgroup decodes the keys while a scoring and a
// value warpgroup run the products; the same records as the prefetching variant take, other fp8
// records run the plain kernel): on the H200 over fp8 KV 1.3-1.4x faster than kWgmmaPrefetchSw128
// (the default before it) at B >= 64 (64 and 128 heads), no slower at B = 1, with the same bytes as
// the wgmma kernel. The default now is kWgmmaOverlapAuto, below. kWgmmaPrefetch: the wgmma kernel's
// prefetching variant (the same tiles and results, the key loads a tile further ahead: fp8 records
// in registers, for V4's record; other fp8 records run the plain wgmma kernel). kWgmmaPrefetchPdl:
// the same kernel as a programmatic dependent launch of the kv rows' encoding, and the split
// combine one of it (each starts while the grid before it runs and waits for it before reading its
// output). The _Sw128 pair: the same with the tiles in wgmma's 128-byte swizzle instead of the
// no-swizzle core matrices. For few tokens (B = 1..8), where the launches and a block's chain of
// dependent loads are most of the time: kWgmmaOverlapPdl, the warp-specialised kernel as a
// programmatic dependent launch of the kv rows' encoding (it resolves its first keys while that
// grid runs) and the combine one of it; kWgmmaOverlapFused, the same launch with a token's key
// splits one thread-block cluster (at most 8 splits) whose blocks merge the splits after a cluster
// barrier, each a slice of the heads, so no combine kernel runs (the combine's arithmetic: the same
// bytes). kWgmmaOverlapPair: at 128 heads or a multiple, the warp-specialised kernel in cluster
// pairs (its two 64-head blocks of a token share the decoded key tiles, each producer decoding
// half; the same results), as the ilp variant (other head counts run kWgmmaOverlapIlp; its
// producers store into the peer by st.async), persistent with bf16 q and output, one split (as many
// clusters as run at once, each walking units of a token's 128 heads, so that a unit's start
// overlaps the previous one's end); kWgmmaOverlapPairBlocks: the same pairs with a cluster per
// unit (the launch before the persistent one). kWgmmaOverlapIlp (the default from session 13 to 21:
// on the H200 5% faster than kWgmmaOverlap at B = 256 with fp8 KV, 119.1 -> 113.1 us, and 6% at 128
// heads, B = 64, 63.7 -> 60.1 us; its byte-for-byte test and the op table's 179 attention rows
// passed): kWgmmaOverlap with the producer's fp8 decode and the scorer's softmax free of branches
// (one block each, which ptxas interleaves), the output staged through the free key buffers so its
// global stores are whole rows, and the next block's q and top-k row prefetched into L2 (prefill
// 4-6% faster). Since session 27 its softmax (and the pairs') takes the key-split kernel's
// arithmetic (the scale folded into one FFMA per exponential, the row sums reduced across lanes
// once per unit): 128 heads over fp8, B = 256 140.9-142.0 -> 134.7 us, B = 64 40.6-41.1 -> 39.3;
// bf16-close to kWgmmaOverlap, no longer its bytes.
// kWgmmaOverlapAuto (the default, DEEPINFER_ATTENTION_KERNEL=auto or unset): mma.sync at small
// batches (small_batch_mma_takes), else kWgmmaOverlapPair over V4's fp8 records at 128 heads or a
// multiple, kWgmmaOverlapIlp otherwise. On the H200 the pairs over fp8 took 152.3 / 42.4 / 17.7
// us at B = 256 / 64 / 1 against the ilp kernel's 183.4 / 51.6 / 18.2 (bf16 output, session 21),
// and 2,155 against 2,409 us for an fp8 prefill chunk of 4,096 queries; over bf16 rows they were
// no faster (172.4 against 168.2 us at B = 256) and a bf16 prefill chunk 1.35x slower, so bf16
// rows stay unpaired. Persistent where the units outnumber the clusters that fit (session 22,
// bf16 output): 149.1 against 152.6 us with a cluster per unit at B = 256, 1,961 against 2,115
// us for the fp8 prefill chunk.
// kWgmmaKeySplit: over bf16 rows the key-split kernel (sm90/attention_wgmma_keysplit.cu: the two
// consumer warpgroups each score half of every 128 keys and take turns on the tensor cores,
// FlashMLA's sparse prefill scheme); other records run as auto. Auto takes it over bf16 rows for
// prefill-like calls and one-split decode (keysplit_auto_takes).
enum class AttentionKernelChoice {
  kMmaSync,
  kWgmma,
  kWgmmaPrefetch,
  kWgmmaPrefetchPdl,
  kWgmmaPrefetchSw128,
  kWgmmaPrefetchSw128Pdl,
  kWgmmaOverlap,
  kWgmmaOverlapPdl,
  kWgmmaOverlapFused,
  kWgmmaOverlapPair,
  kWgmmaOverlapPairBlocks,
  kWgmmaOverlapIlp,
  kWgmmaOverlapAuto,
  kWgmmaKeySplit,
};

// Whether auto runs the key-split kernel over bf16 rows: for calls of kKeySplitMinRowsPerSeq or
// more query rows per sequence on average (prefill chunks, whose queries share their keys through
// L2), and for decode where the wgmma plan (`plan_splits`: wgmma_attention_plan's) has one split,
// i.e. the units fill the device. On the H200 (session 26) a chunk of 4,096 queries at 64 heads
// took 742.0 us against the ilp kernel's 1,043.8 (128 heads: 1,507.4 against 2,046.5); decode at
// B = 256 76.1 against 88.8 (s_q = 2: 122.4 against 155.0; 128 heads 137.1 against 160.0, and at
// B = 64 39.0 against 46.2). With splits the ilp kernel stays, whose deeper key pipeline suits a
// split's few steps (64 heads, B = 64, 2 splits: 42.2 against 44.7 us).
constexpr int64_t kKeySplitMinRowsPerSeq = 16;

inline bool keysplit_auto_takes(int64_t tokens, int64_t seqs, int64_t plan_splits) {
  return plan_splits == 1 || tokens >= kKeySplitMinRowsPerSeq * std::max<int64_t>(1, seqs);
}

// Which prefetching variant a choice asks for (none for mma_sync and wgmma).
struct WgmmaPrefetchChoice {
  bool prefetch = false;
  bool pdl = false;
  bool swizzle = false;
};

inline WgmmaPrefetchChoice wgmma_prefetch_choice(AttentionKernelChoice c) {
  switch (c) {
    case AttentionKernelChoice::kWgmmaPrefetch:
      return {true, false, false};
    case AttentionKernelChoice::kWgmmaPrefetchPdl:
      return {true, true, false};
    case AttentionKernelChoice::kWgmmaPrefetchSw128:
      return {true, false, true};
    case AttentionKernelChoice::kWgmmaPrefetchSw128Pdl:
      return {true, true, true};
    default:
      return {};
  }
}

// Which warp-specialised variant a choice asks for (none for the others).
struct WgmmaOverlapChoice {
  bool overlap = false;
  bool pdl = false;            // programmatic dependent launches (encode -> it -> combine)
  bool cluster_merge = false;  // the splits merged in the kernel by their cluster
  bool pair = false;           // at 128 heads or a multiple: cluster pairs sharing the key tiles
  bool ilp = false;            // the branch-free decode and softmax, the output staged (bf16-close)
  bool pair_fp8 = false;       // at 128 heads or a multiple: cluster pairs over fp8 records only
  bool persistent = false;     // the pairs persistent (AttentionMmaPlan::persistent)
};

inline WgmmaOverlapChoice wgmma_overlap_choice(AttentionKernelChoice c) {
  switch (c) {
    case AttentionKernelChoice::kWgmmaOverlap:
      return {true, false, false};
    case AttentionKernelChoice::kWgmmaOverlapPdl:
      return {true, true, false};
    case AttentionKernelChoice::kWgmmaOverlapFused:
      return {true, true, true};
    case AttentionKernelChoice::kWgmmaOverlapPair:
      return {true, false, false, true, true, false, true};
    case AttentionKernelChoice::kWgmmaOverlapPairBlocks:
      return {true, false, false, true, true, false, false};
    case AttentionKernelChoice::kWgmmaOverlapIlp:
      return {true, false, false, false, true};
    case AttentionKernelChoice::kWgmmaOverlapAuto:
      return {true, false, false, false, true, true, true};
    default:
      return {};
  }
}

// DEEPINFER_ATTENTION_KERNEL (mma_sync | wgmma | wgmma_prefetch | wgmma_prefetch_pdl |
// wgmma_prefetch_sw128 | wgmma_prefetch_sw128_pdl | wgmma_overlap |
// wgmma_overlap_pdl | wgmma_overlap_fused | wgmma_overlap_pair | wgmma_overlap_pair_blocks |
// wgmma_overlap_ilp | wgmma_keysplit | auto, unset: auto);
// nullopt names the variable and the value not understood (`bad`).
inline std::optional<AttentionKernelChoice> parse_attention_kernel(const char* value,
                                                                   std::string* bad) {
  const std::string_view v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") return AttentionKernelChoice::kWgmmaOverlapAuto;
  if (v == "mma_sync") return AttentionKernelChoice::kMmaSync;
  if (v == "wgmma") return AttentionKernelChoice::kWgmma;
  if (v == "wgmma_prefetch") return AttentionKernelChoice::kWgmmaPrefetch;
  if (v == "wgmma_prefetch_pdl") return AttentionKernelChoice::kWgmmaPrefetchPdl;
  if (v == "wgmma_prefetch_sw128") return AttentionKernelChoice::kWgmmaPrefetchSw128;
  if (v == "wgmma_prefetch_sw128_pdl") return AttentionKernelChoice::kWgmmaPrefetchSw128Pdl;
  if (v == "wgmma_overlap") return AttentionKernelChoice::kWgmmaOverlap;
  if (v == "wgmma_overlap_pdl") return AttentionKernelChoice::kWgmmaOverlapPdl;
  if (v == "wgmma_overlap_fused") return AttentionKernelChoice::kWgmmaOverlapFused;
  if (v == "wgmma_overlap_pair") return AttentionKernelChoice::kWgmmaOverlapPair;
  if (v == "wgmma_overlap_pair_blocks") return AttentionKernelChoice::kWgmmaOverlapPairBlocks;
  if (v == "wgmma_overlap_ilp") return AttentionKernelChoice::kWgmmaOverlapIlp;
  if (v == "wgmma_keysplit") return AttentionKernelChoice::kWgmmaKeySplit;
  *bad =
      "DEEPINFER_ATTENTION_KERNEL: expected mma_sync, wgmma, wgmma_prefetch, wgmma_prefetch_pdl, "
      "wgmma_prefetch_sw128, wgmma_prefetch_sw128_pdl, wgmma_overlap, "
      "wgmma_overlap_pdl, wgmma_overlap_fused, wgmma_overlap_pair, wgmma_overlap_pair_blocks, "
      "wgmma_overlap_ilp, wgmma_keysplit or auto, got "
      "'" +
      std::string(v) + "'";
  return std::nullopt;
}

// DEEPINFER_ATTENTION_COMBINE (fused | separate, unset: separate), DEEPINFER_ATTENTION_ROWS (16 |
// 64, unset: the cost model's) and DEEPINFER_ATTENTION_SPLITS (1..64, unset: the cost model's) as a
// choice; nullopt names the variable whose value is not understood (`bad`).
inline std::optional<AttentionMmaChoice> parse_attention_mma_choice(const char* combine,
                                                                    const char* rows,
                                                                    const char* splits,
                                                                    std::string* bad) {
  AttentionMmaChoice c;
  const std::string_view cv = combine == nullptr ? "" : combine;
  if (cv == "fused") {
    c.fused_combine = true;
  } else if (!cv.empty() && cv != "separate") {
    *bad = "DEEPINFER_ATTENTION_COMBINE: expected fused or separate, got '" + std::string(cv) + "'";
    return std::nullopt;
  }
  const std::string_view rv = rows == nullptr ? "" : rows;
  if (rv == "16" || rv == "64") {
    c.rows = rv == "16" ? 16 : 64;
  } else if (!rv.empty()) {
    *bad = "DEEPINFER_ATTENTION_ROWS: expected 16 or 64, got '" + std::string(rv) + "'";
    return std::nullopt;
  }
  const std::string_view sv = splits == nullptr ? "" : splits;
  if (!sv.empty()) {
    int64_t n = 0;
    for (const char ch : sv) {
      if (ch < '0' || ch > '9' || n > 64) {
        n = -1;
        break;
      }
      n = n * 10 + (ch - '0');
    }
    if (n < 1 || n > 64) {
      *bad = "DEEPINFER_ATTENTION_SPLITS: expected 1..64, got '" + std::string(sv) + "'";
      return std::nullopt;
    }
    c.splits = n;
  }
  return c;
}

}  // namespace deepinfer::cuda
