// CPU backend cache and attention ops (ring_write, compress_pool, scatter_rows, indexer_topk,
// attention) against double-precision references. Each test keeps the full per-position history
// of every sequence on the host; the op sees it only through the ring / paged-cache layout (ring
// holding the last R positions before the call, entries in shuffled physical blocks), so the
// addressing is checked along with the math.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

using testing::expect_close;
using testing::fetch_f32;
using testing::fetch_i32;
using testing::host_f32;
using testing::host_i32;
using testing::HostLayout;
using testing::Rng;
using testing::SeqSpec;
using testing::sz;

// Random per-position rows of width `width` for every sequence (positions 0 .. ctx + q - 1),
// plus the same rows laid out as an op would see them.
struct History {
  int64_t width;
  std::vector<std::vector<float>> rows;  // rows[b][p * width + c]

  History(Rng& rng, const std::vector<SeqSpec>& seqs, int64_t w, float lo = -1, float hi = 1)
      : width(w) {
    for (const SeqSpec& s : seqs) rows.push_back(rng.uniform(sz((s.ctx + s.q) * w), lo, hi));
  }
  const float* at(size_t b, int64_t p) const { return rows[b].data() + p * width; }

  // This call's rows [T, width].
  std::vector<float> chunk(const std::vector<SeqSpec>& seqs) const {
    std::vector<float> out;
    for (size_t b = 0; b < seqs.size(); ++b) {
      out.insert(out.end(), rows[b].begin() + seqs[b].ctx * width, rows[b].end());
    }
    return out;
  }
  // A ring [slots, R, width] of garbage with each sequence's last R cached positions in place.
  std::vector<float> ring(Rng& rng, const std::vector<SeqSpec>& seqs, int64_t slots,
                          int64_t len) const {
    std::vector<float> r = rng.uniform(sz(slots * len * width), -9, 9);
    for (size_t b = 0; b < seqs.size(); ++b) {
      for (int64_t p = std::max<int64_t>(0, seqs[b].ctx - len); p < seqs[b].ctx; ++p) {
        std::copy(at(b, p), at(b, p) + width, r.begin() + (seqs[b].slot * len + p % len) * width);
      }
    }
    return r;
  }
};

// Paged entry cache: entry j of sequence b at row table[b][j / epb] * epb + j % epb, with the
// physical blocks handed out in shuffled order (block 0 never used).
struct PagedEntries {
  int epb;
  int max_blocks;
  int num_blocks;
  std::vector<int32_t> table;
  std::vector<std::vector<float>> entries;  // entries[b][j * width + c]
  std::vector<float> cache;

  PagedEntries(Rng& rng, const std::vector<int>& counts, int entries_per_block, int64_t width,
               int blocks_per_seq, bool integers = false)
      : epb(entries_per_block), max_blocks(blocks_per_seq) {
    num_blocks = 1 + static_cast<int>(counts.size()) * max_blocks;
    std::vector<int32_t> physical(sz(num_blocks - 1));
    std::iota(physical.begin(), physical.end(), 1);
    std::shuffle(physical.begin(), physical.end(), rng.engine());
    table = physical;
    cache = rng.uniform(sz(num_blocks * epb * width), -9, 9);
    for (size_t b = 0; b < counts.size(); ++b) {
      entries.push_back(integers ? rng.integers(sz(counts[b] * width), -2, 2)
                                 : rng.uniform(sz(counts[b] * width)));
      for (int j = 0; j < counts[b]; ++j) {
        const int64_t row = int64_t{table[b * sz(max_blocks) + sz(j / epb)]} * epb + j % epb;
        std::copy(entries[b].begin() + j * width, entries[b].begin() + (j + 1) * width,
                  cache.begin() + row * width);
      }
    }
  }
};

class CpuAttentionTest : public testing::BackendTest {
 protected:
  CpuAttentionTest() { rng = Rng(99); }
};

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
