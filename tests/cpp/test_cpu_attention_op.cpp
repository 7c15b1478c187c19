// The CPU backend's attention op against a double-precision reference over the worlds of
// cpu_cache_history.h: sliding keys from the ring and this call's rows, dense and sparse
// compressed entries from the paged cache, sinks, YOCO's per-sequence window bound, bf16 q, and
// the errors the op raises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cpu_cache_history.h"
#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

using testing::CpuAttentionTest;
using testing::expect_close;
using testing::fetch_f32;
using testing::History;
using testing::host_f32;
using testing::HostLayout;
using testing::PagedEntries;
using testing::SeqSpec;
using testing::sz;

// ---- attention ---------------------------------------------------------------------------------

struct AttnWorld {
  std::vector<SeqSpec> seqs;
  int64_t heads, D, W, R;
  History kv;
  HostLayout hl;
  std::vector<float> q, sinks;
};

std::vector<double> ref_attention(const AttnWorld& a, const PagedEntries* pe, int ratio,
                                  const std::vector<int32_t>* topk, int64_t topk_cols, double scale,
                                  const std::vector<int32_t>* swa_start = nullptr) {
  std::vector<double> out;
  for (int t = 0; t < a.hl.num_tokens(); ++t) {
    const size_t b = sz(a.hl.token_seq[sz(t)]);
    const int64_t p = a.hl.positions[sz(t)];
    std::vector<const float*> keys;
    const int64_t lo = std::max<int64_t>({0, p - a.W + 1, swa_start ? (*swa_start)[b] : 0});
    for (int64_t j = lo; j <= p; ++j) keys.push_back(a.kv.at(b, j));
    if (ratio > 0) {
      if (topk == nullptr) {
        for (int64_t j = 0; j < (p + 1) / ratio; ++j) {
          keys.push_back(pe->entries[b].data() + j * a.D);
        }
      } else {
        for (int64_t k = 0; k < topk_cols; ++k) {
          const int32_t j = (*topk)[sz(t * topk_cols + k)];
          if (j >= 0) keys.push_back(pe->entries[b].data() + j * a.D);
        }
      }
    }
    for (int64_t h = 0; h < a.heads; ++h) {
      const float* qh = a.q.data() + (t * a.heads + h) * a.D;
      std::vector<double> l;
      double mx = a.sinks[sz(h)];
      for (const float* k : keys) {
        double d = 0;
        for (int64_t c = 0; c < a.D; ++c) d += double(qh[c]) * k[c];
        l.push_back(d * scale);
        mx = std::max(mx, l.back());
      }
      double den = std::exp(a.sinks[sz(h)] - mx);
      for (double v : l) den += std::exp(v - mx);
      for (int64_t c = 0; c < a.D; ++c) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += std::exp(l[j] - mx) / den * keys[j][c];
        out.push_back(o);
      }
    }
  }
  return out;
}

class CpuAttentionOpTest : public CpuAttentionTest {
 protected:
  AttnWorld world(std::vector<SeqSpec> seqs, int64_t heads, int64_t D, int64_t W, int64_t R,
                  int block, int max_blocks, std::vector<int32_t> table) {
    History kv(rng, seqs, D);
    HostLayout hl(seqs, block, max_blocks, std::move(table));
    auto q = rng.uniform(sz(hl.num_tokens() * heads * D));
    auto sinks = rng.uniform(sz(heads), -1, 2);
    return AttnWorld{seqs, heads, D, W, R, kv, hl, q, sinks};
  }
  // q_dtype: q uploaded as f32, or as bf16 (rounded to nearest even by the upload).
  Tensor run(const AttnWorld& a, int64_t slots, const PagedEntries* pe, const Tensor& topk,
             AttentionSpec spec, DType q_dtype = DType::kF32) {
    const int64_t T = a.hl.num_tokens();
    Tensor entries = pe ? up(pe->cache, {int64_t(pe->num_blocks) * pe->epb, a.D}) : Tensor();
    const Tensor q = be->upload(host_f32(a.q, {T, a.heads, a.D}), q_dtype);
    return be->attention(q, up(a.kv.chunk(a.seqs), {T, a.D}),
                         up(a.kv.ring(rng, a.seqs, slots, a.R), {slots, a.R, a.D}), entries, topk,
                         up(a.sinks, {a.heads}), a.hl.upload(*be), spec);
  }
};

TEST_F(CpuAttentionOpTest, SlidingOnly) {
  // seq 1 reads keys from a wrapped ring; seq 0 starts at position 0; seq 2 is a chunk longer
  // than the window.
  AttnWorld a = world({{3, 2, 1}, {37, 1, 0}, {20, 12, 2}}, 3, 16, 8, 10, 8, 1, {});
  const float scale = 0.3f;
  Tensor got = run(a, 3, nullptr, Tensor(), AttentionSpec{8, scale, 0, false});
  expect_close(fetch_f32(*be, got), ref_attention(a, nullptr, 0, nullptr, 0, scale), 1e-5, 1e-6);
}

TEST_F(CpuAttentionOpTest, DenseCompressed) {
  const int ratio = 4, block = 8;
  std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 9, 1}};
  PagedEntries pe(rng, {5 / ratio, 38 / ratio, 29 / ratio}, block / ratio, 16, 5);
  AttnWorld a = world(seqs, 3, 16, 8, 10, block, pe.max_blocks, pe.table);
  const float scale = 0.25f;
  Tensor got = run(a, 3, &pe, Tensor(), AttentionSpec{8, scale, ratio, false});
  expect_close(fetch_f32(*be, got), ref_attention(a, &pe, ratio, nullptr, 0, scale), 1e-5, 1e-6);
}

TEST_F(CpuAttentionOpTest, SparseCompressed) {
  const int ratio = 4, block = 8, K = 4;
  std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 9, 1}};
  PagedEntries pe(rng, {5 / ratio, 38 / ratio, 29 / ratio}, block / ratio, 16, 5);
  AttnWorld a = world(seqs, 2, 16, 8, 10, block, pe.max_blocks, pe.table);
  // Random visible entries per token, in random order, with -1 anywhere.
  std::vector<int32_t> topk;
  for (int t = 0; t < a.hl.num_tokens(); ++t) {
    const int n = (a.hl.positions[sz(t)] + 1) / ratio;
    std::vector<int32_t> pick(sz(n));
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng.engine());
    pick.resize(sz(std::min(n, rng.range(0, K))));
    pick.resize(sz(K), -1);
    std::shuffle(pick.begin(), pick.end(), rng.engine());
    topk.insert(topk.end(), pick.begin(), pick.end());
  }
  const int64_t T = a.hl.num_tokens();
  const float scale = 0.4f;
  Tensor got = run(a, 3, &pe, up_i(topk, {T, K}), AttentionSpec{8, scale, ratio, true});
  expect_close(fetch_f32(*be, got), ref_attention(a, &pe, ratio, &topk, K, scale), 1e-5, 1e-6);
  // An entry the token cannot see yet is rejected.
  std::vector<int32_t> future(sz(T * K), -1);
  future[0] = 3;  // token 0 is at position 0: nothing visible
  expect_error(
      [&] {
        run(a, 3, &pe, up_i(future, {T, K}), AttentionSpec{8, scale, ratio, true});
      },
      ErrorCode::kInvalidArgument, "not visible");
}

// bf16 q (a device's rms_norm_rope under bf16_output) is widened exactly: the result is that of
// f32 q holding the rounded values, bit for bit. Other dtypes are refused by name.
TEST_F(CpuAttentionOpTest, Bf16QueryIsWidenedExactly) {
  const int ratio = 4, block = 8;
  std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 9, 1}};
  PagedEntries pe(rng, {5 / ratio, 38 / ratio, 29 / ratio}, block / ratio, 16, 5);
  AttnWorld a = world(seqs, 3, 16, 8, 10, block, pe.max_blocks, pe.table);
  for (float& v : a.q) v = bf16_to_f32(f32_to_bf16(v));
  const AttentionSpec spec{8, 0.25f, ratio, false};
  const Tensor q_bf16 = be->upload(host_f32(a.q, {a.hl.num_tokens(), a.heads, a.D}), DType::kBF16);
  EXPECT_EQ(q_bf16.dtype(), DType::kBF16);
  EXPECT_EQ(fetch_f32(*be, run(a, 3, &pe, Tensor(), spec, DType::kBF16)),
            fetch_f32(*be, run(a, 3, &pe, Tensor(), spec)));
  const int64_t T = a.hl.num_tokens();
  const Tensor q_i32 = up_i(std::vector<int32_t>(sz(T * a.heads * a.D), 1), {T, a.heads, a.D});
  expect_error(
      [&] {
        be->attention(q_i32, up(a.kv.chunk(a.seqs), {T, a.D}),
                      up(a.kv.ring(rng, a.seqs, 3, a.R), {3, a.R, a.D}),
                      up(pe.cache, {int64_t(pe.num_blocks) * pe.epb, a.D}), Tensor(),
                      up(a.sinks, {a.heads}), a.hl.upload(*be), spec);
      },
      ErrorCode::kInvalidArgument, "attention: argument q");
}

TEST_F(CpuAttentionOpTest, SingleDecodeTokenLongContext) {
  const int ratio = 16, block = 32;
  std::vector<SeqSpec> seqs = {{300, 1, 0}};
  PagedEntries pe(rng, {301 / ratio}, block / ratio, 32, 10);
  AttnWorld a = world(seqs, 8, 32, 16, 16, block, pe.max_blocks, pe.table);
  Tensor got = run(a, 1, &pe, Tensor(), AttentionSpec{16, 0.1f, ratio, false});
  expect_close(fetch_f32(*be, got), ref_attention(a, &pe, ratio, nullptr, 0, 0.1), 1e-5, 1e-6);
}

// YOCO truncation's per-sequence lower bound: seq 0 unbounded, seq 1 (a decode row) bounded
// inside its window, seq 2 (a chunk) bounded in the middle of the chunk, so its first rows see
// no sliding key at all (only their compressed entries).
TEST_F(CpuAttentionOpTest, SwaStartNarrowsTheSlidingWindow) {
  const int ratio = 4, block = 8;
  std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 9, 1}};
  PagedEntries pe(rng, {5 / ratio, 38 / ratio, 29 / ratio}, block / ratio, 16, 5);
  AttnWorld a = world(seqs, 3, 16, 8, 10, block, pe.max_blocks, pe.table);
  const std::vector<int32_t> start = {0, 34, 24};
  AttentionSpec spec{8, 0.25f, ratio, false};
  spec.swa_start = up_i(start, {3});
  Tensor got = run(a, 3, &pe, Tensor(), spec);
  expect_close(fetch_f32(*be, got), ref_attention(a, &pe, ratio, nullptr, 0, 0.25, &start), 1e-5,
               1e-6);
  // Sliding only: rows before the bound see the sink alone, so their output is zero.
  AttentionSpec sliding{8, 0.25f, 0, false};
  sliding.swa_start = spec.swa_start;
  got = run(a, 3, nullptr, Tensor(), sliding);
  const std::vector<double> want = ref_attention(a, nullptr, 0, nullptr, 0, 0.25, &start);
  expect_close(fetch_f32(*be, got), want, 1e-5, 1e-6);
  EXPECT_EQ(want[sz(6 * 3 * 16)], 0.0);  // seq 2's first row, position 20 < 24
  // The bound must have one entry per sequence.
  sliding.swa_start = up_i(std::vector<int32_t>{0, 0}, {2});
  expect_error([&] { run(a, 3, nullptr, Tensor(), sliding); }, ErrorCode::kInvalidArgument,
               "spec.swa_start");
}

// output_rope_inv_freq rotates the output's last 2R channels back at each query's position: the
// result is rope(attention, positions, inv_freq, inverse) bit for bit. An inv_freq longer than half
// the head dim is refused by name.
TEST_F(CpuAttentionOpTest, OutputRopeRotatesTheOutputBack) {
  const int ratio = 4, block = 8;
  std::vector<SeqSpec> seqs = {{0, 5, 2}, {37, 1, 0}, {20, 9, 1}};
  PagedEntries pe(rng, {5 / ratio, 38 / ratio, 29 / ratio}, block / ratio, 16, 5);
  AttnWorld a = world(seqs, 3, 16, 8, 10, block, pe.max_blocks, pe.table);
  const std::vector<float> inv_freq = {1.0f, 0.31f, 0.097f};  // the last 6 of 16 channels
  AttentionSpec spec{8, 0.25f, ratio, false};
  const Tensor plain = run(a, 3, &pe, Tensor(), spec);
  const Tensor positions = up_i(a.hl.positions, {a.hl.num_tokens()});
  const Tensor want = be->rope(plain, positions, up(inv_freq, {3}), /*inverse=*/true);
  spec.output_rope_inv_freq = up(inv_freq, {3});
  const Tensor got = run(a, 3, &pe, Tensor(), spec);
  EXPECT_EQ(got.dtype(), DType::kF32);
  const std::vector<float> got_host = fetch_f32(*be, got);
  EXPECT_EQ(got_host, fetch_f32(*be, want));
  EXPECT_NE(got_host, fetch_f32(*be, plain));  // the rotation moved something
  spec.output_rope_inv_freq = up(std::vector<float>(9, 0.5f), {9});
  expect_error([&] { run(a, 3, &pe, Tensor(), spec); }, ErrorCode::kInvalidArgument,
               "spec.output_rope_inv_freq");
}

TEST_F(CpuAttentionOpTest, SwaStartSparesRingPositionsBeforeIt) {
  // 7 past keys would be needed and the ring holds 4, but the bound hides all but 3 of them.
  AttnWorld a = world({{30, 1, 0}}, 1, 8, 8, 4, 8, 1, {});
  const std::vector<int32_t> start = {27};
  AttentionSpec spec{8, 1.0f, 0, false};
  spec.swa_start = up_i(start, {1});
  Tensor got = run(a, 1, nullptr, Tensor(), spec);
  expect_close(fetch_f32(*be, got), ref_attention(a, nullptr, 0, nullptr, 0, 1.0, &start), 1e-5,
               1e-6);
}

TEST_F(CpuAttentionOpTest, RingTooShortIsAnInternalError) {
  AttnWorld a = world({{30, 1, 0}}, 1, 8, 8, 4, 8, 1, {});  // needs 7 past keys, ring holds 4
  expect_error(
      [&] {
        run(a, 1, nullptr, Tensor(), AttentionSpec{8, 1.0f, 0, false});
      },
      ErrorCode::kInternal, "SWA ring");
}

TEST_F(CpuAttentionOpTest, LayoutPositionsMustFollowContext) {
  AttnWorld a = world({{5, 2, 0}}, 1, 8, 4, 8, 8, 1, {});
  a.hl.positions[1] = 9;
  expect_error(
      [&] {
        run(a, 1, nullptr, Tensor(), AttentionSpec{4, 1.0f, 0, false});
      },
      ErrorCode::kInvalidArgument, "layout.positions[1]");
}

}  // namespace
}  // namespace deepinfer
