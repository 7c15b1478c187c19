// CPU backend cache ops and the indexer (ring_write, scatter_rows, compress_pool, indexer_topk)
// against double-precision references, over the worlds of cpu_cache_history.h (the attention op:
// test_cpu_attention_op.cpp).
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
using testing::fetch_i32;
using testing::History;
using testing::host_f32;
using testing::host_i32;
using testing::HostLayout;
using testing::PagedEntries;
using testing::Rng;
using testing::SeqSpec;
using testing::sz;

// ---- ring_write / scatter_rows -----------------------------------------------------------------

TEST_F(CpuAttentionTest, RingWriteKeepsTheLastRowsOfEachSequence) {
  const int64_t slots = 3, R = 4, C = 3;
  std::vector<SeqSpec> seqs = {{0, 6, 2}, {10, 1, 0}, {3, 2, 1}};  // seq 0 wraps the ring
  HostLayout hl(seqs, 8, 1);
  auto rows = rng.uniform(sz(hl.num_tokens() * C));
  auto ring = rng.uniform(sz(slots * R * C));
  Tensor ring_dev = up(ring, {slots, R, C});
  be->ring_write(ring_dev, up(rows, {hl.num_tokens(), C}), hl.upload(*be));
  std::vector<double> want(ring.begin(), ring.end());
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int end = hl.q_start[b + 1];
    for (int t = std::max(hl.q_start[b], end - int(R)); t < end; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        want[sz((seqs[b].slot * R + hl.positions[sz(t)] % R) * C + c)] = rows[sz(t * C + c)];
      }
    }
  }
  expect_close(fetch_f32(*be, ring_dev), want, 0, 0);
  // A slot outside the ring is a content error.
  HostLayout bad({{0, 1, 3}}, 8, 1);
  expect_error(
      [&] {
        be->ring_write(ring_dev, up(rng.uniform(C), {1, C}), bad.upload(*be));
      },
      ErrorCode::kInvalidArgument, "seq_slot");
}

TEST_F(CpuAttentionTest, ScatterRows) {
  auto cache = rng.uniform(10 * 4);
  auto rows = rng.uniform(3 * 4);
  Tensor cache_dev = up(cache, {10, 4});
  be->scatter_rows(cache_dev, up(rows, {3, 4}), up_i({7, 0, 9}, {3}));
  std::vector<double> want(cache.begin(), cache.end());
  const int dest[] = {7, 0, 9};
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 4; ++c) want[sz(dest[i] * 4 + c)] = rows[sz(i * 4 + c)];
  }
  expect_close(fetch_f32(*be, cache_dev), want, 0, 0);
  be->scatter_rows(cache_dev, up({}, {0, 4}), up_i({}, {0}));  // nothing to store
  expect_error(
      [&] {
        be->scatter_rows(cache_dev, up(rows, {3, 4}), up_i({1, 10, 2}, {3}));
      },
      ErrorCode::kInvalidArgument, "dest[1] = 10");
  expect_close(fetch_f32(*be, cache_dev), want, 0, 0);  // untouched by the failed call
  // dest -1 marks a padding entry of a graph batch: skipped, the others are stored.
  auto more = rng.uniform(2 * 4);
  be->scatter_rows(cache_dev, up(more, {2, 4}), up_i({-1, 3}, {2}));
  for (int c = 0; c < 4; ++c) want[sz(3 * 4 + c)] = more[sz(4 + c)];
  expect_close(fetch_f32(*be, cache_dev), want, 0, 0);
  expect_error(
      [&] {
        be->scatter_rows(cache_dev, up(more, {2, 4}), up_i({-2, 3}, {2}));
      },
      ErrorCode::kInvalidArgument, "dest[0] = -2");
}

// ---- compress_pool
// -------------------------------------------------------------------------------

struct Entry {
  int seq;
  int window;
};

std::vector<double> ref_compress(const History& h, const std::vector<float>& ape,
                                 const std::vector<Entry>& entries, int64_t m, int64_t D,
                                 bool overlap) {
  const int64_t C = overlap ? 2 * D : D;
  std::vector<double> out;
  for (const Entry& e : entries) {
    for (int64_t c = 0; c < D; ++c) {
      std::vector<double> kv, g;
      for (int64_t i = 0; i < m; ++i) {
        if (!overlap) {
          const float* row = h.at(sz(e.seq), e.window * m + i);
          kv.push_back(row[c]);
          g.push_back(double(row[D + c]) + ape[sz(i * C + c)]);
        } else {
          if (e.window > 0) {
            const float* prev = h.at(sz(e.seq), (e.window - 1) * m + i);
            kv.push_back(prev[c]);
            g.push_back(double(prev[2 * D + c]) + ape[sz(i * C + c)]);
          }
          const float* cur = h.at(sz(e.seq), e.window * m + i);
          kv.push_back(cur[D + c]);
          g.push_back(double(cur[3 * D + c]) + ape[sz(i * C + D + c)]);
        }
      }
      const double mx = *std::max_element(g.begin(), g.end());
      double den = 0, num = 0;
      for (size_t s = 0; s < g.size(); ++s) {
        den += std::exp(g[s] - mx);
        num += std::exp(g[s] - mx) * kv[s];
      }
      out.push_back(num / den);
    }
  }
  return out;
}

TEST_F(CpuAttentionTest, CompressPool) {
  const int64_t m = 4, D = 6, slots = 3, R = 2 * m + 1;
  // Windows closing in this call: seq 0 -> 0 and 1 (all from proj), seq 1 -> 3 (the previous
  // window and position 12 from the wrapped ring), seq 2 -> 1 (window 0 and positions 4, 5 from
  // the ring). Entries are listed out of order.
  const std::vector<SeqSpec> seqs = {{0, 9, 2}, {13, 3, 0}, {6, 2, 1}};
  const std::vector<Entry> entries = {{1, 3}, {0, 0}, {2, 1}, {0, 1}};
  for (bool overlap : {false, true}) {
    const int64_t C = overlap ? 2 * D : D;
    HostLayout hl(seqs, 8, 1);
    History h(rng, seqs, 2 * C, -3, 3);
    auto ape = rng.uniform(sz(m * C));
    std::vector<int32_t> seq_ids, windows, rope_pos, dest;
    for (const Entry& e : entries) {
      seq_ids.push_back(e.seq);
      windows.push_back(e.window);
      rope_pos.push_back(int32_t(e.window * m));
      dest.push_back(0);
    }
    const int64_t E = int64_t(entries.size());
    EntryBatch eb{int(E), up_i(seq_ids, {E}), up_i(windows, {E}), up_i(rope_pos, {E}),
                  up_i(dest, {E})};
    CompressSpec spec{int(m), overlap, int(D)};
    Tensor got = be->compress_pool(up(h.chunk(seqs), {hl.num_tokens(), 2 * C}),
                                   up(h.ring(rng, seqs, slots, R), {slots, R, 2 * C}),
                                   up(ape, {m, C}), hl.upload(*be), eb, spec);
    EXPECT_EQ(got.shape(), (Shape{E, D}));
    expect_close(fetch_f32(*be, got), ref_compress(h, ape, entries, m, D, overlap), 1e-5, 1e-6,
                 overlap ? "overlap" : "no overlap");
  }
}

TEST_F(CpuAttentionTest, CompressPoolSingleDecodeToken) {
  const int64_t m = 4, D = 8, C = 2 * D, R = 2 * m;
  std::vector<SeqSpec> seqs = {{27, 1, 0}};  // position 27 closes window 6
  HostLayout hl(seqs, 16, 1);
  History h(rng, seqs, 2 * C, -2, 2);
  auto ape = rng.uniform(sz(m * C));
  const std::vector<Entry> entries = {{0, 6}};
  EntryBatch eb{1, up_i({0}, {1}), up_i({6}, {1}), up_i({24}, {1}), up_i({0}, {1})};
  Tensor got =
      be->compress_pool(up(h.chunk(seqs), {1, 2 * C}), up(h.ring(rng, seqs, 1, R), {1, R, 2 * C}),
                        up(ape, {m, C}), hl.upload(*be), eb, CompressSpec{int(m), true, int(D)});
  expect_close(fetch_f32(*be, got), ref_compress(h, ape, entries, m, D, true), 1e-5, 1e-6);
}

TEST_F(CpuAttentionTest, CompressPoolPaddingEntriesAreZero) {
  // Window -1 marks a padding entry (fixed-shape graph batches): a zero row, whatever its seq.
  const int64_t m = 4, D = 8, C = 2 * D, R = 2 * m;
  std::vector<SeqSpec> seqs = {{27, 1, 0}};  // position 27 closes window 6
  HostLayout hl(seqs, 16, 1);
  History h(rng, seqs, 2 * C, -2, 2);
  auto ape = rng.uniform(sz(m * C));
  EntryBatch eb{3, up_i({0, 0, 7}, {3}), up_i({-1, 6, -1}, {3}), up_i({0, 24, 0}, {3}),
                up_i({-1, 0, -1}, {3})};
  Tensor got =
      be->compress_pool(up(h.chunk(seqs), {1, 2 * C}), up(h.ring(rng, seqs, 1, R), {1, R, 2 * C}),
                        up(ape, {m, C}), hl.upload(*be), eb, CompressSpec{int(m), true, int(D)});
  std::vector<double> want(sz(D), 0.0);
  const std::vector<double> real = ref_compress(h, ape, {{0, 6}}, m, D, true);
  want.insert(want.end(), real.begin(), real.end());
  want.resize(sz(3 * D), 0.0);
  expect_close(fetch_f32(*be, got), want, 1e-5, 1e-6);
}

TEST_F(CpuAttentionTest, CompressPoolErrors) {
  const int64_t m = 4, D = 4, R = 9;
  std::vector<SeqSpec> seqs = {{20, 1, 0}};
  HostLayout hl(seqs, 8, 1);
  Tensor proj = up(rng.uniform(2 * D), {1, 2 * D});
  Tensor ring = up(rng.uniform(R * 2 * D), {1, R, 2 * D});
  Tensor ape = up(rng.uniform(m * D), {m, D});
  auto batch = [&](int w) {
    return EntryBatch{1, up_i({0}, {1}), up_i({w}, {1}), up_i({w * 4}, {1}), up_i({0}, {1})};
  };
  // Window 2 (positions 8..11) fell out of a ring holding positions 11..19.
  expect_error(
      [&] {
        be->compress_pool(proj, ring, ape, hl.upload(*be), batch(2), {4, false, 4});
      },
      ErrorCode::kInternal, "no longer in its ring");
  // Window 5 needs positions up to 23; the sequence has 21 tokens.
  expect_error(
      [&] {
        be->compress_pool(proj, ring, ape, hl.upload(*be), batch(5), {4, false, 4});
      },
      ErrorCode::kInvalidArgument, "not closed");
  // Metadata: ape must be [m, C].
  EXPECT_THROW(be->compress_pool(proj, ring, up(rng.uniform(3 * D), {3, D}), hl.upload(*be),
                                 batch(4), {4, false, 4}),
               Error);
}

// ---- indexer_topk
// --------------------------------------------------------------------------------

// Reference top-k: scores in double (exact for the integer inputs used with it), sorted by score
// descending then index ascending.
std::vector<int32_t> ref_indexer(const HostLayout& hl, const PagedEntries& pe,
                                 const std::vector<float>& q, const std::vector<float>& w,
                                 int64_t heads, int64_t Di, int ratio, int top_k, double sscale,
                                 double wscale, std::vector<std::vector<double>>* scores_out) {
  std::vector<int32_t> out;
  for (int t = 0; t < hl.num_tokens(); ++t) {
    const size_t b = sz(hl.token_seq[sz(t)]);
    const int n = (hl.positions[sz(t)] + 1) / ratio;
    std::vector<double> score(sz(n));
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double d = 0;
        for (int64_t c = 0; c < Di; ++c) {
          d += double(q[sz((t * heads + h) * Di + c)]) * pe.entries[b][sz(j * Di + c)];
        }
        s += double(w[sz(t * heads + h)]) * wscale * std::max(d, 0.0) * sscale;
      }
      score[sz(j)] = s;
    }
    std::vector<int32_t> order(sz(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t c) { return score[sz(a)] > score[sz(c)]; });
    for (int k = 0; k < top_k; ++k) out.push_back(k < n ? order[sz(k)] : -1);
    if (scores_out) scores_out->push_back(score);
  }
  return out;
}

TEST_F(CpuAttentionTest, IndexerTopKExactWithTies) {
  const int ratio = 4, block = 8, epb = block / ratio;
  const int64_t heads = 3, Di = 8;
  // seq 0: positions 0..6 (0..1 visible entries, fewer than top_k); seq 1: a decode row with
  // 12 visible entries over 6 shuffled blocks; seq 2: 5 rows around 7..8 visible entries.
  std::vector<SeqSpec> seqs = {{0, 7, 0}, {48, 1, 1}, {29, 5, 2}};
  std::vector<int> counts = {(0 + 7) / ratio, (48 + 1) / ratio, (29 + 5) / ratio};
  PagedEntries pe(rng, counts, epb, Di, 7, /*integers=*/true);
  HostLayout hl(seqs, block, pe.max_blocks, pe.table);
  const int T = hl.num_tokens();
  auto q = rng.integers(sz(T * heads * Di), -2, 2);
  auto w = rng.integers(sz(T * heads), -2, 2);
  for (int top_k : {1, 5, 16}) {
    Tensor got = be->indexer_topk(up(q, {T, heads, Di}), up(w, {T, heads}),
                                  up(pe.cache, {int64_t(pe.num_blocks) * epb, Di}), hl.upload(*be),
                                  ratio, top_k, 0.5f, 0.25f);
    EXPECT_EQ(got.shape(), (Shape{T, top_k}));
    EXPECT_EQ(fetch_i32(*be, got),
              ref_indexer(hl, pe, q, w, heads, Di, ratio, top_k, 0.5, 0.25, nullptr))
        << "top_k " << top_k;
  }
}

TEST_F(CpuAttentionTest, IndexerTopKRandomScores) {
  const int ratio = 4, block = 16, epb = block / ratio;
  const int64_t heads = 4, Di = 32;
  std::vector<SeqSpec> seqs = {{200, 1, 0}, {95, 6, 0}};
  std::vector<int> counts = {201 / ratio, 101 / ratio};
  PagedEntries pe(rng, counts, epb, Di, 13);
  HostLayout hl(seqs, block, pe.max_blocks, pe.table);
  const int T = hl.num_tokens(), top_k = 10;
  auto q = rng.uniform(sz(T * heads * Di));
  auto w = rng.uniform(sz(T * heads));
  auto got = fetch_i32(*be, be->indexer_topk(up(q, {T, heads, Di}), up(w, {T, heads}),
                                             up(pe.cache, {int64_t(pe.num_blocks) * epb, Di}),
                                             hl.upload(*be), ratio, top_k, 0.17f, 0.5f));
  std::vector<std::vector<double>> scores;
  ref_indexer(hl, pe, q, w, heads, Di, ratio, top_k, 0.17, 0.5, &scores);
  // fp32 scores may swap near-ties; check the choice by score instead of by index.
  for (int t = 0; t < T; ++t) {
    const auto& s = scores[sz(t)];
    std::vector<double> sorted = s;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (int k = 0; k < top_k; ++k) {
      const int32_t idx = got[sz(t * top_k + k)];
      ASSERT_GE(idx, 0);
      ASSERT_LT(idx, int(s.size()));
      EXPECT_NEAR(s[sz(idx)], sorted[sz(k)], 1e-5) << "token " << t << " rank " << k;
    }
  }
}

TEST_F(CpuAttentionTest, IndexerRejectsBlocksPastTheTable) {
  std::vector<SeqSpec> seqs = {{40, 1, 0}};  // 10 visible entries need 5 blocks of 2
  HostLayout hl(seqs, 8, 4, {1, 2, 3, 4});
  expect_error(
      [&] {
        be->indexer_topk(up(rng.uniform(8), {1, 1, 8}), up(rng.uniform(1), {1, 1}),
                         up(rng.uniform(10 * 8), {10, 8}), hl.upload(*be), 4, 4, 1.0f, 1.0f);
      },
      ErrorCode::kInvalidArgument, "max_blocks_per_seq");
}

}  // namespace
}  // namespace deepinfer
