// The launch shape of the fused hc_pre / hc_head kernel (cuda/hc/hc_heuristics.h), checked on
// the host: the kernel's CTAs of a token group are one thread-block cluster (at most the size the
// device schedules), the grid fits the SMs, its slices read every column of a token's flattened
// row once, DEEPINFER_HC_PRE's choices take it where they say, and DEEPINFER_HC_CLUSTER's the
// cluster size they say (auto: the widest while every token group's cluster is active at once).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/hc/hc_heuristics.h"

namespace deepinfer::cuda {
namespace {

TEST(HcFusedGrid, DecodeSizesFitOneCtaPerSm) {
  for (const int64_t cluster : {kHcFusedPortableCluster, kHcFusedWideCluster})
    for (const int sms : {1, 8, 78, 132}) {
      for (int64_t tokens = 1; tokens <= kHcFusedMaxTokens + 1; ++tokens) {
        for (const int64_t hidden : {4, 32, 36, 40, 64, 4096, 7168}) {
          const HcFusedGrid g = hc_fused_grid(sms, tokens, 4, hidden, cluster);
          const int per_cta = tokens <= 8 ? 1 : 4;
          const bool expected =
              tokens <= kHcFusedMaxTokens && (tokens + per_cta - 1) / per_cta <= sms;
          ASSERT_EQ(g.fused, expected) << sms << " SMs, T " << tokens << ", H " << hidden;
          if (!g.fused) continue;
          EXPECT_EQ(g.tokens_per_cta, per_cta);
          EXPECT_GE(g.groups * g.tokens_per_cta, tokens);
          EXPECT_LT((g.groups - 1) * g.tokens_per_cta, tokens);
          EXPECT_LE(g.groups * g.splits, sms);
          EXPECT_LE(g.splits, cluster);
          EXPECT_EQ(g.chunk % 4, 0);
          // The splits cover the channels, the last one non-empty.
          EXPECT_GE(g.splits * g.chunk, hidden);
          EXPECT_LT((g.splits - 1) * g.chunk, hidden);
          if (g.splits > 1) {
            EXPECT_GE(g.chunk, kHcFusedMinChunk);
          }
        }
      }
    }
}

TEST(HcFusedGrid, OtherShapesTakeTheUnfusedPath) {
  EXPECT_FALSE(hc_fused_grid(132, 0, 4, 4096, 8).fused);
  EXPECT_FALSE(hc_fused_grid(132, kHcFusedMaxTokens + 1, 4, 4096, 8).fused);
  EXPECT_FALSE(hc_fused_grid(132, 1, kHcFusedMaxN + 1, 4096, 8).fused);
  EXPECT_FALSE(hc_fused_grid(132, 1, 4, 42, 8).fused);  // float4 rows need hidden % 4 == 0
  EXPECT_FALSE(hc_fused_grid(132, 1, 4, 0, 8).fused);
  EXPECT_FALSE(hc_fused_grid(132, 1, 4, 4096, 0).fused);  // a device without clusters
  EXPECT_TRUE(hc_fused_grid(132, 1, 1, 4, 8).fused);
}

// The V4-Flash shapes: T = 1 spreads one token over a cluster of 16 CTAs of 256 channels (8 of
// 512 where only the portable size fits); T = 8 takes 8 clusters of 16; T = 64 16 groups of 4
// tokens, 8 splits each (132 SMs leave no room for 16).
TEST(HcFusedGrid, FlashShapes) {
  const HcFusedGrid one = hc_fused_grid(132, 1, 4, 4096, kHcFusedWideCluster);
  EXPECT_EQ(one.groups, 1);
  EXPECT_EQ(one.splits, 16);
  EXPECT_EQ(one.chunk, 256);
  const HcFusedGrid portable = hc_fused_grid(132, 1, 4, 4096, kHcFusedPortableCluster);
  EXPECT_EQ(portable.splits, 8);
  EXPECT_EQ(portable.chunk, 512);
  const HcFusedGrid eight = hc_fused_grid(132, 8, 4, 4096, kHcFusedWideCluster);
  EXPECT_EQ(eight.groups, 8);
  EXPECT_EQ(eight.splits, 16);
  const HcFusedGrid batch = hc_fused_grid(132, 64, 4, 4096, kHcFusedWideCluster);
  EXPECT_EQ(batch.groups, 16);
  EXPECT_EQ(batch.splits, 8);
  EXPECT_EQ(batch.chunk, 512);
}

// auto takes the fused kernel up to kHcFusedAutoMaxTokens tokens, fused wherever the grid
// applies, legacy never; none takes it where the grid does not apply.
TEST(HcFusedGrid, ChoicesTakeTheFusedKernelWhereTheySay) {
  for (int64_t tokens = 1; tokens <= kHcFusedMaxTokens + 1; ++tokens) {
    const HcFusedGrid g = hc_fused_grid(132, tokens, 4, 4096, kHcFusedWideCluster);
    EXPECT_EQ(hc_fused_chosen(HcPreChoice::kAuto, g, tokens), tokens <= kHcFusedAutoMaxTokens)
        << tokens;
    EXPECT_EQ(hc_fused_chosen(HcPreChoice::kFused, g, tokens), tokens <= kHcFusedMaxTokens)
        << tokens;
    EXPECT_FALSE(hc_fused_chosen(HcPreChoice::kLegacy, g, tokens)) << tokens;
  }
  const HcFusedGrid none = hc_fused_grid(132, 1, 4, 4096, 0);
  EXPECT_FALSE(hc_fused_chosen(HcPreChoice::kAuto, none, 1));
  EXPECT_FALSE(hc_fused_chosen(HcPreChoice::kFused, none, 1));
}

// The split mix's grid (hc_mix_split_grid): token tiles cover the tokens, the splits every column
// of the flattened row once (the last non-empty) in whole float4 steps, about one CTA per SM;
// past its bounds (T, n, a width of whole float4s) the cuBLAS path.
TEST(HcMixSplitGrid, TilesAndSplitsCoverTheMix) {
  for (const int sms : {1, 8, 132}) {
    for (int64_t tokens = 1; tokens <= kHcMixSplitMaxTokens + 1; ++tokens) {
      for (const int n : {1, 3, 4, 5}) {
        for (const int64_t hidden : {1, 4, 9, 40, 4096}) {
          const HcMixSplitGrid g = hc_mix_split_grid(sms, tokens, n, hidden);
          const int64_t width = n * hidden;
          const bool expected =
              tokens <= kHcMixSplitMaxTokens && n <= kHcFusedMaxN && width % 4 == 0;
          ASSERT_EQ(g.split, expected)
              << sms << " SMs, T " << tokens << ", n " << n << ", H " << hidden;
          if (!g.split) continue;
          EXPECT_EQ(g.tiles, (tokens + kHcMixTokens - 1) / kHcMixTokens);
          EXPECT_EQ(g.chunk % kHcMixColumnStep, 0);
          EXPECT_GE(g.splits * g.chunk, width);
          EXPECT_LT((g.splits - 1) * g.chunk, width);
          // About one CTA per SM: no more than SMs + tiles, unless one split per tile already.
          if (g.splits > 1) {
            EXPECT_LE(g.tiles * g.splits, sms + g.tiles);
          }
        }
      }
    }
  }
  // V4-Flash at 64 tokens on an H100: 4 tiles of 32 splits of 512 columns.
  const HcMixSplitGrid flash = hc_mix_split_grid(132, 64, 4, 4096);
  EXPECT_EQ(flash.tiles, 4);
  EXPECT_EQ(flash.splits, 32);
  EXPECT_EQ(flash.chunk, 512);
}

// Every choice but legacy takes the split mix where its grid applies; none where it does not.
TEST(HcMixSplitGrid, ChoicesTakeTheSplitMixWhereTheySay) {
  const HcMixSplitGrid g = hc_mix_split_grid(132, 64, 4, 4096);
  const HcMixSplitGrid none = hc_mix_split_grid(132, kHcMixSplitMaxTokens + 1, 4, 4096);
  for (const HcPreChoice c :
       {HcPreChoice::kAuto, HcPreChoice::kFused, HcPreChoice::kSplit, HcPreChoice::kLegacy}) {
    EXPECT_EQ(hc_mix_split_chosen(c, g), c != HcPreChoice::kLegacy);
    EXPECT_FALSE(hc_mix_split_chosen(c, none));
  }
  for (int64_t tokens = 1; tokens <= 8; ++tokens) {
    const HcFusedGrid fused = hc_fused_grid(132, tokens, 4, 4096, kHcFusedWideCluster);
    EXPECT_FALSE(hc_fused_chosen(HcPreChoice::kSplit, fused, tokens)) << tokens;
  }
}

// The CTAs' units (hc_fused_column) read each float4 column of the flattened row exactly once.
TEST(HcFusedGrid, UnitsCoverEveryColumnOnce) {
  for (const int n : {1, 2, 3, 4}) {
    for (const int64_t hidden : {4, 36, 40, 64, 4096}) {
      for (const int64_t tokens : {1, 7, 64}) {
        const HcFusedGrid g = hc_fused_grid(132, tokens, n, hidden, kHcFusedWideCluster);
        ASSERT_TRUE(g.fused);
        std::vector<int> reads(static_cast<size_t>(n * hidden), 0);
        for (int64_t split = 0; split < g.splits; ++split) {
          const int64_t h_begin = split * g.chunk;
          const int64_t h_end = h_begin + g.chunk < hidden ? h_begin + g.chunk : hidden;
          const int64_t quads = (h_end - h_begin) / 4;
          for (int u = 0; u < n * quads; ++u) {
            const int64_t k = hc_fused_column(u, static_cast<int>(quads), hidden, h_begin);
            ASSERT_GE(k, 0);
            ASSERT_LE(k + 4, n * hidden);
            // Inside this split's channels of its stream.
            EXPECT_GE(k % hidden, h_begin);
            EXPECT_LE(k % hidden + 4, h_end);
            for (int e = 0; e < 4; ++e) ++reads[static_cast<size_t>(k + e)];
          }
        }
        for (size_t k = 0; k < reads.size(); ++k) {
          ASSERT_EQ(reads[k], 1) << "n " << n << " H " << hidden << " T " << tokens << " column "
                                 << k;
        }
      }
    }
  }
}

// auto keeps the widest cluster while the token groups fit at once (an H100 keeps 7 clusters of 16
// active: T = 7 stays at 16, T = 8 takes 8), widest never drops it, portable always takes 8; a
// device whose widest is the portable size (or none) keeps it.
TEST(HcFusedGrid, ClusterChoices) {
  constexpr int64_t kWide = kHcFusedWideCluster, kPortable = kHcFusedPortableCluster;
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kAuto, 1, kWide, 7), kWide);
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kAuto, 7, kWide, 7), kWide);
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kAuto, 8, kWide, 7), kPortable);
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kAuto, 8, kWide, 8), kWide);
  // Past 8 tokens a group is 4 tokens: 28 tokens are 7 groups, 29 are 8.
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kAuto, 28, kWide, 7), kWide);
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kAuto, 29, kWide, 7), kPortable);
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kWidest, 64, kWide, 7), kWide);
  EXPECT_EQ(hc_fused_cluster_for(HcClusterChoice::kPortable, 1, kWide, 7), kPortable);
  for (const HcClusterChoice c :
       {HcClusterChoice::kAuto, HcClusterChoice::kWidest, HcClusterChoice::kPortable}) {
    EXPECT_EQ(hc_fused_cluster_for(c, 64, kPortable, 14), kPortable);
    EXPECT_EQ(hc_fused_cluster_for(c, 1, 0, 0), 0);
  }
}

}  // namespace
}  // namespace deepinfer::cuda
