// The integer e4m3x2 -> f16x2 / bf16x2 conversions (cuda/common/e4m3_bits.h) that the indexer's
// scores and the attention producer's key decode use, checked on the host: the byte permute's
// host model; every pair of codes against the exact value of each code times the format's power
// of two (the NaN codes aside); and the attention decode built on the bf16 form (times 2^120,
// times the group's power-of-two scale, rounded to bf16 once) against the reference decode's
// bf16 for every code and every scale the KV writer stores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/e4m3_bits.h"
#include "deepinfer/dtype.h"

namespace deepinfer::cuda::e4m3_bits {
namespace {

// A 16-bit float format: the value of a finite bit pattern, exact in double.
struct Format {
  int mantissa_bits;
  int bias;
  int power;  // the conversion's factor: the code's value times 2^power
  double value(uint32_t bits) const {
    const uint32_t exponent = (bits & 0x7fffu) >> mantissa_bits;
    const double mantissa = static_cast<double>(bits & ((1u << mantissa_bits) - 1u));
    const int shift = 1 - bias - mantissa_bits;
    const double magnitude = exponent == 0 ? std::ldexp(mantissa, shift)
                                           : std::ldexp(std::ldexp(1.0, mantissa_bits) + mantissa,
                                                        shift + static_cast<int>(exponent) - 1);
    return (bits & 0x8000u) != 0 ? -magnitude : magnitude;
  }
};
constexpr Format kF16{10, 15, -8};
constexpr Format kBf16{7, 127, -120};

bool is_nan_code(uint32_t code) {
  return (code & 0x7fu) == 0x7fu;
}

// Half `half` of `x2` holds code's value times 2^power, with the code's sign (zeros included).
void expect_half(const Format& f, uint32_t x2, int half, uint32_t code) {
  const uint32_t bits = (x2 >> (16 * half)) & 0xffffu;
  const double want =
      std::ldexp(static_cast<double>(f8e4m3_to_f32(static_cast<uint8_t>(code))), f.power);
  ASSERT_EQ(f.value(bits), want) << "code " << code << ", " << f.mantissa_bits << "-bit mantissa";
  ASSERT_EQ((bits >> 15) & 1u, (code >> 7) & 1u) << "sign of code " << code;
  // The value times 2^power keeps the exponent field's top bit clear (f16: below 16).
  ASSERT_EQ((bits >> (f.mantissa_bits + 4)) & ((1u << (11 - f.mantissa_bits)) - 1u), 0u)
      << "exponent field of code " << code;
}

TEST(E4m3Bits, PrmtModelPicksAndReplicatesSigns) {
  EXPECT_EQ(prmt_model(0x44332211u, 0x88776655u, 0x3210u), 0x44332211u);
  EXPECT_EQ(prmt_model(0x44332211u, 0x88776655u, 0x7654u), 0x88776655u);
  EXPECT_EQ(prmt_model(0x000080ffu, 0u, 0x9180u), 0xff80ffffu);
  EXPECT_EQ(prmt_model(0x00007f01u, 0u, 0x9180u), 0x007f0001u);
}

TEST(E4m3Bits, FormatsReadTheirBitPatterns) {
  EXPECT_EQ(kF16.value(0x3c00u), 1.0);
  EXPECT_EQ(kF16.value(0x0001u), std::ldexp(1.0, -24));
  EXPECT_EQ(kBf16.value(0x3f80u), 1.0);
  EXPECT_EQ(kBf16.value(0xc040u), -3.0);
  EXPECT_EQ(kBf16.value(0x0001u), std::ldexp(1.0, -133));
  EXPECT_EQ(kBf16.value(kBf16TwoPow120), std::ldexp(1.0, 120));
}

TEST(E4m3Bits, EveryPairOfCodesConvertsExactly) {
  for (uint32_t lo = 0; lo < 256; ++lo) {
    for (uint32_t hi = 0; hi < 256; ++hi) {
      if (is_nan_code(lo) || is_nan_code(hi)) continue;
      // The pair in the low bytes (b0 = lo, b1 = hi), then in the high bytes (b2, b3), with other
      // codes beside it that must not leak in.
      const uint32_t low_word = lo | (hi << 8) | 0xa5c30000u;
      const uint32_t high_word = 0x5a3cu | (lo << 16) | (hi << 24);
      const uint32_t converted[2][2] = {
          {e4m3x2_to_f16x2_times_2m8<false>(low_word), e4m3x2_to_f16x2_times_2m8<true>(high_word)},
          {e4m3x2_to_bf16x2_times_2m120<false>(low_word),
           e4m3x2_to_bf16x2_times_2m120<true>(high_word)}};
      for (int f = 0; f < 2; ++f) {
        for (const uint32_t x2 : converted[f]) {
          expect_half(f == 0 ? kF16 : kBf16, x2, 0, lo);
          expect_half(f == 0 ? kF16 : kBf16, x2, 1, hi);
        }
      }
    }
  }
}

// The attention producer's decode: bf16(code) times 2^120 (exact), times the scale 2^(e - 127)
// rounded to bf16 once, against the reference: the code's f32 value times the scale, rounded to
// bf16 (what the CPU backend and the conversion-unit decode compute). Scales 2^-117 and up (e8m0
// 10 .. 254): below, the reference's f32 product may round before its bf16 rounding.
TEST(E4m3Bits, ScaledBf16DecodeEqualsTheReference) {
  for (uint32_t e = 10; e < 255; ++e) {
    const double scale = std::ldexp(1.0, static_cast<int>(e) - 127);
    for (uint32_t code = 0; code < 256; ++code) {
      if (is_nan_code(code)) continue;
      const uint32_t bits = e4m3x2_to_bf16x2_times_2m120<false>(code) & 0xffffu;
      const double product = kBf16.value(bits) * std::ldexp(1.0, 120) * scale;  // exact
      const float reference = f8e4m3_to_f32(static_cast<uint8_t>(code)) * static_cast<float>(scale);
      ASSERT_EQ(f32_to_bf16(static_cast<float>(product)), f32_to_bf16(reference))
          << "code " << code << ", scale byte " << e;
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda::e4m3_bits
