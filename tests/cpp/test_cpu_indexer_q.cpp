// The indexer's fp8 q (tensor/indexer_q.h, Backend::quantize_indexer_q): DeepSeek's act_quant of
// each (token, head) row to e4m3 with a power-of-two scale folded into the head weights, on the
// CPU backend (the oracle of the device's). The row round trip, the op against the host rule,
// a case where fp8 q ranks differently from the exact q, and indexer_topk over the pair against
// scores computed on the host from the dequantized q.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/dtype.h"
#include "tensor/indexer_q.h"

namespace deepinfer {
namespace {

using testing::fetch_f32;
using testing::fetch_i32;
using testing::HostLayout;
using testing::SeqSpec;
using testing::sz;

// e4m3 of q / s, s = 2^ceil(log2(max(amax, 1e-4) / 448)): amax / s in (224, 448], each code the
// nearest e4m3 value, and the scale exact in the round trip (codes * s).
TEST(IndexerQ, RowRoundTrip) {
  testing::Rng rng(7);
  for (const float range : {1e-3f, 0.5f, 3.0f, 1000.0f}) {
    const std::vector<float> q = rng.uniform(128, -range, range);
    std::vector<uint8_t> codes(128);
    const float s = indexer_q::quantize_row(q.data(), 128, codes.data());
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two";
    float amax = 0.0f;
    for (const float x : q) amax = std::max(amax, std::fabs(x));
    EXPECT_GT(amax / s, 224.0f) << range;
    EXPECT_LE(amax / s, 448.0f) << range;
    for (size_t c = 0; c < q.size(); ++c) {
      EXPECT_EQ(f8e4m3_to_f32(codes[c]), round_to_f8e4m3(q[c] / s)) << c;
      // Within half an e4m3 step of the value: 2^-4 relative, or the subnormal step.
      EXPECT_LE(std::fabs(f8e4m3_to_f32(codes[c]) * s - q[c]),
                std::max(std::fabs(q[c]) * 0x1p-4f, 0x1p-10f * s))
          << c;
    }
  }
  // A zero row: the 1e-4 floor of the scale, all codes zero.
  std::vector<float> zero(128, 0.0f);
  std::vector<uint8_t> codes(128, 0xff);
  EXPECT_EQ(indexer_q::quantize_row(zero.data(), 128, codes.data()), std::ldexp(1.0f, -22));
  EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0; }));
}

class IndexerQOp : public testing::BackendTest {};

TEST_F(IndexerQOp, MatchesTheHostRule) {
  const int64_t T = 5, heads = 4, Di = 32;
  std::vector<float> q = rng.uniform(sz(T * heads * Di), -3, 3);
  for (int64_t c = 0; c < Di; ++c) q[sz(2 * Di + c)] = 0.0f;  // a zero row
  const std::vector<float> w = rng.uniform(sz(T * heads));
  const IndexerQFp8 out = be->quantize_indexer_q(up(q, {T, heads, Di}), up(w, {T, heads}));
  be->synchronize();
  ASSERT_EQ(out.q.dtype(), DType::kF8E4M3);
  EXPECT_EQ(out.q.shape(), (Shape{T, heads, Di}));
  const Tensor codes = be->to_host(out.q);
  const std::vector<float> w8 = fetch_f32(*be, out.weights);
  for (int64_t r = 0; r < T * heads; ++r) {
    std::vector<uint8_t> want(sz(Di));
    const float s = indexer_q::quantize_row(q.data() + r * Di, Di, want.data());
    EXPECT_EQ(
        std::memcmp(static_cast<const uint8_t*>(codes.raw_data()) + r * Di, want.data(), sz(Di)), 0)
        << "row " << r;
    EXPECT_EQ(w8[sz(r)], w[sz(r)] * s) << "row " << r;
  }
  EXPECT_THROW(be->quantize_indexer_q(up(q, {T * heads, Di}), up(w, {T, heads})), Error);
}

// One head, two keys along channels 0 and 1, q = (1, 1 + 2^-6): exact q ranks entry 1 first;
// in fp8 both channels round to 256 (steps of 32 there) and the tie goes to entry 0.
TEST_F(IndexerQOp, Fp8QRanksWhereTheExactOneDiffers) {
  const int ratio = 4, block = 8, Di = 8;
  HostLayout hl({{7, 1, 0}}, block, 1, {1});  // position 7: entries 0 and 1
  std::vector<float> cache(sz(2 * 2 * Di), 0.0f);
  cache[sz(2 * Di + 0)] = 1.0f;  // block 1, entry 0: channel 0
  cache[sz(3 * Di + 1)] = 1.0f;  // block 1, entry 1: channel 1
  std::vector<float> q(sz(Di), 0.0f);
  q[0] = 1.0f;
  q[1] = 1.0f + 0x1p-6f;
  const Tensor qd = up(q, {1, 1, Di}), wd = up({1.0f}, {1, 1}), cd = up(cache, {4, Di});
  const BatchLayout l = hl.upload(*be);
  EXPECT_EQ(fetch_i32(*be, be->indexer_topk(qd, wd, cd, l, ratio, 1, 1.0f, 1.0f)),
            std::vector<int32_t>{1});
  const IndexerQFp8 q8 = be->quantize_indexer_q(qd, wd);
  EXPECT_EQ(fetch_i32(*be, be->indexer_topk(q8.q, q8.weights, cd, l, ratio, 1, 1.0f, 1.0f)),
            std::vector<int32_t>{0});
}

// indexer_topk over (codes, scaled weights) chooses the entries of the top scores computed on the
// host (double) from the dequantized q and the original weights; an f32 cache of random keys.
TEST_F(IndexerQOp, TopKOverTheFp8QMatchesHostScores) {
  const int ratio = 4, block = 16, epb = block / ratio;
  const int64_t heads = 4, Di = 32;
  const int blocks = 8, top_k = 6;
  std::vector<int32_t> table(sz(2 * blocks));
  for (int i = 0; i < 2 * blocks; ++i) table[sz(i)] = 2 * blocks - i;  // reversed, block 0 unused
  HostLayout hl({{120, 1, 0}, {60, 3, 1}}, block, blocks, table);
  const int T = hl.num_tokens();
  const std::vector<float> q = rng.uniform(sz(T * heads * Di), -2, 2);
  const std::vector<float> w = rng.uniform(sz(T * heads));
  const int64_t rows = int64_t{2 * blocks + 1} * epb;
  const std::vector<float> keys = rng.uniform(sz(rows * Di));
  const float sscale = 0.17f, wscale = 0.5f;
  const IndexerQFp8 q8 = be->quantize_indexer_q(up(q, {T, heads, Di}), up(w, {T, heads}));
  const std::vector<int32_t> got =
      fetch_i32(*be, be->indexer_topk(q8.q, q8.weights, up(keys, {rows, Di}), hl.upload(*be), ratio,
                                      top_k, sscale, wscale));
  for (int t = 0; t < T; ++t) {
    const size_t b = sz(hl.token_seq[sz(t)]);
    const int n = (hl.positions[sz(t)] + 1) / ratio;
    std::vector<double> score(sz(n));
    for (int j = 0; j < n; ++j) {
      const int64_t row = int64_t{table[b * blocks + sz(j / epb)]} * epb + j % epb;
      double s = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = q.data() + (t * heads + h) * Di;
        std::vector<uint8_t> codes(sz(Di));
        const float qs = indexer_q::quantize_row(qh, Di, codes.data());
        double d = 0;
        for (int64_t c = 0; c < Di; ++c) {
          d += double(f8e4m3_to_f32(codes[sz(c)])) * qs * keys[sz(row * Di + c)];
        }
        s += double(w[sz(t * heads + h)]) * wscale * std::max(d, 0.0) * sscale;
      }
      score[sz(j)] = s;
    }
    std::vector<double> sorted = score;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (int k = 0; k < top_k; ++k) {
      const int32_t idx = got[sz(t * top_k + k)];
      ASSERT_GE(idx, 0);
      ASSERT_LT(idx, n);
      EXPECT_NEAR(score[sz(idx)], sorted[sz(k)], 1e-5) << "token " << t << " rank " << k;
    }
  }
}

}  // namespace
}  // namespace deepinfer
