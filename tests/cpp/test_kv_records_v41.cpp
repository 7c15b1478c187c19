// DeepSeek-V4.1's KV records (tensor/kv_record.h, docs/model.md#kv-cache-dtypes): the FP8 SWA
// record (e4m3 + a UE8M0 scale per 32), the FP4 main record (e2m1 + an e4m3 scale per 16) and the
// FP4 index-key record (e2m1 + a UE8M0 scale per 32), pinned byte by byte, with their rounding
// rules ("Spec reading" in kv_record.h) and exact decoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/dtype.h"
#include "tensor/kv_record.h"

namespace deepinfer {
namespace {

using kv_record::RowCodec;
using testing::sz;

TEST(KvRecordV41, ByteCounts) {
  EXPECT_EQ(kv_record::v41_fp8_record_bytes(512), 528);       // 512 + 16
  EXPECT_EQ(kv_record::v41_fp4_main_record_bytes(512), 288);  // 256 + 32
  EXPECT_EQ(kv_record::v41_fp4_index_record_bytes(128), 68);  // 64 + 4
  EXPECT_EQ((RowCodec{DType::kF8E4M3, 512, 64}.row_bytes()), 528);
  EXPECT_EQ((RowCodec{DType::kE2M1x2, 512, 64}.row_bytes()), 288);
  EXPECT_EQ((RowCodec{DType::kE2M1x2, 128, 0}.row_bytes()), 68);
  // Partial last groups (tiny models): one scale each.
  EXPECT_EQ(kv_record::v41_fp8_record_bytes(40), 42);
  EXPECT_EQ(kv_record::v41_fp4_main_record_bytes(20), 12);
  EXPECT_EQ(kv_record::v41_fp4_index_record_bytes(16), 9);
}

TEST(KvRecordV41, E2m1RoundsToNearestTiesToEvenAndSaturates) {
  const std::vector<std::pair<float, uint8_t>> cases = {
      {0.0f, 0},  {0.25f, 0},  {0.26f, 1}, {0.75f, 2},  {1.25f, 2},  {1.3f, 3},
      {1.75f, 4}, {2.5f, 4},   {2.6f, 5},  {3.5f, 6},   {5.0f, 6},   {5.1f, 7},
      {6.0f, 7},  {100.0f, 7}, {-0.1f, 8}, {-1.0f, 10}, {-6.0f, 15}, {-7.0f, 15}};
  for (const auto& [v, code] : cases) EXPECT_EQ(kv_record::f32_to_e2m1(v), code) << v;
}

TEST(KvRecordV41, ScaleRules) {
  // UE8M0 over 6: the power of two at or above amax / 6.
  EXPECT_EQ(kv_record::fp4_ue8m0_scale(6.0f), 1.0f);
  EXPECT_EQ(kv_record::fp4_ue8m0_scale(6.1f), 2.0f);
  EXPECT_EQ(kv_record::fp4_ue8m0_scale(3.0f), 0.5f);
  // e4m3 over 6, rounded up: 7 / 6 = 1.1667 lies between e4m3 1.125 and 1.25.
  EXPECT_EQ(kv_record::fp4_e4m3_scale(7.0f), 1.25f);
  EXPECT_EQ(kv_record::fp4_e4m3_scale(3.0f), 0.5f);                  // exact
  EXPECT_EQ(kv_record::fp4_e4m3_scale(0.0f), std::ldexp(1.0f, -9));  // 1e-4 / 6 -> subnormal
  EXPECT_EQ(kv_record::fp4_e4m3_scale(1e9f), 448.0f);                // saturates
}

// x = {1, -2, 0.5, 3}: FP8 scale 2^-7 (e4m3 128, -256, 64, 384); FP4 scale 0.5 either way, so
// e2m1 {2, -4, 1, 6} = codes {4, 14, 2, 7}, packed low nibble first: 0xE4, 0x72.
TEST(KvRecordV41, RecordsPinnedByteByByte) {
  const float x[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  struct Case {
    DType dtype;
    int rope;
    std::vector<uint8_t> want;
  };
  const std::vector<Case> cases = {
      {DType::kF8E4M3, 2, {0x70, 0xF8, 0x68, 0x7C, 0x78}},  // scale byte 127 - 7
      {DType::kE2M1x2, 2, {0xE4, 0x72, 0x30}},              // e4m3 0.5 = 0x30
      {DType::kE2M1x2, 0, {0xE4, 0x72, 0x7E}},              // UE8M0 0.5 = 126
  };
  for (const Case& c : cases) {
    const RowCodec codec{c.dtype, 4, c.rope};
    std::vector<uint8_t> rec(sz(codec.row_bytes()), 0xAA);
    codec.encode(x, rec.data());
    EXPECT_EQ(rec, c.want) << dtype_name(c.dtype) << " rope " << c.rope;
    float back[4];
    codec.decode(rec.data(), back);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], x[i]) << i;
  }
  // The FP4 main scale rounds up: amax 7 gives 1.25 (0x3A), 7 / 1.25 = 5.6 -> 6 -> 7.5.
  const float y[2] = {7.0f, -0.3f};
  const RowCodec main{DType::kE2M1x2, 2, 1};
  std::vector<uint8_t> rec(sz(main.row_bytes()));
  main.encode(y, rec.data());
  EXPECT_EQ(rec, (std::vector<uint8_t>{0x87, 0x3A}));  // -0.3 / 1.25 = -0.24 -> -0 (0x8)
  float back[2];
  main.decode(rec.data(), back);
  EXPECT_EQ(back[0], 7.5f);
  EXPECT_EQ(back[1], 0.0f);
}

// Values on each record's grid (its element values times the group's scale, the group's amax
// setting exactly that scale) come back exactly.
TEST(KvRecordV41, GridValuesRoundTripExactly) {
  testing::Rng rng(5);
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  auto pick_e2m1 = [&] {
    const float u = rng.uniform(1, 0, 16)[0];
    const int i = std::min(15, static_cast<int>(u));
    return (i & 8) != 0 ? -e2m1[i & 7] : e2m1[i & 7];
  };
  struct Case {
    DType dtype;
    int dim, rope, group;
  };
  for (const Case& c : {Case{DType::kF8E4M3, 512, 64, 32}, Case{DType::kE2M1x2, 512, 64, 16},
                        Case{DType::kE2M1x2, 128, 0, 32}}) {
    std::vector<float> x(sz(c.dim));
    for (int g = 0; g < c.dim / c.group; ++g) {
      // FP8 and the index record: powers of two; the main record: e4m3 values.
      const float scale = c.dtype == DType::kE2M1x2 && c.rope > 0
                              ? round_to_f8e4m3(std::ldexp(1.0f + 0.125f * (g % 8), g % 7 - 4))
                              : std::ldexp(1.0f, g % 9 - 5);
      for (int i = 0; i < c.group; ++i) {
        const float v =
            c.dtype == DType::kF8E4M3 ? round_to_f8e4m3(rng.uniform(1, -448, 448)[0]) : pick_e2m1();
        x[sz(g * c.group + i)] = v * scale;
      }
      x[sz(g * c.group + 3)] = (c.dtype == DType::kF8E4M3 ? 448.0f : -6.0f) * scale;
    }
    const RowCodec codec{c.dtype, c.dim, c.rope};
    std::vector<uint8_t> rec(sz(codec.row_bytes()));
    std::vector<float> back(sz(c.dim));
    codec.encode(x.data(), rec.data());
    codec.decode(rec.data(), back.data());
    EXPECT_EQ(back, x) << dtype_name(c.dtype) << " rope " << c.rope;
  }
}

// Off the grid: FP8 keeps 3 mantissa bits (relative error <= 2^-4, plus 2^-10 scale below the
// normal range); FP4 is within half of e2m1's widest gap (1 scale unit) and never clips (the
// scales round up).
TEST(KvRecordV41, RandomValuesStayWithinTheFormatsError) {
  testing::Rng rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> x = rng.uniform(64, -3, 3);
    x[sz(trial % 64)] *= 50.0f;
    for (const auto& [dtype, rope, group] :
         {std::tuple{DType::kF8E4M3, 8, 32}, std::tuple{DType::kE2M1x2, 8, 16},
          std::tuple{DType::kE2M1x2, 0, 32}}) {
      const RowCodec codec{dtype, 64, rope};
      std::vector<uint8_t> rec(sz(codec.row_bytes()));
      std::vector<float> back(64);
      codec.encode(x.data(), rec.data());
      codec.decode(rec.data(), back.data());
      for (int g = 0; g < 64 / group; ++g) {
        float amax = 0;
        for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[sz(g * group + i)]));
        for (int i = 0; i < group; ++i) {
          const int c = g * group + i;
          const float err = std::fabs(back[sz(c)] - x[sz(c)]);
          if (dtype == DType::kF8E4M3) {
            const float scale = kv_record::fp8_scale(amax);
            EXPECT_LE(err, std::fabs(x[sz(c)]) * 0.0625f + scale * std::ldexp(1.0f, -10)) << c;
          } else {
            const float scale =
                rope > 0 ? kv_record::fp4_e4m3_scale(amax) : kv_record::fp4_ue8m0_scale(amax);
            EXPECT_LE(amax, 6.0f * scale);
            EXPECT_LE(err, scale) << c;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
