// The tensor-core attention's plan (cuda/attention/attention_plan.h), checked on the host: heads
// per block, key splits and the fused combine for the shapes the device runs, the forced choices
// of DEEPINFER_ATTENTION_COMBINE / _ROWS / _SPLITS, and that the separate path keeps the split
// rule of the kernel before the fused combine; DEEPINFER_ATTENTION_KERNEL and the wgmma kernel's
// shapes and splits (cuda/attention/sm90/attention_wgmma_config.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/attention/attention_plan.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"

namespace deepinfer::cuda {
namespace {

constexpr int64_t kSms = 132;  // H200
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kOverheadTiles = 2;

// The planner with the fused combine allowed (opt-in in the backend) unless `choice` says not.
AttentionMmaPlan plan(int64_t tokens, int64_t heads, int64_t dim, int64_t keys,
                      const AttentionMmaChoice& choice = {.fused_combine = true},
                      int64_t counters = kAttentionCounterSlots) {
  return choose_mma_plan(tokens, heads, dim, keys, kSms, kMaxSplits, kOverheadTiles, counters,
                         choice);
}

// The split rule of the kernel before the fused combine, written out independently.
int64_t pre_fusion_splits(int64_t tokens, int64_t heads, int64_t keys) {
  const int64_t tiles = std::max<int64_t>(1, (keys + 31) / 32);
  const int64_t blocks = tokens * ((heads + 63) / 64);
  int64_t best = -1, splits = 1;
  for (int64_t s = 1; s <= std::min<int64_t>(tiles, kMaxSplits); ++s) {
    const int64_t cost = (blocks * s + kSms - 1) / kSms * ((tiles + s - 1) / s + kOverheadTiles);
    if (best < 0 || cost < best) {
      best = cost;
      splits = s;
    }
  }
  return splits;
}

TEST(AttentionPlan, SeparateKeepsThePreFusionPlan) {
  for (const int64_t tokens : {1, 2, 5, 37, 64, 256, 512})
    for (const int64_t heads : {4, 64, 72, 128})
      for (const int64_t keys : {8, 108, 640, 1152}) {
        const AttentionMmaPlan p = plan(tokens, heads, 512, keys, {.fused_combine = false});
        EXPECT_EQ(p.rows, 64);
        EXPECT_EQ(p.slices, 2);
        EXPECT_EQ(p.head_groups, (heads + 63) / 64);
        EXPECT_FALSE(p.fused);
        EXPECT_EQ(p.splits, pre_fusion_splits(tokens, heads, keys))
            << tokens << " tokens, " << heads << " heads, " << keys << " keys";
      }
}

TEST(AttentionPlan, FusedPlansAreConsistent) {
  for (const int64_t dim : {64, 128, 256, 512})
    for (const int64_t tokens : {1, 2, 5, 8, 20, 37, 64, 128, 256, 512, 4096})
      for (const int64_t heads : {4, 20, 64, 72, 128})
        for (const int64_t keys : {1, 32, 108, 640, 1152, 100000}) {
          const AttentionMmaPlan p = plan(tokens, heads, dim, keys);
          const std::string what = std::to_string(tokens) + " tokens, " + std::to_string(heads) +
                                   " heads of " + std::to_string(dim) + ", " +
                                   std::to_string(keys) + " keys";
          ASSERT_TRUE(p.rows == 64 || p.rows == 16) << what;
          EXPECT_EQ(p.slices * (p.rows / 16), kMmaPlanWarps) << what;
          EXPECT_TRUE(p.rows == 64 || mma_rows16_supported(dim)) << what;
          EXPECT_EQ(p.head_groups, (heads + p.rows - 1) / p.rows) << what;
          const int64_t tiles = std::max<int64_t>(1, (keys + 31) / 32);
          EXPECT_GE(p.splits, 1) << what;
          EXPECT_LE(p.splits, std::min(tiles, kMaxSplits)) << what;
          EXPECT_EQ(p.fused, p.splits > 1) << what;
          EXPECT_TRUE(!p.fused || tokens * p.head_groups <= kAttentionCounterSlots) << what;
        }
}

// V4-Flash's CSA decode (64 heads x 512, 128 + 512 keys) at B = 1: the 16-head layout over
// several splits, merged by the kernel, on a good part of the SMs; at B = 256 one wave-filling
// block per token, no split.
TEST(AttentionPlan, V4DecodeShapes) {
  const AttentionMmaPlan b1 = plan(1, 64, 512, 640);
  EXPECT_EQ(b1.rows, 16);
  EXPECT_TRUE(b1.fused);
  EXPECT_GE(b1.head_groups * b1.splits, 32);
  const AttentionMmaPlan b256 = plan(256, 64, 512, 640);
  EXPECT_EQ(b256.rows, 64);
  EXPECT_EQ(b256.splits, 1);
  EXPECT_FALSE(b256.fused);
}

TEST(AttentionPlan, ForcedChoices) {
  AttentionMmaPlan p = plan(1, 64, 512, 640, {.fused_combine = true, .rows = 64, .splits = 7});
  EXPECT_EQ(p.rows, 64);
  EXPECT_EQ(p.splits, 7);
  EXPECT_TRUE(p.fused);
  p = plan(256, 64, 512, 640,
           {.fused_combine = true, .rows = 16, .splits = 3});  // forced past the few-token rule
  EXPECT_EQ(p.rows, 16);
  EXPECT_EQ(p.slices, 8);
  EXPECT_EQ(p.head_groups, 4);
  EXPECT_EQ(p.splits, 3);
  p = plan(1, 64, 512, 640, {.fused_combine = true, .splits = 64});  // clamped to the 20 tiles
  EXPECT_EQ(p.splits, 20);
  p = plan(1, 4, 64, 108,
           {.fused_combine = true, .rows = 16});  // D = 64 has no 16-row layout: the separate plan
  EXPECT_EQ(p.rows, 64);
  EXPECT_FALSE(p.fused);
  p = plan(1, 64, 512, 640, {.fused_combine = false, .rows = 16, .splits = 5});
  EXPECT_EQ(p.rows, 16);
  EXPECT_EQ(p.splits, 5);
  EXPECT_FALSE(p.fused);
}

// More (token, head group) pairs than counters: no fused split.
TEST(AttentionPlan, CountersBoundTheFusedCombine) {
  const AttentionMmaPlan p = plan(64, 64, 512, 640, {.fused_combine = true}, /*counters=*/32);
  EXPECT_FALSE(p.fused);
  EXPECT_EQ(p.splits, 1);
  const AttentionMmaPlan q = plan(20, 64, 512, 640, {.fused_combine = true}, /*counters=*/80);
  EXPECT_LE(20 * q.head_groups, 80);
  EXPECT_TRUE(q.fused);
}

// Auto's small-batch route (mma.sync, 16-head blocks): which calls take it, and its splits at
// the V4-Flash CSA shape (640 keys: 20 tiles of 32) on 132 SMs.
TEST(AttentionPlan, SmallBatchRoute) {
  EXPECT_TRUE(small_batch_mma_takes(1, 64, 512));
  EXPECT_TRUE(small_batch_mma_takes(2, 64, 512));    // B = 2, or one sequence with s_q = 2
  EXPECT_FALSE(small_batch_mma_takes(3, 64, 512));   // 12 groups of 16 heads
  EXPECT_FALSE(small_batch_mma_takes(4, 64, 512));   // measured slower than the ilp kernel
  EXPECT_TRUE(small_batch_mma_takes(1, 128, 512));   // V4-Pro's 128 heads at B = 1
  EXPECT_FALSE(small_batch_mma_takes(2, 128, 512));  // 16 groups
  EXPECT_FALSE(small_batch_mma_takes(1, 256, 512));  // not measured
  EXPECT_FALSE(small_batch_mma_takes(1, 64, 96));    // no 16-row layout for D = 96
  // B = 1: one tile per split (80 blocks); two query rows: two tiles per split (10 splits, 80
  // blocks; 14 splits of mostly two tiles measured slower); top-k 1024 (36 tiles) at B = 1:
  // at most 33 splits fit one wave, so two tiles each.
  EXPECT_EQ(small_batch_mma_choice(1, 64, 640, kSms, 0).splits, 20);
  EXPECT_EQ(small_batch_mma_choice(2, 64, 640, kSms, 0).splits, 10);
  EXPECT_EQ(small_batch_mma_choice(1, 64, 1152, kSms, 0).splits, 18);
  EXPECT_EQ(small_batch_mma_choice(1, 128, 640, kSms, 0).splits, 10);  // 8 groups: 2 tiles each
  EXPECT_EQ(small_batch_mma_choice(1, 64, 640, kSms, 7).splits, 7);    // the override
  const AttentionMmaChoice c = small_batch_mma_choice(1, 64, 640, kSms, 0);
  EXPECT_EQ(c.rows, 16);
  EXPECT_FALSE(c.fused_combine);
  // The planner keeps it: 4 groups x 20 splits, separate combine.
  const AttentionMmaPlan p = plan(1, 64, 512, 640, c);
  EXPECT_EQ(p.rows, 16);
  EXPECT_EQ(p.head_groups, 4);
  EXPECT_EQ(p.splits, 20);
  EXPECT_FALSE(p.fused);
}

TEST(AttentionPlan, ParsesTheEnvironment) {
  std::string bad;
  auto c = parse_attention_mma_choice(nullptr, nullptr, nullptr, &bad);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->fused_combine);  // the separate combine by default (measured faster)
  EXPECT_EQ(c->rows, 0);
  EXPECT_EQ(c->splits, 0);
  c = parse_attention_mma_choice("separate", "16", "12", &bad);
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->fused_combine);
  EXPECT_EQ(c->rows, 16);
  EXPECT_EQ(c->splits, 12);
  c = parse_attention_mma_choice("fused", "", "", &bad);
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->fused_combine);
  EXPECT_FALSE(parse_attention_mma_choice("fast", nullptr, nullptr, &bad).has_value());
  EXPECT_NE(bad.find("DEEPINFER_ATTENTION_COMBINE"), std::string::npos);
  EXPECT_FALSE(parse_attention_mma_choice(nullptr, "32", nullptr, &bad).has_value());
  EXPECT_NE(bad.find("DEEPINFER_ATTENTION_ROWS"), std::string::npos);
  for (const char* s : {"0", "65", "x", "-1", "100000000000000000000"}) {
    EXPECT_FALSE(parse_attention_mma_choice(nullptr, nullptr, s, &bad).has_value()) << s;
    EXPECT_NE(bad.find("DEEPINFER_ATTENTION_SPLITS"), std::string::npos);
  }
}

TEST(AttentionPlan, ParsesTheKernelSwitch) {
  std::string bad;
  EXPECT_EQ(parse_attention_kernel(nullptr, &bad), AttentionKernelChoice::kWgmmaOverlapAuto);
  EXPECT_EQ(parse_attention_kernel("", &bad), AttentionKernelChoice::kWgmmaOverlapAuto);
  EXPECT_EQ(parse_attention_kernel("auto", &bad), AttentionKernelChoice::kWgmmaOverlapAuto);
  // auto: the ilp variant, in cluster pairs over fp8 records only (the plan's pair_fp8); the
  // explicit values never pair by format.
  const WgmmaOverlapChoice automatic =
      wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapAuto);
  EXPECT_TRUE(automatic.overlap && automatic.ilp && automatic.pair_fp8 && !automatic.pair &&
              !automatic.pdl && !automatic.cluster_merge);
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaOverlapAuto).prefetch);
  EXPECT_FALSE(wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapIlp).pair_fp8);
  EXPECT_FALSE(wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapPair).pair_fp8);
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap", &bad), AttentionKernelChoice::kWgmmaOverlap);
  EXPECT_EQ(parse_attention_kernel("mma_sync", &bad), AttentionKernelChoice::kMmaSync);
  EXPECT_EQ(parse_attention_kernel("wgmma", &bad), AttentionKernelChoice::kWgmma);
  EXPECT_EQ(parse_attention_kernel("wgmma_prefetch", &bad), AttentionKernelChoice::kWgmmaPrefetch);
  EXPECT_EQ(parse_attention_kernel("wgmma_prefetch_pdl", &bad),
            AttentionKernelChoice::kWgmmaPrefetchPdl);
  EXPECT_EQ(parse_attention_kernel("wgmma_prefetch_sw128", &bad),
            AttentionKernelChoice::kWgmmaPrefetchSw128);
  EXPECT_EQ(parse_attention_kernel("wgmma_prefetch_sw128_pdl", &bad),
            AttentionKernelChoice::kWgmmaPrefetchSw128Pdl);
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap", &bad), AttentionKernelChoice::kWgmmaOverlap);
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap_pdl", &bad),
            AttentionKernelChoice::kWgmmaOverlapPdl);
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap_fused", &bad),
            AttentionKernelChoice::kWgmmaOverlapFused);
  // The overlap variants: plain, with programmatic launches, and those with the cluster merge.
  const WgmmaOverlapChoice overlap = wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlap);
  EXPECT_TRUE(overlap.overlap && !overlap.pdl && !overlap.cluster_merge);
  const WgmmaOverlapChoice opdl = wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapPdl);
  EXPECT_TRUE(opdl.overlap && opdl.pdl && !opdl.cluster_merge);
  const WgmmaOverlapChoice fused = wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapFused);
  EXPECT_TRUE(fused.overlap && fused.pdl && fused.cluster_merge);
  EXPECT_FALSE(wgmma_overlap_choice(AttentionKernelChoice::kWgmmaPrefetchSw128Pdl).overlap);
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaOverlapFused).prefetch);
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap_pair", &bad),
            AttentionKernelChoice::kWgmmaOverlapPair);
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaOverlapPair).prefetch);
  // The pairs run the ilp variant (its integer fp8 decode, the same bytes).
  const WgmmaOverlapChoice pair = wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapPair);
  EXPECT_TRUE(pair.overlap && pair.pair && pair.ilp && !pair.pdl && !pair.cluster_merge);
  // Persistent pairs by default and under auto; _blocks: a cluster per unit.
  EXPECT_TRUE(pair.persistent && automatic.persistent);
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap_pair_blocks", &bad),
            AttentionKernelChoice::kWgmmaOverlapPairBlocks);
  const WgmmaOverlapChoice blocks =
      wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapPairBlocks);
  EXPECT_TRUE(blocks.overlap && blocks.pair && blocks.ilp && !blocks.persistent && !blocks.pdl &&
              !blocks.cluster_merge && !blocks.pair_fp8);
  EXPECT_FALSE(wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapIlp).persistent);
  // The ilp variant: the plain overlap launch (no pdl, merge or pair) with its own flag.
  EXPECT_EQ(parse_attention_kernel("wgmma_overlap_ilp", &bad),
            AttentionKernelChoice::kWgmmaOverlapIlp);
  const WgmmaOverlapChoice ilp = wgmma_overlap_choice(AttentionKernelChoice::kWgmmaOverlapIlp);
  EXPECT_TRUE(ilp.overlap && ilp.ilp && !ilp.pdl && !ilp.cluster_merge && !ilp.pair);
  EXPECT_FALSE(overlap.ilp);
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaOverlapIlp).prefetch);
  // The key-split kernel: its own choice, none of the overlap or prefetch variants.
  EXPECT_EQ(parse_attention_kernel("wgmma_keysplit", &bad), AttentionKernelChoice::kWgmmaKeySplit);
  EXPECT_FALSE(wgmma_overlap_choice(AttentionKernelChoice::kWgmmaKeySplit).overlap);
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaKeySplit).prefetch);
  // Auto takes it from 16 query rows per sequence on average (prefill chunks, with splits or
  // not), and for decode (1 to 4 rows per sequence with MTP) only where the plan has one split.
  EXPECT_TRUE(keysplit_auto_takes(4096, 1, 1));
  EXPECT_TRUE(keysplit_auto_takes(16, 1, 4));
  EXPECT_FALSE(keysplit_auto_takes(15, 1, 4));
  EXPECT_TRUE(keysplit_auto_takes(256, 256, 1));
  EXPECT_FALSE(keysplit_auto_takes(64, 64, 2));
  EXPECT_FALSE(keysplit_auto_takes(1024, 256, 2));
  EXPECT_TRUE(keysplit_auto_takes(64, 0, 2));  // no sequence count: as one sequence
  // wgmma_pair (the prefetching kernel in pairs) gave way to wgmma_overlap_pair.
  EXPECT_FALSE(parse_attention_kernel("wgmma_pair", &bad).has_value());
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaOverlap).prefetch);
  EXPECT_FALSE(wgmma_prefetch_choice(AttentionKernelChoice::kWgmma).prefetch);
  const WgmmaPrefetchChoice both =
      wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaPrefetchSw128Pdl);
  EXPECT_TRUE(both.prefetch && both.pdl && both.swizzle);
  const WgmmaPrefetchChoice plain = wgmma_prefetch_choice(AttentionKernelChoice::kWgmmaPrefetch);
  EXPECT_TRUE(plain.prefetch && !plain.pdl && !plain.swizzle);
  EXPECT_FALSE(parse_attention_kernel("WGMMA", &bad).has_value());
  EXPECT_FALSE(parse_attention_kernel("wgmma_", &bad).has_value());
  EXPECT_NE(bad.find("DEEPINFER_ATTENTION_KERNEL"), std::string::npos);
}

TEST(AttentionPlan, WgmmaPrefetchTakesV4sRecordAndBf16Rows) {
  EXPECT_TRUE(wgmma_prefetch_takes(false, 512, 64, 1024));  // bf16 rows
  EXPECT_TRUE(wgmma_prefetch_takes(false, 512, 0, 1024));
  EXPECT_TRUE(wgmma_prefetch_takes(true, 512, 64, 584));    // V4's fp8 record
  EXPECT_FALSE(wgmma_prefetch_takes(true, 512, 128, 520));  // other fp8 records
  EXPECT_FALSE(wgmma_prefetch_takes(true, 512, 64, 592));
  EXPECT_FALSE(wgmma_prefetch_takes(true, 512, 0, 584));
}

TEST(AttentionPlan, WgmmaPairTakesMultiplesOf128Heads) {
  EXPECT_TRUE(wgmma_pair_takes(128));
  EXPECT_TRUE(wgmma_pair_takes(256));
  EXPECT_FALSE(wgmma_pair_takes(64));
  EXPECT_FALSE(wgmma_pair_takes(192));
  EXPECT_FALSE(wgmma_pair_takes(0));
}

TEST(AttentionPlan, WgmmaShapesAndSplits) {
  // V4-Flash / V4-Pro heads of 512 channels over bf16 rows (1 KB) or the fp8 record (584 B).
  EXPECT_TRUE(wgmma_attention_shape(64, 512, false, 1024));
  EXPECT_TRUE(wgmma_attention_shape(128, 512, true, 584));
  EXPECT_FALSE(wgmma_attention_shape(32, 512, false, 1024));  // not whole groups of 64 heads
  EXPECT_FALSE(wgmma_attention_shape(64, 256, false, 512));   // another head dim
  EXPECT_FALSE(wgmma_attention_shape(64, 512, true, 1040));   // a record past the stage's rows
  EXPECT_LE(WgmmaAttnLayout::kBytes, size_t{227} * 1024);     // the H200's opt-in shared memory
  // 640 keys = 10 tiles of 64. B = 1 spreads them over the SMs; B = 256 fills the SMs unsplit.
  const AttentionMmaPlan b1 = wgmma_attention_plan(1, 64, 640, kSms, kMaxSplits, 0);
  EXPECT_EQ(b1.head_groups, 1);
  EXPECT_GT(b1.splits, 1);
  EXPECT_LE(b1.splits, 10);
  EXPECT_EQ(wgmma_attention_plan(256, 64, 640, kSms, kMaxSplits, 0).splits, 1);
  EXPECT_EQ(wgmma_attention_plan(3, 128, 640, kSms, kMaxSplits, 0).head_groups, 2);
  // Forced splits are taken, capped by the tiles.
  EXPECT_EQ(wgmma_attention_plan(3, 64, 640, kSms, kMaxSplits, 3).splits, 3);
  EXPECT_EQ(wgmma_attention_plan(3, 64, 640, kSms, kMaxSplits, 64).splits, 10);
  EXPECT_FALSE(wgmma_attention_plan(3, 64, 640, kSms, kMaxSplits, 3).fused);
  // The in-kernel merge's cap (a portable cluster): at B = 1 the 10 tiles in 5 splits of 2
  // (8 splits would leave 3 empty), forced splits capped too.
  const int64_t merge_cap = kWgmmaClusterMergeMaxSplits;
  EXPECT_EQ(wgmma_attention_plan(1, 64, 640, kSms, merge_cap, 0).splits, 5);
  EXPECT_EQ(wgmma_attention_plan(8, 64, 640, kSms, merge_cap, 0).splits, 5);
  EXPECT_EQ(wgmma_attention_plan(1, 64, 640, kSms, merge_cap, 64).splits, 8);
}

}  // namespace
}  // namespace deepinfer::cuda
