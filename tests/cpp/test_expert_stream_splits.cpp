// The K splits of the streaming expert decode kernels (cuda/moe/sm80/experts_quant_config.h:
// expert_stream_splits), checked on the host: a pass with few CTAs for the SMs splits K (V4-Flash
// at B = 1 on 132 SMs: two splits of both GEMMs), a full one does not, and every split keeps at
// least kExpertStreamMinSplitSlices slices; the narrow shape (four CTAs per SM, 8-row tiles) is
// taken only by passes of at most 8 tokens on one activation plane with K whole slices.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/moe/sm80/experts_quant_config.h"

namespace deepinfer::cuda {
namespace {

TEST(ExpertStreamSplits, FewCtasSplitKAndFullPassesDoNot) {
  // B = 1, top-6: 7 tiles (the host's bound), 16 column blocks of gate/up (I 2048, 128 columns
  // per CTA) and of down (H 4096, 256 rows); K 4096 (32 slices) and 2048 (16).
  EXPECT_EQ(expert_stream_splits(7 * 16, 32, 132), 2);
  EXPECT_EQ(expert_stream_splits(7 * 16, 16, 132), 2);
  // B = 2: 13 tiles fill more than half the slots of two CTAs per SM.
  EXPECT_EQ(expert_stream_splits(13 * 16, 32, 132), 1);
  // B = 64: thousands of CTAs.
  EXPECT_EQ(expert_stream_splits(640 * 16, 32, 132), 1);
  // Few CTAs on many SMs: up to kExpertStreamMaxSplits.
  EXPECT_EQ(expert_stream_splits(10, 32, 132), kExpertStreamMaxSplits);
  // Too few slices to split, and no SM count (a caller that never splits).
  EXPECT_EQ(expert_stream_splits(10, 2 * kExpertStreamMinSplitSlices - 1, 132), 1);
  EXPECT_EQ(expert_stream_splits(10, 32, 0), 1);
}

TEST(ExpertStreamSplits, TheNarrowShapeFillsFourCtasPerSm) {
  // B = 1 on the narrow shape: twice the column blocks (gate/up 64 columns per CTA, down 128
  // rows), four CTAs per SM: still two splits, 448 CTAs in 528 slots.
  EXPECT_EQ(expert_stream_splits(7 * 32, 32, 132, 4), 2);
  EXPECT_EQ(expert_stream_splits(7 * 32, 16, 132, 4), 2);
  // Top-2: 3 tiles, four splits on either shape.
  EXPECT_EQ(expert_stream_splits(3 * 16, 32, 132), 4);
  EXPECT_EQ(expert_stream_splits(3 * 32, 32, 132, 4), 4);
}

TEST(ExpertStreamSplits, NarrowTilesTakeAtMostEightTokensOnOnePlaneAndWholeSlices) {
  // V4-Flash (H 4096, I 2048) with quantized activations at B = 1 .. 8.
  for (int64_t tokens = 1; tokens <= 8; ++tokens) {
    EXPECT_TRUE(expert_stream_narrow_tiles(tokens, true, 4096, 2048)) << tokens;
  }
  // Nine tokens: an expert could get 9 pairs, two 8-row tiles of its weights.
  EXPECT_FALSE(expert_stream_narrow_tiles(ExpertQuantStreamMxNarrow::kTok + 1, true, 4096, 2048));
  // Three activation planes: four rings do not fit an SM.
  EXPECT_FALSE(expert_stream_narrow_tiles(1, false, 4096, 2048));
  // A K tail in either GEMM: the lean kernel does not take it.
  EXPECT_FALSE(expert_stream_narrow_tiles(1, true, 4096 + 32, 2048));
  EXPECT_FALSE(expert_stream_narrow_tiles(1, true, 4096, 2048 + 32));
}

TEST(ExpertStreamSplits, EverySplitKeepsSlicesAndTheCtasFitTheSlots) {
  for (const int per_sm : {2, 4}) {
    for (const int sms : {1, 8, 78, 132}) {
      for (int64_t ctas = 1; ctas <= 600; ctas += 7) {
        for (int64_t slices = 1; slices <= 70; ++slices) {
          const int s = expert_stream_splits(ctas, slices, sms, per_sm);
          ASSERT_GE(s, 1);
          ASSERT_LE(s, kExpertStreamMaxSplits);
          if (s == 1) continue;
          EXPECT_LE(ctas * s, per_sm * sms) << ctas << " CTAs, " << sms << " SMs";
          // The kernel's ranges: ceil(slices / s) each, the last one what is left.
          const int64_t per = (slices + s - 1) / s;
          EXPECT_GE(slices - (s - 1) * per, 1) << slices << " slices in " << s;
          EXPECT_GE(per, kExpertStreamMinSplitSlices);
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda
