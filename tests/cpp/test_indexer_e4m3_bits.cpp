// The integer e4m3x2 -> f16x2 conversion and the persistent kernel's tile ranges
// (cuda/indexer/indexer_e4m3_bits.h), checked on the host: every pair of codes against the exact
// value of each code times 2^-8 (the NaN codes aside), through the host model of the byte permute
// the device runs; and the block ranges cover the flattened tiles once, in order, evenly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/indexer/indexer_e4m3_bits.h"
#include "deepinfer/dtype.h"

namespace deepinfer::cuda::indexer_e4m3 {
namespace {

// The value of an f16 bit pattern (all finite patterns; exact in double).
double f16_value(uint32_t bits) {
  const int exponent = static_cast<int>((bits >> 10) & 0x1fu);
  const double mantissa = static_cast<double>(bits & 0x3ffu);
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024.0 + mantissa, exponent - 25);
  return (bits & 0x8000u) != 0 ? -magnitude : magnitude;
}

bool is_nan_code(uint32_t code) {
  return (code & 0x7fu) == 0x7fu;
}

// Half `half` of `f16x2` holds code's value times 2^-8, with the code's sign (zeros included).
void expect_half(uint32_t f16x2, int half, uint32_t code) {
  const uint32_t bits = (f16x2 >> (16 * half)) & 0xffffu;
  const double want =
      std::ldexp(static_cast<double>(f8e4m3_to_f32(static_cast<uint8_t>(code))), -8);
  ASSERT_EQ(f16_value(bits), want) << "code " << code;
  ASSERT_EQ((bits >> 15) & 1u, (code >> 7) & 1u) << "sign of code " << code;
  ASSERT_EQ((bits >> 10) & 0x1fu, (bits >> 10) & 0xfu) << "exponent below 16 for code " << code;
}

TEST(IndexerE4m3Bits, PrmtModelPicksAndReplicatesSigns) {
  EXPECT_EQ(prmt_model(0x44332211u, 0x88776655u, 0x3210u), 0x44332211u);
  EXPECT_EQ(prmt_model(0x44332211u, 0x88776655u, 0x7654u), 0x88776655u);
  EXPECT_EQ(prmt_model(0x000080ffu, 0u, 0x9180u), 0xff80ffffu);
  EXPECT_EQ(prmt_model(0x00007f01u, 0u, 0x9180u), 0x007f0001u);
}

TEST(IndexerE4m3Bits, EveryPairOfCodesConvertsExactly) {
  for (uint32_t lo = 0; lo < 256; ++lo) {
    for (uint32_t hi = 0; hi < 256; ++hi) {
      if (is_nan_code(lo) || is_nan_code(hi)) continue;
      // The pair in the low bytes (b0 = lo, b1 = hi), then in the high bytes (b2, b3), with
      // other codes beside it that must not leak in.
      const uint32_t low_word = lo | (hi << 8) | 0xa5c30000u;
      const uint32_t high_word = 0x5a3cu | (lo << 16) | (hi << 24);
      const uint32_t a = e4m3x2_to_f16x2_times_2m8<false>(low_word);
      const uint32_t b = e4m3x2_to_f16x2_times_2m8<true>(high_word);
      expect_half(a, 0, lo);
      expect_half(a, 1, hi);
      expect_half(b, 0, lo);
      expect_half(b, 1, hi);
    }
  }
}

TEST(IndexerE4m3Bits, TileRangesCoverTheTilesOnceAndEvenly) {
  for (const int64_t total : {0, 1, 5, 128, 131, 132, 133, 8192, 32768 + 7}) {
    for (const int64_t ctas : {1, 7, 132}) {
      int64_t next = 0, least = total, most = 0;
      for (int64_t c = 0; c < ctas; ++c) {
        const TileRange r = persistent_tile_range(total, ctas, c);
        EXPECT_EQ(r.first, next) << total << " over " << ctas;
        EXPECT_GE(r.count, 0);
        next = r.first + r.count;
        least = std::min(least, r.count);
        most = std::max(most, r.count);
      }
      EXPECT_EQ(next, total) << total << " over " << ctas;
      EXPECT_LE(most - least, 1) << total << " over " << ctas;
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda::indexer_e4m3
