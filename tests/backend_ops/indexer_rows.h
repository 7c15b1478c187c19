// The indexer_topk rows of the op table (cases_attention.cpp over f32 index caches,
// cases_kv_dtypes.cpp over bf16 and fp8 ones): the batch and its inputs, exact rows, and rows of
// random floats checked by score (see cases_attention.cpp for why the exact rows are exact).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "batch_layout.h"
#include "deepinfer/tensor.h"
#include "inputs.h"
#include "kv_inputs.h"
#include "op_case.h"
#include "tensor/indexer_q.h"

namespace deepinfer::backend_ops {

struct Indexer {
  std::vector<SeqSpec> seqs;
  int block = 16;
  int max_blocks = 0;  // 0: what the sequences need
  int heads = 4;
  int dim = 32;
  int ratio = 4;
  bool integers = true;
  // > 0: only this many distinct keys, repeated over the cache's rows (key row r is a copy of
  // row r % key_patterns), so that thousands of entries tie on their score.
  int key_patterns = 0;
  DType cache = DType::kF32;  // the index cache's KV dtype (kv_record.h); labels get kv_label
  // q in fp8 (quantize_indexer_q on each backend, then the op over codes and scaled weights:
  // DeepSeek's indexer q over fp8 keys); labels get "q8_".
  bool fp8_q = false;
};

struct IndexerIn {
  HostBatch hb;
  Tensor q, w;
  Tensor cache;  // the index cache, in c.cache
  Tensor keys;   // the f32 keys it holds (decoded)
};

// Keys of the exact rows over bf16 and fp8 caches: integers in [-16, 16] times 2^(k - e), k per
// key in [-4, 4], e per channel in {0, 2, 4}. bf16 and e4m3 hold them unchanged (at most 4
// significant bits; e4m3 values in [1, 448] after the key's scale), and with q and weights in
// [-2, 2] a score at V4 width (64 heads of 128 channels) needs 23 bits: exact in f32.
inline Tensor exact_kv_keys(std::mt19937& rng, int64_t rows, int64_t dim) {
  Tensor keys = random_int_f32(rng, {rows, dim}, -16, 16);
  std::uniform_int_distribution<int> row_exp(-4, 4), channel_exp(0, 2);
  std::vector<int> e(static_cast<size_t>(dim));
  for (int& x : e) x = 2 * channel_exp(rng);
  for (int64_t r = 0; r < rows; ++r) {
    const int k = row_exp(rng);
    float* key = keys.data<float>() + r * dim;
    for (int64_t c = 0; c < dim; ++c) key[c] = std::ldexp(key[c], k - e[size_t(c)]);
  }
  return keys;
}

inline IndexerIn draw_indexer(const Indexer& c, std::mt19937& rng) {
  HostBatch hb(rng, c.seqs, c.block, c.max_blocks);
  const int64_t t = hb.num_tokens();
  const int64_t rows = int64_t{hb.num_blocks} * (c.block / c.ratio);
  IndexerIn in{hb, {}, {}, {}, {}};
  if (c.integers) {
    in.q = random_int_f32(rng, {t, c.heads, c.dim}, -2, 2);
    in.w = random_int_f32(rng, {t, c.heads}, -2, 2);
    in.keys = c.cache == DType::kF32 ? random_int_f32(rng, {rows, c.dim}, -2, 2)
                                     : exact_kv_keys(rng, rows, c.dim);
  } else {
    in.q = random_f32(rng, {t, c.heads, c.dim});
    in.w = random_f32(rng, {t, c.heads});
    in.keys = random_f32(rng, {rows, c.dim});
  }
  if (c.key_patterns > 0) {
    float* k = in.keys.data<float>();
    for (int64_t r = c.key_patterns; r < rows; ++r) {
      std::copy_n(k + (r % c.key_patterns) * c.dim, c.dim, k + r * c.dim);
    }
  }
  in.cache = in.keys;
  if (c.cache != DType::kF32) {
    in.cache = encode_kv_rows(in.keys, c.cache, /*rope_dim=*/0);
    in.keys = decode_kv_rows(in.cache, c.dim, /*rope_dim=*/0);
  }
  return in;
}

inline Outputs run_indexer(Backend& be, const Indexer& c, const IndexerIn& in, int top_k,
                           float score_scale, float weight_scale) {
  Tensor q = up(be, in.q), w = up(be, in.w);
  if (c.fp8_q) {
    IndexerQFp8 q8 = be.quantize_indexer_q(q, w);
    q = std::move(q8.q);
    w = std::move(q8.weights);
  }
  return out(be.indexer_topk(q, w, up_same(be, in.cache), in.hb.upload(be), c.ratio, top_k,
                             score_scale, weight_scale));
}

// The q a fp8_q row's op scores (tensor/indexer_q.h): each (token, head) row rounded to e4m3
// relative to its power-of-two scale, as f32 values (codes times scale); the weights unchanged.
inline Tensor fp8_q_values(const Tensor& q) {
  Tensor out = Tensor::zeros(q.shape(), DType::kF32);
  const int64_t dim = q.size(2);
  std::vector<uint8_t> codes(static_cast<size_t>(dim));
  for (int64_t r = 0; r < q.size(0) * q.size(1); ++r) {
    float* row = out.data<float>() + r * dim;
    const float s = indexer_q::quantize_row(q.data<float>() + r * dim, dim, codes.data());
    for (int64_t i = 0; i < dim; ++i) row[i] = f8e4m3_to_f32(codes[static_cast<size_t>(i)]) * s;
  }
  return out;
}

inline std::string indexer_label(const Indexer& c) {
  return kv_label(c.cache) + (c.fp8_q ? "q8_" : "");
}

// Exact rows, one per top_k.
inline void add_indexer_exact(std::vector<OpCase>& t, const std::string& label, const Indexer& c,
                              const std::vector<int>& top_ks) {
  for (const int top_k : top_ks) {
    add(t, Case<IndexerIn>{
               .op = "indexer_topk",
               .label = indexer_label(c) + label + "_top" + std::to_string(top_k),
               .draw = [c](std::mt19937& rng) { return draw_indexer(c, rng); },
               .run =
                   [c, top_k](Backend& be, const IndexerIn& in) {
                     return run_indexer(be, c, in, top_k, 0.0625f, 0.125f);
                   },
               .expect = exact(),
           });
  }
}

// What scores over fp8 q may lose on fp8 MMAs, for entry `key` of a token (q_token: its heads'
// q values, w_token: its head weights): Hopper's e4m3 MMAs (the CUDA backend's default over fp8 q
// and fp8 index keys on sm_90, as DeepSeek's paged MQA logits kernels) keep 13 fraction bits of
// each k32 step's sum, truncated, so a head's dot product is off by less than 2^-13 of its running
// sum's magnitude after each step. The steps take the channels in the kernel's order (channel ch
// in step (ch % 32) / 8 of four: indexer_mma_layout.h's wgmma_k8_of_channel); other widths in
// order. Twice that per step, through each head's weight and the scales (ReLU widens no
// difference).
inline double fp8_mma_score_bound(const float* q_token, const float* w_token, const float* key,
                                  int64_t heads, int64_t dim, float sscale, float wscale) {
  constexpr int64_t kStep = 32;
  const int64_t steps = (dim + kStep - 1) / kStep;
  auto step_of = [&](int64_t ch) { return dim == 128 ? (ch % 32) / 8 : ch / kStep; };
  const double per_step = std::ldexp(1.0, -12);
  std::vector<double> step_sum(static_cast<size_t>(steps));
  double bound = 0;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q_token + h * dim;
    std::fill(step_sum.begin(), step_sum.end(), 0.0);
    for (int64_t i = 0; i < dim; ++i) step_sum[size_t(step_of(i))] += double(qh[i]) * key[i];
    double d = 0, lost = 0;
    for (const double x : step_sum) {
      d += x;
      lost += per_step * std::fabs(d);
    }
    bound += std::fabs(double(w_token[h]) * wscale) * lost * sscale;
  }
  return bound;
}

// Random floats: near-tied scores may swap between backends, so each rank's chosen entry must
// score (in double, over the keys as the op reads them) what the reference's does, within 1e-4;
// every chosen entry visible and distinct, -1 past the visible ones. fp8_mma: q in fp8, which a
// backend may score on fp8 MMAs: a rank's entry may then also be off by what the MMAs lose on it
// (fp8_mma_score_bound) and on the worst entry of the token (which may have displaced the
// reference's).
inline void check_indexer_scores(const HostBatch& hb, const Tensor& q, const Tensor& w,
                                 const Tensor& keys, int ratio, int top_k, float sscale,
                                 float wscale, bool fp8_mma, const Tensor& ref, const Tensor& dev) {
  ASSERT_EQ(dev.shape(), ref.shape());
  const int64_t heads = q.size(1), dim = q.size(2);
  const int epb = hb.block_size / ratio;
  const float* qp = q.data<float>();
  const float* wp = w.data<float>();
  const float* kp = keys.data<float>();
  for (int t = 0; t < hb.num_tokens(); ++t) {
    const size_t seq = size_t(hb.token_seq[size_t(t)]);
    const int visible = (hb.positions[size_t(t)] + 1) / ratio;
    const float* q_token = qp + t * heads * dim;
    const float* w_token = wp + t * heads;
    auto key_of = [&](int j) { return kp + hb.entry_row(seq, j, epb) * dim; };
    auto score = [&](int j) {
      const float* key = key_of(j);
      double s = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const float* qh = q_token + h * dim;
        double d = 0;
        for (int64_t i = 0; i < dim; ++i) d += double(qh[i]) * key[i];
        s += double(w_token[h]) * wscale * std::max(d, 0.0) * sscale;
      }
      return s;
    };
    auto mma_bound = [&](int j) {
      return fp8_mma_score_bound(q_token, w_token, key_of(j), heads, dim, sscale, wscale);
    };
    double worst_bound = -1;  // over the token's visible entries, computed when first needed
    auto tolerance = [&](int j) {
      if (!fp8_mma) return 1e-4;
      if (worst_bound < 0) {
        worst_bound = 0;
        for (int e = 0; e < visible; ++e) worst_bound = std::max(worst_bound, mma_bound(e));
      }
      return 1e-4 + mma_bound(j) + worst_bound;
    };
    std::vector<int> seen(size_t(std::max(visible, 1)), 0);
    for (int r = 0; r < top_k; ++r) {
      const int ic = int(ref.item(int64_t{t} * top_k + r));
      const int ig = int(dev.item(int64_t{t} * top_k + r));
      if (r >= visible) {
        EXPECT_EQ(ig, -1) << "token " << t << " rank " << r;
        continue;
      }
      ASSERT_GE(ig, 0) << "token " << t << " rank " << r;
      ASSERT_LT(ig, visible) << "token " << t << " rank " << r;
      EXPECT_EQ(seen[size_t(ig)]++, 0) << "token " << t << " chose entry " << ig << " twice";
      const double got = score(ig), want = score(ic);
      if (std::fabs(got - want) > 1e-4) {
        EXPECT_NEAR(got, want, tolerance(ig)) << "token " << t << " rank " << r;
      }
    }
  }
}

// One row of random floats (score scale 1 / sqrt(dim)), checked by score.
inline void add_indexer_floats(std::vector<OpCase>& t, const std::string& label, const Indexer& c,
                               int top_k) {
  const float sscale = 1.0f / std::sqrt(float(c.dim)), wscale = 0.125f;
  add(t,
      Case<IndexerIn>{
          .op = "indexer_topk",
          .label = indexer_label(c) + label + "_top" + std::to_string(top_k),
          .draw = [c](std::mt19937& rng) { return draw_indexer(c, rng); },
          .run = [=](Backend& be,
                     const IndexerIn& in) { return run_indexer(be, c, in, top_k, sscale, wscale); },
          .expect =
              [=](const IndexerIn& in, const Outputs& ref, const Outputs& dev) {
                check_indexer_scores(in.hb, c.fp8_q ? fp8_q_values(in.q) : in.q, in.w, in.keys,
                                     c.ratio, top_k, sscale, wscale, c.fp8_q, ref[0].value,
                                     dev[0].value);
              },
      });
}

}  // namespace deepinfer::backend_ops
