// Rows of V4.1's candidate-block indexer ops (docs/model.md#v41-ops): indexer_candidates and
// indexer_topk_in_candidates, at tiny widths and at V4.1-Flash's (32 index heads of 128 channels,
// ratio 1 (the C1 layers that carry them), blocks of 8 entries, top 2048 blocks then top 512).
//
// As indexer_topk's rows (cases_attention.cpp), the exact rows use small integer q, weights and
// keys with power-of-two scales: every score, and so every block's max, is exact in f32, equal
// scores are true ties (many: the tie rule, lower index first, decides) and both backends give
// the same ids in the same order. The candidate inputs of indexer_topk_in_candidates are every
// visible block (the restriction is a no-op: the row equals indexer_topk), random block ids with
// repeats, -1 and blocks past the visible ones, or distinct visible blocks fewer than the token
// has (the restriction is active). V4.1-Flash contexts sit below (10,000 entries) and above
// (40,000 and 131,072 entries) the 2048 x 8 = 16,384 entries the candidates cover; other rows
// take the kernels' paths for large rows (scores and bitmaps in global memory). Random-float rows
// compare the chosen ids by score. V4.1's FP4 index keys (kE2M1x2 records, labelled kv_v41fp4_:
// what kv_cache_dtype "fp8" stores) take the tiny rows (17-byte records, the CUDA-core scores),
// V4.1 width (68-byte records, the tensor-core scores of indexer_candidates) at one and several
// tokens, a graph and random floats; their exact keys are e2m1 times a power of two per 32
// channels (cases_kv_dtypes.cpp), so the scores stay exact and tie often.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "batch_layout.h"
#include "cases.h"
#include "indexer_rows.h"
#include "inputs.h"
#include "kv_inputs.h"

namespace deepinfer::backend_ops {
namespace {

constexpr float kScoreScale = 0.0625f;
constexpr float kWeightScale = 0.125f;

Outputs run_candidates(Backend& be, const Indexer& c, const IndexerIn& in, int block_entries,
                       int top_blocks, float score_scale, float weight_scale) {
  return out(be.indexer_candidates(up(be, in.q), up(be, in.w), up_same(be, in.cache),
                                   in.hb.upload(be), c.ratio, block_entries, top_blocks,
                                   score_scale, weight_scale));
}

// How the candidate blocks of indexer_topk_in_candidates are drawn, per token with nb visible
// blocks and kb columns.
enum class Pick {
  kAll,       // every visible block, shuffled, then -1 (needs kb >= nb): a no-op restriction
  kRandom,    // ids in [-1, nb + 2): repeats, -1 and blocks without visible entries
  kDistinct,  // min(kb, nb) distinct visible blocks, shuffled: the V4.1 case
};

std::string pick_label(Pick p) {
  return p == Pick::kAll ? "all" : p == Pick::kRandom ? "random" : "distinct";
}

Tensor draw_candidates(Rng& rng, const HostBatch& hb, int ratio, int block_entries, int kb,
                       Pick pick) {
  std::vector<int32_t> out;
  for (int t = 0; t < hb.num_tokens(); ++t) {
    const int visible = (hb.positions[size_t(t)] + 1) / ratio;
    const int nb = (visible + block_entries - 1) / block_entries;
    std::vector<int32_t> row;
    if (pick == Pick::kRandom) {
      std::uniform_int_distribution<int32_t> id(-1, nb + 1);
      for (int i = 0; i < kb; ++i) row.push_back(id(rng));
    } else {
      row.resize(size_t(nb));
      std::iota(row.begin(), row.end(), 0);
      std::shuffle(row.begin(), row.end(), rng);
      row.resize(size_t(std::min(kb, nb)));
      row.resize(size_t(kb), -1);
      std::shuffle(row.begin(), row.end(), rng);
    }
    out.insert(out.end(), row.begin(), row.end());
  }
  return Tensor::from_vector(out, {hb.num_tokens(), kb});
}

struct InCandidatesIn {
  IndexerIn ix;
  Tensor candidates;
};

Outputs run_in_candidates(Backend& be, const Indexer& c, const InCandidatesIn& in,
                          int block_entries, int top_k, float score_scale, float weight_scale) {
  return out(be.indexer_topk_in_candidates(
      up(be, in.ix.q), up(be, in.ix.w), up_same(be, in.ix.cache), in.ix.hb.upload(be), c.ratio,
      up(be, in.candidates), block_entries, top_k, score_scale, weight_scale));
}

// Exact rows of both ops over the batch `c`: indexer_candidates for each top_blocks, and
// indexer_topk_in_candidates for each pick of kb candidate blocks and each top_k.
struct CandidateRows {
  std::string label;
  Indexer c;
  int block_entries;
  std::vector<int> top_blocks;
  int kb;
  std::vector<Pick> picks;
  std::vector<int> top_ks;
};

void add_exact(std::vector<OpCase>& t, const CandidateRows& r) {
  const Indexer c = r.c;
  const int bs = r.block_entries;
  const std::string base = kv_label(c.cache) + r.label + "_be" + std::to_string(bs);
  for (const int top_blocks : r.top_blocks) {
    add(t, Case<IndexerIn>{
               .op = "indexer_candidates",
               .label = base + "_top" + std::to_string(top_blocks),
               .draw = [c](Rng& rng) { return draw_indexer(c, rng); },
               .run =
                   [c, bs, top_blocks](Backend& be, const IndexerIn& in) {
                     return run_candidates(be, c, in, bs, top_blocks, kScoreScale, kWeightScale);
                   },
               .expect = exact(),
           });
  }
  const int kb = r.kb;
  for (const Pick pick : r.picks) {
    for (const int top_k : r.top_ks) {
      add(t, Case<InCandidatesIn>{
                 .op = "indexer_topk_in_candidates",
                 .label = base + "_kb" + std::to_string(kb) + "_" + pick_label(pick) + "_top" +
                          std::to_string(top_k),
                 .draw =
                     [c, bs, kb, pick](Rng& rng) {
                       InCandidatesIn in{draw_indexer(c, rng), {}};
                       in.candidates = draw_candidates(rng, in.ix.hb, c.ratio, bs, kb, pick);
                       return in;
                     },
                 .run =
                     [c, bs, top_k](Backend& be, const InCandidatesIn& in) {
                       return run_in_candidates(be, c, in, bs, top_k, kScoreScale, kWeightScale);
                     },
                 .expect = exact(),
             });
    }
  }
}

// Both ops replayed from a graph as cuda_op_bench times them: the output of a call made before
// the capture is dropped inside it (the captured calls reassign it), the graph runs twice and its
// last call's ids are compared. A captured free may only free the graph's own allocations; the
// CUDA backend once left the failed free's error for the next call's launch check to report.
void add_graph_rows(std::vector<OpCase>& t, const std::string& label, const Indexer& c, int bs,
                    int top_blocks, int kb, int top_k) {
  const std::string base = kv_label(c.cache) + label + "_be" + std::to_string(bs);
  add(t, Case<IndexerIn>{
             .op = "indexer_candidates",
             .label = base + "_top" + std::to_string(top_blocks) + "_graph",
             .draw = [c](Rng& rng) { return draw_indexer(c, rng); },
             .run =
                 [=](Backend& be, const IndexerIn& in) {
                   const Tensor q = up(be, in.q), w = up(be, in.w), cache = up_same(be, in.cache);
                   const BatchLayout layout = in.hb.upload(be);
                   auto call = [&] {
                     return be.indexer_candidates(q, w, cache, layout, c.ratio, bs, top_blocks,
                                                  kScoreScale, kWeightScale);
                   };
                   Tensor ids = call();
                   std::unique_ptr<Graph> graph = be.capture([&] {
                     for (int i = 0; i < 2; ++i) ids = call();
                   });
                   graph->replay();
                   graph->replay();
                   return out(ids);
                 },
             .expect = exact(),
         });
  add(t, Case<InCandidatesIn>{
             .op = "indexer_topk_in_candidates",
             .label = base + "_kb" + std::to_string(kb) + "_distinct_top" + std::to_string(top_k) +
                      "_graph",
             .draw =
                 [=](Rng& rng) {
                   InCandidatesIn in{draw_indexer(c, rng), {}};
                   in.candidates = draw_candidates(rng, in.ix.hb, c.ratio, bs, kb, Pick::kDistinct);
                   return in;
                 },
             .run =
                 [=](Backend& be, const InCandidatesIn& in) {
                   const Tensor q = up(be, in.ix.q), w = up(be, in.ix.w);
                   const Tensor cache = up_same(be, in.ix.cache);
                   const Tensor cand = up(be, in.candidates);
                   const BatchLayout layout = in.ix.hb.upload(be);
                   auto call = [&] {
                     return be.indexer_topk_in_candidates(q, w, cache, layout, c.ratio, cand, bs,
                                                          top_k, kScoreScale, kWeightScale);
                   };
                   Tensor ids = call();
                   std::unique_ptr<Graph> graph = be.capture([&] {
                     for (int i = 0; i < 2; ++i) ids = call();
                   });
                   graph->replay();
                   graph->replay();
                   return out(ids);
                 },
             .expect = exact(),
         });
}

// score(t, j) in double over the keys as the ops read them.
double entry_score(const IndexerIn& in, int ratio, int t, int64_t j, float sscale, float wscale) {
  const int64_t heads = in.q.size(1), dim = in.q.size(2);
  const int epb = in.hb.block_size / ratio;
  const float* key =
      in.keys.data<float>() + in.hb.entry_row(size_t(in.hb.token_seq[size_t(t)]), j, epb) * dim;
  double s = 0;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = in.q.data<float>() + (t * heads + h) * dim;
    double d = 0;
    for (int64_t i = 0; i < dim; ++i) d += double(qh[i]) * key[i];
    s += double(in.w.data<float>()[t * heads + h]) * wscale * std::max(d, 0.0) * sscale;
  }
  return s;
}

// Random floats: near-tied block scores may swap between backends, so each rank's block must
// score (its max, in double) what the reference's does; every block visible and distinct, -1
// past the visible blocks.
void check_candidate_scores(const Indexer& c, const IndexerIn& in, int bs, int top_blocks,
                            float sscale, float wscale, const Tensor& ref, const Tensor& dev) {
  ASSERT_EQ(dev.shape(), ref.shape());
  for (int t = 0; t < in.hb.num_tokens(); ++t) {
    const int visible = (in.hb.positions[size_t(t)] + 1) / c.ratio;
    const int nb = (visible + bs - 1) / bs;
    auto block_score = [&](int b) {
      double mx = -INFINITY;
      for (int j = b * bs; j < std::min(visible, (b + 1) * bs); ++j) {
        mx = std::max(mx, entry_score(in, c.ratio, t, j, sscale, wscale));
      }
      return mx;
    };
    std::vector<int> seen(size_t(std::max(nb, 1)), 0);
    for (int r = 0; r < top_blocks; ++r) {
      const int ic = int(ref.item(int64_t{t} * top_blocks + r));
      const int ig = int(dev.item(int64_t{t} * top_blocks + r));
      if (r >= nb) {
        EXPECT_EQ(ig, -1) << "token " << t << " rank " << r;
        continue;
      }
      ASSERT_GE(ig, 0) << "token " << t << " rank " << r;
      ASSERT_LT(ig, nb) << "token " << t << " rank " << r;
      EXPECT_EQ(seen[size_t(ig)]++, 0) << "token " << t << " chose block " << ig << " twice";
      EXPECT_NEAR(block_score(ig), block_score(ic), 1e-4) << "token " << t << " rank " << r;
    }
  }
}

// The same for indexer_topk_in_candidates: each rank's entry must lie in a candidate block,
// be visible and distinct, and score what the reference's does.
void check_in_candidate_scores(const Indexer& c, const InCandidatesIn& in, int bs, int top_k,
                               float sscale, float wscale, const Tensor& ref, const Tensor& dev) {
  ASSERT_EQ(dev.shape(), ref.shape());
  const int64_t kb = in.candidates.size(1);
  for (int t = 0; t < in.ix.hb.num_tokens(); ++t) {
    const int visible = (in.ix.hb.positions[size_t(t)] + 1) / c.ratio;
    std::vector<int> allowed(size_t(std::max(visible, 1)), 0);
    int entries = 0;
    for (int64_t i = 0; i < kb; ++i) {
      const int b = in.candidates.data<int32_t>()[t * kb + i];
      for (int j = std::max(b, 0) * bs; b >= 0 && j < std::min(visible, (b + 1) * bs); ++j) {
        entries += allowed[size_t(j)] == 0;
        allowed[size_t(j)] = 1;
      }
    }
    std::vector<int> seen(allowed.size(), 0);
    for (int r = 0; r < top_k; ++r) {
      const int ic = int(ref.item(int64_t{t} * top_k + r));
      const int ig = int(dev.item(int64_t{t} * top_k + r));
      if (r >= entries) {
        EXPECT_EQ(ig, -1) << "token " << t << " rank " << r;
        continue;
      }
      ASSERT_GE(ig, 0) << "token " << t << " rank " << r;
      ASSERT_LT(ig, visible) << "token " << t << " rank " << r;
      EXPECT_EQ(allowed[size_t(ig)], 1) << "token " << t << " chose entry " << ig;
      EXPECT_EQ(seen[size_t(ig)]++, 0) << "token " << t << " chose entry " << ig << " twice";
      EXPECT_NEAR(entry_score(in.ix, c.ratio, t, ig, sscale, wscale),
                  entry_score(in.ix, c.ratio, t, ic, sscale, wscale), 1e-4)
          << "token " << t << " rank " << r;
    }
  }
}

void add_floats(std::vector<OpCase>& t, const std::string& label, const Indexer& c, int bs,
                int top_blocks, int kb, int top_k) {
  const float sscale = 1.0f / std::sqrt(float(c.dim)), wscale = 0.125f;
  const std::string base = kv_label(c.cache) + label + "_be" + std::to_string(bs);
  add(t, Case<IndexerIn>{
             .op = "indexer_candidates",
             .label = base + "_top" + std::to_string(top_blocks),
             .draw = [c](Rng& rng) { return draw_indexer(c, rng); },
             .run =
                 [=](Backend& be, const IndexerIn& in) {
                   return run_candidates(be, c, in, bs, top_blocks, sscale, wscale);
                 },
             .expect =
                 [=](const IndexerIn& in, const Outputs& ref, const Outputs& dev) {
                   check_candidate_scores(c, in, bs, top_blocks, sscale, wscale, ref[0].value,
                                          dev[0].value);
                 },
         });
  add(t, Case<InCandidatesIn>{
             .op = "indexer_topk_in_candidates",
             .label = base + "_kb" + std::to_string(kb) + "_distinct_top" + std::to_string(top_k),
             .draw =
                 [=](Rng& rng) {
                   InCandidatesIn in{draw_indexer(c, rng), {}};
                   in.candidates = draw_candidates(rng, in.ix.hb, c.ratio, bs, kb, Pick::kDistinct);
                   return in;
                 },
             .run =
                 [=](Backend& be, const InCandidatesIn& in) {
                   return run_in_candidates(be, c, in, bs, top_k, sscale, wscale);
                 },
             .expect =
                 [=](const InCandidatesIn& in, const Outputs& ref, const Outputs& dev) {
                   check_in_candidate_scores(c, in, bs, top_k, sscale, wscale, ref[0].value,
                                             dev[0].value);
                 },
         });
}

}  // namespace

std::vector<OpCase> v41_indexer_cases() {
  std::vector<OpCase> t;
  const std::vector<Pick> all_picks = {Pick::kAll, Pick::kRandom, Pick::kDistinct};

  // Tiny: 4 heads of 32, ratio 4, 4 entries per KV block. Visible entries: 0..1, 12, 7..8,
  // 50..50, 250; blocks of 1 (the op is indexer_topk over entries), 3 (straddling KV blocks) and
  // 8. kb 70 >= every token's blocks, so "all" is a no-op restriction.
  Indexer tiny;
  tiny.seqs = {{0, 7, 0}, {48, 1, 1}, {29, 5, 2}, {200, 3, 3}, {999, 2, 4}};
  for (const int bs : {1, 3, 8}) {
    add_exact(t, {"tiny_h4_d32_m4", tiny, bs, {1, 5, 64}, 70, {Pick::kAll}, {1, 16, 300}});
    add_exact(t, {"tiny_h4_d32_m4", tiny, bs, {}, 6, {Pick::kRandom, Pick::kDistinct}, {5, 64}});
  }
  Indexer odd = tiny;  // heads not a multiple of the warps, ratio 8
  odd.heads = 3;
  odd.dim = 20;
  odd.ratio = 8;
  add_exact(t, {"tiny_h3_d20_m8", odd, 3, {4}, 5, all_picks, {7}});
  // T = 0: nothing to score.
  Indexer empty = tiny;
  empty.seqs = {{100, 0, 0}};
  add_exact(t, {"tiny_t0", empty, 8, {16}, 4, {Pick::kRandom}, {16}});
  // A block table of 16,384 columns (2,097,152 addressable entries, blocks of 1): the candidate
  // lists' bitmap (256 KB) does not fit shared memory and goes to global scratch.
  Indexer wide = tiny;
  wide.block = 128;
  wide.ratio = 1;
  wide.max_blocks = 16384;
  wide.seqs = {{1000, 2, 0}, {5, 3, 1}};
  add_exact(t, {"wide_table", wide, 1, {}, 600, {Pick::kRandom, Pick::kDistinct}, {64}});
  // No candidate columns: every row is -1.
  add_exact(t, {"tiny_kb0", tiny, 8, {}, 0, {Pick::kRandom}, {5}});
  // FP4 index keys at the tiny width: partial blocks of 3, and 8 (every candidate pick).
  Indexer tiny_fp4 = tiny;
  tiny_fp4.cache = DType::kE2M1x2;
  for (const int bs : {3, 8}) {
    add_exact(t, {"tiny_h4_d32_m4", tiny_fp4, bs, {1, 5, 64}, 70, {Pick::kAll}, {1, 16, 300}});
    add_exact(t,
              {"tiny_h4_d32_m4", tiny_fp4, bs, {}, 6, {Pick::kRandom, Pick::kDistinct}, {5, 64}});
  }

  // V4.1-Flash: 32 index heads of 128, ratio 1 (128 entries per KV block), blocks of 8, top 2048
  // blocks, then top 512 entries among them.
  Indexer v41;
  v41.block = 128;
  v41.heads = 32;
  v41.dim = 128;
  v41.ratio = 1;
  // Decode below the candidate limit: 10,000 entries in 1250 blocks (kb 2048 covers them all).
  v41.seqs = {{9999, 1, 0}};
  add_exact(t, {"v41_ctx10000", v41, 8, {2048}, 2048, all_picks, {512}});
  // Decode above it: 40,000 entries in 5000 blocks.
  v41.seqs = {{39999, 1, 0}};
  add_exact(t, {"v41_ctx40000", v41, 8, {2048}, 2048, {Pick::kDistinct, Pick::kRandom}, {512}});
  // A ragged batch: decode above the limit, a verification step, a prefill chunk from position 0
  // (fewer visible entries than top_k), a prefill chunk across the limit.
  v41.seqs = {{39999, 1, 0}, {3000, 4, 1}, {0, 50, 2}, {16350, 40, 3}};
  add_exact(t, {"v41_ragged", v41, 8, {2048}, 2048, {Pick::kDistinct, Pick::kRandom}, {512}});
  // cuda_op_bench --only v41's first shape (32,768 entries at decode), plainly and in a graph.
  v41.seqs = {{32767, 1, 0}};
  add_exact(t, {"v41_ctx32768", v41, 8, {2048}, 2048, {Pick::kDistinct}, {512}});
  add_graph_rows(t, "v41_ctx32768", v41, 8, 2048, 2048, 512);
  for (const DType dtype : {DType::kBF16, DType::kU8, DType::kE2M1x2}) {
    Indexer kv = v41;
    kv.cache = dtype;
    add_graph_rows(t, "v41_ctx32768", kv, 8, 2048, 2048, 512);
  }
  // 131,072 entries (16,384 blocks) at decode.
  v41.seqs = {{131071, 1, 0}};
  add_exact(t, {"v41_ctx131072", v41, 8, {2048}, 2048, {Pick::kDistinct}, {512}});
  // The selection's scores in global memory: 131,072 single-entry blocks (512 KB of block
  // scores), and 8192 candidate blocks of 8 (65,536 candidate entries, 256 KB of scores).
  add_exact(t, {"v41_ctx131072", v41, 1, {2048}, 0, {}, {}});
  add_exact(t, {"v41_ctx131072", v41, 8, {}, 8192, {Pick::kDistinct}, {512}});
  // T = 0 at V4.1 width.
  v41.seqs = {{40000, 0, 0}};
  add_exact(t, {"v41_t0", v41, 8, {2048}, 2048, {Pick::kDistinct}, {512}});

  // bf16, fp8 and FP4 index caches (the exact keys survive bf16 and fp8; FP4's keep exact
  // scores).
  for (const DType dtype : {DType::kBF16, DType::kU8, DType::kE2M1x2}) {
    Indexer kv = v41;
    kv.cache = dtype;
    kv.seqs = {{39999, 1, 0}, {3000, 4, 1}};
    add_exact(t, {"v41_ctx40000", kv, 8, {2048}, 2048, {Pick::kDistinct}, {512}});
  }
  // FP4 at V4.1 width: decode below the candidate limit (every pick), and a ragged batch of
  // decode, verification and prefill rows (fewer visible entries than top_k, partial KV blocks).
  Indexer fp4 = v41;
  fp4.cache = DType::kE2M1x2;
  fp4.seqs = {{9999, 1, 0}};
  add_exact(t, {"v41_ctx10000", fp4, 8, {2048}, 2048, all_picks, {512}});
  fp4.seqs = {{39999, 1, 0}, {3000, 4, 1}, {0, 50, 2}, {16350, 40, 3}};
  add_exact(t, {"v41_ragged", fp4, 8, {2048}, 2048, {Pick::kDistinct, Pick::kRandom}, {512}});

  // Random floats at V4.1 width, above the limit.
  Indexer floats = v41;
  floats.integers = false;
  floats.seqs = {{39999, 1, 0}, {1000, 4, 1}, {37, 5, 2}};
  add_floats(t, "v41_random_floats", floats, 8, 2048, 2048, 512);
  floats.cache = DType::kE2M1x2;
  add_floats(t, "v41_random_floats", floats, 8, 2048, 2048, 512);
  return t;
}

}  // namespace deepinfer::backend_ops
