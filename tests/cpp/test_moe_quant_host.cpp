// Host checks of the quantized experts' decode kernels (cuda/moe/sm80/): the MXFP4 bit moves
// (experts_quant_decode.h) give every e2m1 value exactly, and the split K of the streaming kernel
// (experts_quant_config.h) cuts K into ranges that cover every slice once, in order, with a split
// count that at V4-Flash decode shapes (H 4096, I 2048, 132 SMs of an H200) splits the one-token
// step, leaves full batches alone and never makes a range shorter than the minimum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "cuda/moe/sm80/experts_quant_config.h"
#include "cuda/moe/sm80/experts_quant_decode.h"

namespace deepinfer::cuda {
namespace {

// The bf16 (as f32) whose bits are the high 16 of `bits`.
float bf16_value(uint32_t bits16) {
  const uint32_t f = bits16 << 16;
  float v = 0.0f;
  std::memcpy(&v, &f, sizeof(v));
  return v;
}

// e2m1 code c: sign bit 3, exponent bits 2..1, mantissa bit 0.
float e2m1_value(uint32_t c) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (c & 8u) != 0 ? -kMagnitude[c & 7u] : kMagnitude[c & 7u];
}

TEST(MoeQuantDecodeBits, PairBitsAreEveryNibbleTimes2ToMinus126) {
  std::mt19937 rng(7);
  for (int p = 0; p < 4; ++p) {
    for (uint32_t lo = 0; lo < 16; ++lo) {
      for (uint32_t hi = 0; hi < 16; ++hi) {
        for (int trial = 0; trial < 16; ++trial) {
          // Random other nibbles (they must not leak in), nibbles p and p + 4 set.
          uint32_t r = static_cast<uint32_t>(rng());
          r &= ~((0xFu << (4 * p)) | (0xFu << (4 * p + 16)));
          r |= (lo << (4 * p)) | (hi << (4 * p + 16));
          const uint32_t bits = quant_tile::e2m1_pair_bits(r, p);
          EXPECT_EQ(bf16_value(bits & 0xFFFFu), std::ldexp(e2m1_value(lo), -126))
              << "pair " << p << " nibble " << lo << " word " << r;
          EXPECT_EQ(bf16_value(bits >> 16), std::ldexp(e2m1_value(hi), -126))
              << "pair " << p << " nibble " << hi << " word " << r;
          // Zeros keep their sign bit: -0 decodes to the bf16 -0, as the weights' bytes say.
          EXPECT_EQ((bits >> 15) & 1u, lo >> 3);
          EXPECT_EQ(bits >> 31, hi >> 3);
        }
      }
    }
  }
}

TEST(MoeQuantSplit, RangesCoverEverySliceOnceInOrder) {
  for (int slices = 1; slices <= 40; ++slices) {
    for (int splits = 1; splits <= kExpertQuantStreamMaxSplits; ++splits) {
      int next = 0;
      for (int s = 0; s < splits; ++s) {
        const SliceRange r = split_slice_range(slices, splits, s);
        EXPECT_EQ(r.begin, next) << slices << " slices, split " << s << " of " << splits;
        EXPECT_GE(r.end, r.begin);
        // Balanced: lengths differ by one at most, longer ones first.
        EXPECT_LE(r.end - r.begin, slices / splits + 1);
        EXPECT_GE(r.end - r.begin, slices / splits);
        if (splits <= slices) {
          EXPECT_GT(r.end, r.begin);
        }
        next = r.end;
      }
      EXPECT_EQ(next, slices) << slices << " slices in " << splits;
    }
  }
}

constexpr int kSms = 132;
constexpr int64_t kGateUpCols = 2048 / 128;  // I / 128 SwiGLU columns per CTA
constexpr int64_t kDownCols = 4096 / 256;    // H / 256 rows per CTA
constexpr int64_t kGateUpSlices = 4096 / kQuantSliceK;
constexpr int64_t kDownSlices = 2048 / kQuantSliceK;

TEST(MoeQuantSplit, OneTokenDecodeSplitsBothGemms) {
  // 6 pairs over 6 experts: 96 CTAs unsplit. 4 ranges: 384 CTAs, at most 3 per SM, each a
  // quarter of K (0.75 of one whole-K CTA on the busiest SM, against 1.0 unsplit).
  EXPECT_EQ(choose_quant_stream_splits(6, kGateUpCols, kGateUpSlices, kSms), 4);
  EXPECT_EQ(choose_quant_stream_splits(6, kDownCols, kDownSlices, kSms), 4);
}

TEST(MoeQuantSplit, FullBatchesStayUnsplit) {
  // 64 tokens: at most min(280, 384) tiles, thousands of CTAs.
  EXPECT_EQ(choose_quant_stream_splits(280, kGateUpCols, kGateUpSlices, kSms), 1);
  EXPECT_EQ(choose_quant_stream_splits(280, kDownCols, kDownSlices, kSms), 1);
  // 4 tokens: 24 tiles, 384 CTAs, 2.9 per SM: splitting does not even the SMs out.
  EXPECT_EQ(choose_quant_stream_splits(24, kGateUpCols, kGateUpSlices, kSms), 1);
}

TEST(MoeQuantSplit, SplitsAreBoundedAndBalanceTheBusiestSm) {
  for (int64_t tiles = 1; tiles <= 64; ++tiles) {
    for (const int64_t slices :
         {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{9}, int64_t{16}, int64_t{32}, int64_t{64}}) {
      const int s = choose_quant_stream_splits(tiles, kGateUpCols, slices, kSms);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, kExpertQuantStreamMaxSplits);
      if (s > 1) {
        EXPECT_GE(slices / s, kExpertQuantStreamMinSplitSlices);
      }
      // No allowed count gives the busiest SM a smaller share of K (CTAs on it / splits).
      const int64_t ctas = tiles * kGateUpCols;
      const int64_t load = (ctas * s + kSms - 1) / kSms;
      for (int other = 1; other <= kExpertQuantStreamMaxSplits; ++other) {
        if (other > 1 && slices / other < kExpertQuantStreamMinSplitSlices) continue;
        const int64_t other_load = (ctas * other + kSms - 1) / kSms;
        EXPECT_LE(load * other, other_load * s)
            << tiles << " tiles, " << slices << " slices: " << s << " splits, not " << other;
      }
    }
  }
  EXPECT_EQ(choose_quant_stream_splits(0, kGateUpCols, kGateUpSlices, kSms), 1);
}

}  // namespace
}  // namespace deepinfer::cuda
