// Attention ops of the CPU backend: the lightning indexer's top-k and the sliding + compressed
// attention with sinks, over the paged layout (docs/model.md: #lightning-indexer, #attention,
// #kv-and-state-layout).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_checks.h"
#include "backend/cpu_math.h"
#include "tensor/indexer_q.h"
#include "tensor/kv_record.h"

namespace deepinfer {

using cpu::fail;
using cpu::LayoutView;

namespace {

// Sequence index of every row, from seq_q_start.
std::vector<int> seq_of_rows(const LayoutView& lv) {
  std::vector<int> seq(static_cast<size_t>(lv.num_tokens));
  for (int b = 0; b < lv.num_seqs; ++b) {
    for (int t = lv.q_start[b]; t < lv.q_start[b + 1]; ++t) seq[static_cast<size_t>(t)] = b;
  }
  return seq;
}

// The lightning indexer's score of entries for one row at a time, shared by indexer_topk and the
// V4.1 candidate ops: score(t, j) = sum_h weights[t,h] * weight_scale * relu(q[t,h] . k_j) *
// score_scale, the keys read through the index cache's KV format, q as f32 or as the e4m3 codes of
// quantize_indexer_q (decoded once: exact).
class IndexScorer {
 public:
  IndexScorer(const char* op, const Tensor& q, const Tensor& weights, const Tensor& index_cache,
              const LayoutView& lv, int ratio, float score_scale, float weight_scale)
      : op_(op),
        heads_(q.size(1)),
        dim_(q.size(2)),
        q_decoded_(q.dtype() == DType::kF8E4M3 ? q.to(DType::kF32) : Tensor()),
        q_(q_decoded_.defined() ? q_decoded_.data<float>() : q.data<float>()),
        weights_(weights.data<float>()),
        lv_(lv),
        epb_(lv.block_size / ratio),
        cache_rows_(index_cache.size(0)),
        codec_{index_cache.dtype(), q.size(2), /*rope_dim=*/0},
        in_place_(index_cache.dtype() == DType::kF32),
        cache_(static_cast<const uint8_t*>(index_cache.raw_data())),
        score_scale_(score_scale),
        weight_scale_(weight_scale) {}

  // score[i] = score(t, entries[i]) for row t of sequence b; `entries` empty means 0..n-1 (all
  // of them, n = score.size()). Splits over the pool (a nested parallel_for runs inline).
  void score(int64_t t, int b, const std::vector<int64_t>& entries, std::vector<float>& score,
             ThreadPool& pool) const {
    const float* qt = q_ + t * heads_ * dim_;
    const float* wt = weights_ + t * heads_;
    pool.parallel_for(
        static_cast<int64_t>(score.size()),
        [&](int64_t i0, int64_t i1) {
          std::vector<float> decoded(in_place_ ? 0 : static_cast<size_t>(dim_));
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t j = entries.empty() ? i : entries[static_cast<size_t>(i)];
            const uint8_t* row =
                cache_ + lv_.entry_row(op_, b, j, epb_, cache_rows_) * codec_.row_bytes();
            const float* key = reinterpret_cast<const float*>(row);
            if (!in_place_) {
              codec_.decode(row, decoded.data());
              key = decoded.data();
            }
            float s = 0.0f;
            for (int64_t h = 0; h < heads_; ++h) {
              // relu(q.k) * score_scale, then times weight * weight_scale, summed over heads in
              // order: DeepseekV4IndexerScorer's order.
              const float d = std::fmax(cpu::dot(qt + h * dim_, key, dim_), 0.0f) * score_scale_;
              s += (wt[h] * weight_scale_) * d;
            }
            // A NaN would break the ordering of top_by_score; it ranks last instead.
            score[static_cast<size_t>(i)] =
                std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
          }
        },
        cpu::grain_for(heads_ * dim_ * 2));
  }

 private:
  const char* op_;
  int64_t heads_;
  int64_t dim_;
  Tensor q_decoded_;
  const float* q_;
  const float* weights_;
  const LayoutView& lv_;
  int epb_;
  int64_t cache_rows_;
  kv_record::RowCodec codec_;
  bool in_place_;
  const uint8_t* cache_;
  float score_scale_;
  float weight_scale_;
};

// Writes to dst [k] the indices i of the min(k, n) highest score[i] (score descending, ties: lower
// index first; top-k is a set, the order only makes it deterministic), mapped through `ids` when
// it is not empty, then -1.
void top_by_score(const std::vector<float>& score, const std::vector<int64_t>& ids, int64_t k,
                  std::vector<int32_t>& order, int32_t* dst) {
  const auto n = static_cast<int64_t>(score.size());
  const int64_t chosen = std::min(k, n);
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + chosen, order.end(), [&](int32_t l, int32_t r) {
    const float sl = score[static_cast<size_t>(l)];
    const float sr = score[static_cast<size_t>(r)];
    return sl > sr || (sl == sr && l < r);
  });
  for (int64_t i = 0; i < chosen; ++i) {
    const int32_t o = order[static_cast<size_t>(i)];
    dst[i] = ids.empty() ? o : static_cast<int32_t>(ids[static_cast<size_t>(o)]);
  }
  std::fill(dst + chosen, dst + k, -1);
}

// Per-thread buffers of the indexer ops' token loop, reused across its tokens.
struct IndexScratch {
  std::vector<float> score;
  std::vector<float> block_score;
  std::vector<int64_t> entries;
  std::vector<int32_t> order;
};

// The loop the indexer ops share (on the backend's stream, with its pool): the layout checked
// once, then the query tokens in parallel, each given to `body(t, sequence, visible entries,
// scorer, scratch)`. With a single token the scorer's own loop takes the pool instead.
template <typename Body>
void for_each_index_token(ThreadPool& pool, const char* op, const Tensor& q, const Tensor& weights,
                          const Tensor& index_cache, const BatchLayout& layout, int ratio,
                          float score_scale, float weight_scale, Body body) {
  const LayoutView lv(op, layout, -1);
  const std::vector<int> seq = seq_of_rows(lv);
  const IndexScorer scorer(op, q, weights, index_cache, lv, ratio, score_scale, weight_scale);
  pool.parallel_for(layout.num_tokens, [&](int64_t begin, int64_t end) {
    IndexScratch scratch;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t visible = (static_cast<int64_t>(lv.positions[t]) + 1) / ratio;
      body(t, seq[static_cast<size_t>(t)], visible, scorer, scratch);
    }
  });
}

}  // namespace

Tensor CpuBackend::indexer_topk_impl(const Tensor& q, const Tensor& weights,
                                     const Tensor& index_cache, const BatchLayout& layout,
                                     int ratio, int top_k, float score_scale, float weight_scale) {
  const int64_t k = top_k;
  Tensor out = Tensor::zeros({layout.num_tokens, k}, DType::kI32);
  enqueue([=](ThreadPool& pool) {
    for_each_index_token(
        pool, "indexer_topk", q, weights, index_cache, layout, ratio, score_scale, weight_scale,
        [&](int64_t t, int b, int64_t visible, const IndexScorer& scorer, IndexScratch& s) {
          s.score.assign(static_cast<size_t>(visible), 0.0f);
          scorer.score(t, b, {}, s.score, pool);
          top_by_score(s.score, {}, k, s.order, out.data<int32_t>() + t * k);
        });
  });
  return out;
}

IndexerQFp8 CpuBackend::quantize_indexer_q_impl(const Tensor& q, const Tensor& weights) {
  const int64_t rows = q.size(0) * q.size(1), dim = q.size(2);
  IndexerQFp8 out{Tensor::zeros(q.shape(), DType::kF8E4M3),
                  Tensor::zeros(weights.shape(), DType::kF32)};
  enqueue([=](ThreadPool& pool) {
    pool.parallel_for(
        rows,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            auto* codes = static_cast<uint8_t*>(out.q.raw_data()) + r * dim;
            const float s = indexer_q::quantize_row(q.data<float>() + r * dim, dim, codes);
            out.weights.data<float>()[r] = weights.data<float>()[r] * s;
          }
        },
        cpu::grain_for(dim * 4));
  });
  return out;
}

Tensor CpuBackend::indexer_candidates_impl(const Tensor& q, const Tensor& weights,
                                           const Tensor& index_cache, const BatchLayout& layout,
                                           int ratio, int block_entries, int top_blocks,
                                           float score_scale, float weight_scale) {
  const int64_t k = top_blocks;
  const int64_t bs = block_entries;
  Tensor out = Tensor::zeros({layout.num_tokens, k}, DType::kI32);
  enqueue([=](ThreadPool& pool) {
    for_each_index_token(
        pool, "indexer_candidates", q, weights, index_cache, layout, ratio, score_scale,
        weight_scale,
        [&](int64_t t, int b, int64_t visible, const IndexScorer& scorer, IndexScratch& s) {
          s.score.assign(static_cast<size_t>(visible), 0.0f);
          scorer.score(t, b, {}, s.score, pool);
          // A block with any visible entry is a candidate; the last one may be partly visible
          // and is scored by its visible entries only.
          const int64_t blocks = (visible + bs - 1) / bs;
          s.block_score.assign(static_cast<size_t>(blocks), 0.0f);
          for (int64_t c = 0; c < blocks; ++c) {
            const int64_t last = std::min(visible, (c + 1) * bs);
            float mx = s.score[static_cast<size_t>(c * bs)];
            for (int64_t j = c * bs + 1; j < last; ++j)
              mx = std::fmax(mx, s.score[static_cast<size_t>(j)]);
            s.block_score[static_cast<size_t>(c)] = mx;
          }
          top_by_score(s.block_score, {}, k, s.order, out.data<int32_t>() + t * k);
        });
  });
  return out;
}

Tensor CpuBackend::indexer_topk_in_candidates_impl(const Tensor& q, const Tensor& weights,
                                                   const Tensor& index_cache,
                                                   const BatchLayout& layout, int ratio,
                                                   const Tensor& candidates, int block_entries,
                                                   int top_k, float score_scale,
                                                   float weight_scale) {
  const char* op = "indexer_topk_in_candidates";
  const int64_t k = top_k;
  const int64_t bs = block_entries;
  const int64_t kb = candidates.size(1);
  Tensor out = Tensor::zeros({layout.num_tokens, k}, DType::kI32);
  enqueue([=](ThreadPool& pool) {
    for_each_index_token(
        pool, op, q, weights, index_cache, layout, ratio, score_scale, weight_scale,
        [&](int64_t t, int b, int64_t visible, const IndexScorer& scorer, IndexScratch& s) {
          const int32_t* cand = candidates.data<int32_t>() + t * kb;
          // The visible entries of the candidate blocks, ascending and once each (a repeated
          // block must not count twice), so ties still go to the lower absolute index.
          s.entries.clear();
          for (int64_t i = 0; i < kb; ++i) {
            const int64_t c = cand[i];
            if (c == -1) continue;
            if (c < 0) {
              fail(op, "candidates[" + std::to_string(t) + "][" + std::to_string(i) +
                           "] = " + std::to_string(c) + " is negative and not -1");
            }
            for (int64_t j = c * bs; j < std::min(visible, (c + 1) * bs); ++j)
              s.entries.push_back(j);
          }
          std::sort(s.entries.begin(), s.entries.end());
          s.entries.erase(std::unique(s.entries.begin(), s.entries.end()), s.entries.end());
          s.score.assign(s.entries.size(), 0.0f);
          if (!s.entries.empty()) scorer.score(t, b, s.entries, s.score, pool);
          top_by_score(s.score, s.entries, k, s.order, out.data<int32_t>() + t * k);
        });
  });
  return out;
}

Tensor CpuBackend::attention_impl(const Tensor& q, const Tensor& kv, const Tensor& swa_ring,
                                  const Tensor& entries, const Tensor& topk, const Tensor& sinks,
                                  const BatchLayout& layout, const AttentionSpec& spec) {
  const char* op = "attention";
  const bool compressed = spec.ratio > 0;
  const int64_t tokens = layout.num_tokens;
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const bool sparse = compressed && spec.sparse;
  const int64_t slots = swa_ring.size(0);
  const int64_t ring_len = swa_ring.size(1);
  Tensor out = Tensor::zeros({tokens, heads, dim}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const LayoutView lv(op, layout, slots);
    const std::vector<int> seq = seq_of_rows(lv);
    const int64_t window = spec.window;
    const int epb = compressed ? lv.block_size / spec.ratio : 0;
    const int64_t entry_rows = compressed ? entries.size(0) : 0;
    const int64_t topk_cols = sparse ? topk.size(1) : 0;
    // Keys are read through the caches' KV format (f32 caches are read in place). This call's
    // keys go through it too, so a key reads the same from `kv` as from the ring later.
    // The ring and the entries may differ (V4.1: FP8 SWA keys, FP4 entries).
    const kv_record::RowCodec codec{swa_ring.dtype(), dim, spec.rope_dim};
    const kv_record::RowCodec entry_codec{compressed ? entries.dtype() : DType::kF32, dim,
                                          spec.rope_dim};
    const bool in_place = swa_ring.dtype() == DType::kF32;
    const int64_t row_bytes = codec.row_bytes();
    const int64_t entry_row_bytes = entry_codec.row_bytes();
    std::vector<float> kv_stored;
    const float* kv_p = kv.dtype() == DType::kF32 ? kv.data<float>() : nullptr;
    if (kv_p == nullptr) {
      // Already in the ring's format (rms_norm_rope_kv's rows): decoded only.
      kv_stored.resize(static_cast<size_t>(tokens * dim));
      const auto* records = static_cast<const uint8_t*>(kv.raw_data());
      for (int64_t t = 0; t < tokens; ++t) {
        codec.decode(records + t * row_bytes, kv_stored.data() + t * dim);
      }
      kv_p = kv_stored.data();
    } else if (!in_place) {
      kv_stored.resize(static_cast<size_t>(tokens * dim));
      std::vector<uint8_t> record(static_cast<size_t>(row_bytes));
      for (int64_t t = 0; t < tokens; ++t) {
        codec.encode(kv_p + t * dim, record.data());
        codec.decode(record.data(), kv_stored.data() + t * dim);
      }
      kv_p = kv_stored.data();
    }
    // bf16 q (a backend's rms_norm_rope under bf16_output) widened exactly.
    std::vector<float> q_wide;
    const float* q_p = q.dtype() == DType::kF32 ? q.data<float>() : nullptr;
    if (q_p == nullptr) {
      q_wide.resize(static_cast<size_t>(q.numel()));
      convert_elements(q.raw_data(), q.dtype(), q_wide.data(), DType::kF32, q_wide.size());
      q_p = q_wide.data();
    }
    const auto* ring_p = static_cast<const uint8_t*>(swa_ring.raw_data());
    const auto* ent = compressed ? static_cast<const uint8_t*>(entries.raw_data()) : nullptr;
    const float* sink = sinks.data<float>();
    const int32_t* swa_start = spec.swa_start.defined() ? spec.swa_start.data<int32_t>() : nullptr;
    pool.parallel_for(tokens, [&](int64_t begin, int64_t end) {
      std::vector<const float*> keys;
      // Cached keys still to decode: (index in keys, row in the cache, its format).
      struct Pending {
        size_t key;
        const uint8_t* row;
        const kv_record::RowCodec* codec;
      };
      std::vector<Pending> pending;
      std::vector<float> decoded;
      auto add_cached = [&](const uint8_t* row, const kv_record::RowCodec& row_codec) {
        if (row_codec.dtype != DType::kF32) pending.push_back({keys.size(), row, &row_codec});
        keys.push_back(reinterpret_cast<const float*>(row));
      };
      for (int64_t t = begin; t < end; ++t) {
        pending.clear();
        const int b = seq[static_cast<size_t>(t)];
        const int64_t p = lv.positions[t];
        const int64_t ctx = lv.ctx_len[b];
        // Sliding keys (p - W, p] from swa_start on: this call's rows, or the ring for earlier
        // tokens.
        keys.clear();
        const int64_t lo = std::max<int64_t>({0, p - window + 1, swa_start ? swa_start[b] : 0});
        for (int64_t j = lo; j <= p; ++j) {
          if (j >= ctx) {
            keys.push_back(kv_p + (lv.q_start[b] + j - ctx) * dim);
          } else {
            if (j < ctx - ring_len) {
              throw Error(ErrorCode::kInternal,
                          std::string(op) + ": key position " + std::to_string(j) +
                              " of sequence " + std::to_string(b) +
                              " is no longer in the SWA ring (context " + std::to_string(ctx) +
                              ", ring of " + std::to_string(ring_len) + ")");
            }
            add_cached(ring_p + (lv.slot[b] * ring_len + j % ring_len) * row_bytes, codec);
          }
        }
        if (compressed) {
          const int64_t visible = (p + 1) / spec.ratio;
          if (!sparse) {
            for (int64_t j = 0; j < visible; ++j) {
              add_cached(ent + lv.entry_row(op, b, j, epb, entry_rows) * entry_row_bytes,
                         entry_codec);
            }
          } else {
            const int32_t* sel = topk.data<int32_t>() + t * topk_cols;
            for (int64_t i = 0; i < topk_cols; ++i) {
              if (sel[i] < 0) continue;  // -1: no entry
              if (sel[i] >= visible) {
                fail(op, "topk[" + std::to_string(t) + "][" + std::to_string(i) +
                             "] = " + std::to_string(sel[i]) + " is not visible at position " +
                             std::to_string(p) + " (" + std::to_string(visible) + " entries)");
              }
              add_cached(ent + lv.entry_row(op, b, sel[i], epb, entry_rows) * entry_row_bytes,
                         entry_codec);
            }
          }
        }
        decoded.resize(pending.size() * static_cast<size_t>(dim));
        for (size_t i = 0; i < pending.size(); ++i) {
          float* key = decoded.data() + i * static_cast<size_t>(dim);
          pending[i].codec->decode(pending[i].row, key);
          keys[pending[i].key] = key;
        }
        // Heads in parallel when tokens are not (a nested parallel_for runs inline).
        pool.parallel_for(
            heads,
            [&](int64_t h0, int64_t h1) {
              std::vector<float> logit(keys.size());
              for (int64_t h = h0; h < h1; ++h) {
                const float* qh = q_p + (t * heads + h) * dim;
                float mx = sink[h];
                for (size_t j = 0; j < keys.size(); ++j) {
                  logit[j] = cpu::dot(qh, keys[j], dim) * spec.scale;
                  mx = std::fmax(mx, logit[j]);
                }
                // The sink only adds to the denominator.
                float den = std::exp(sink[h] - mx);
                for (size_t j = 0; j < keys.size(); ++j) {
                  logit[j] = std::exp(logit[j] - mx);
                  den += logit[j];
                }
                float* o = out.data<float>() + (t * heads + h) * dim;
                for (size_t j = 0; j < keys.size(); ++j) {
                  const float pj = logit[j] / den;
                  const float* key = keys[j];
                  for (int64_t d = 0; d < dim; ++d) o[d] += pj * key[d];
                }
              }
            },
            cpu::grain_for(static_cast<int64_t>(keys.size()) * dim * 4));
      }
    });
  });
  if (spec.output_rope_inv_freq.defined()) {
    return rope_impl(out, layout.positions, spec.output_rope_inv_freq, /*inverse=*/true);
  }
  return out;
}

}  // namespace deepinfer
