// Accuracy of the KV cache dtypes (docs/model.md#kv-cache-dtypes): how far the bf16 and fp8
// caches move what the engine computes from the f32 reference, at V4-Flash shapes and growing
// context lengths. Every number comes from the backend ops themselves: the caches are written
// with ring_write / scatter_rows in each dtype from the same f32 rows, then read by attention /
// indexer_topk, exactly as the model graph does.
//
// Shapes (V4-Flash): 64 heads of head_dim 512 with 64 RoPE channels, sliding window 128, CSA
// ratio 4 with an indexer of 64 heads x 128 picking the top 512, HCA ratio 128.
//
// Inputs: every key, query and index key is a row of N(0, 1) channels scaled to RMS 1 exactly
// (the unweighted RMSNorm the model applies before its caches), so a channel is ~N(0, 1) and
// q.k / sqrt(D) ~ N(0, 1). Sinks and indexer head weights are N(0, 1). There are no outlier
// channels: real activations have some, and the fp8 records' per-64-channel scales then cost
// more than here. The N queries are N single-token sequences at position L-1 (context L-1), all
// reading the same caches (one SWA ring slot, the same block table); the key at L-1 is this
// call's `kv`, the other 127 window keys come from the ring.
//
// At each context length L, for each dtype (bf16, fp8) against f32:
//  1. csa_sparse: attention over the window's 128 keys and 512 compressed entries chosen at
//     random (distinct, the same for every dtype) among the L/4 visible ones.
//  2. hca_dense: attention over all L/128 compressed entries plus the window.
//     For 1 and 2: rel_err = ||out_dtype - out_f32|| / ||out_f32|| per (query, head) row; max
//     and mean over the rows.
//  3. indexer: indexer_topk over L/4 index keys stored in the dtype (queries f32) vs f32 keys:
//     recall = |top512_dtype & top512_f32| / 512 (mean and min over queries), and the relative
//     error of the scores of the entries the dtype's indexer selected, the score computed on the
//     host with the decoded keys vs with the f32 keys (||s_dtype - s_f32|| / ||s_f32|| over the
//     512 entries; max and mean over queries). For fp8 keys also "fp8+q8": q rounded to e4m3
//     per (token, head) first (quantize_indexer_q), as the model does with fp8 index keys.
//
// Usage: kv_accuracy [--device cpu|cuda] [--contexts 4096,32768,131072] [--queries 4]
//                    [--seed 1] [--threads 0]
// One JSON object per line, then a table.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "tensor/kv_record.h"

using namespace deepinfer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kHeads = 64;
constexpr int kDim = 512;
constexpr int kRope = 64;
constexpr int kWindow = 128;
constexpr int kBlock = 128;  // tokens per paged block
constexpr int kIndexHeads = 64;
constexpr int kIndexDim = 128;
constexpr int kTopK = 512;
constexpr int kCsaRatio = 4;
constexpr int kHcaRatio = 128;

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

// `rows` rows of `dim` N(0, 1) channels, each scaled to RMS 1.
std::vector<float> rms_rows(std::mt19937_64& rng, int64_t rows, int64_t dim) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(sz(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* x = &v[sz(r * dim)];
    double ss = 0;
    for (int64_t c = 0; c < dim; ++c) {
      x[c] = normal(rng);
      ss += static_cast<double>(x[c]) * x[c];
    }
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim)));
    for (int64_t c = 0; c < dim; ++c) x[c] *= inv;
  }
  return v;
}

std::vector<float> normals(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(sz(n));
  for (float& x : v) x = normal(rng);
  return v;
}

struct Bench {
  Backend& be;

  Tensor up(const std::vector<float>& v, Shape shape) {
    return be.upload(Tensor::from_vector<float>(v, std::move(shape)), DType::kF32);
  }
  Tensor up_i(const std::vector<int32_t>& v, Shape shape) {
    return be.upload(Tensor::from_vector<int32_t>(v, std::move(shape)), DType::kI32);
  }
  std::vector<float> fetch_f32(const Tensor& t) {
    Tensor h = be.to_host(t);
    const float* p = h.data<float>();
    return {p, p + h.numel()};
  }
  std::vector<int32_t> fetch_i32(const Tensor& t) {
    Tensor h = be.to_host(t);
    const int32_t* p = h.data<int32_t>();
    return {p, p + h.numel()};
  }

  // `seqs` sequences of `q` tokens each, from context `ctx`, all in state slot 0 and on the
  // identity block table of `max_blocks` blocks.
  BatchLayout layout(int seqs, int q, int ctx, int max_blocks) {
    BatchLayout l;
    const int t = seqs * q;
    l.num_tokens = t;
    l.num_seqs = seqs;
    l.block_size = kBlock;
    l.max_blocks_per_seq = max_blocks;
    std::vector<int32_t> positions, token_seq, q_start{0}, ctx_len, slot, table;
    for (int b = 0; b < seqs; ++b) {
      for (int i = 0; i < q; ++i) {
        positions.push_back(ctx + i);
        token_seq.push_back(b);
      }
      q_start.push_back((b + 1) * q);
      ctx_len.push_back(ctx);
      slot.push_back(0);
      for (int i = 0; i < max_blocks; ++i) table.push_back(i);
    }
    l.token_ids = up_i(std::vector<int32_t>(sz(t), 0), {t});
    l.positions = up_i(positions, {t});
    l.token_seq = up_i(token_seq, {t});
    l.seq_q_start = up_i(q_start, {seqs + 1});
    l.seq_ctx_len = up_i(ctx_len, {seqs});
    l.seq_slot = up_i(slot, {seqs});
    l.block_table = up_i(table, {seqs, max_blocks});
    return l;
  }
};

// ||a_r - b_r|| / ||b_r|| for every row r of `width` values: {max, mean}.
std::pair<double, double> row_rel_err(const std::vector<float>& a, const std::vector<float>& b,
                                      int64_t width) {
  const int64_t rows = static_cast<int64_t>(b.size()) / width;
  double mx = 0, sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0, den = 0;
    for (int64_t c = 0; c < width; ++c) {
      const double d = static_cast<double>(a[sz(r * width + c)]) - b[sz(r * width + c)];
      num += d * d;
      den += static_cast<double>(b[sz(r * width + c)]) * b[sz(r * width + c)];
    }
    const double e = std::sqrt(num / std::max(den, 1e-300));
    mx = std::max(mx, e);
    sum += e;
  }
  return {mx, sum / static_cast<double>(rows)};
}

struct Row {
  std::string test;
  int context = 0;
  std::string dtype;
  int keys = 0;     // keys per query (attention) or entries scored (indexer)
  double a = 0;     // rel_err_max | recall_mean
  double b = 0;     // rel_err_mean | recall_min
  double c = -1;    // indexer: score_rel_err_max
  double d = -1;    // indexer: score_rel_err_mean
  double secs = 0;  // time of the dtype's op call(s)
};

const char* dtype_label(DType d) {
  return d == DType::kU8 ? "fp8" : d == DType::kBF16 ? "bf16" : "f32";
}

std::vector<int> parse_contexts(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    out.push_back(std::atoi(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return out;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

static int run(int argc, char** argv) {
  std::string device = "cpu";
  std::string contexts_arg = "4096,32768,131072";
  int queries = 4;
  uint64_t seed = 1;
  int threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0) {
      device = argv[i + 1];
    } else if (std::strcmp(argv[i], "--contexts") == 0) {
      contexts_arg = argv[i + 1];
    } else if (std::strcmp(argv[i], "--queries") == 0) {
      queries = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--seed") == 0) {
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "kv_accuracy: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const std::vector<int> contexts = parse_contexts(contexts_arg);
  for (int L : contexts) {
    if (L < kHcaRatio || L % kHcaRatio != 0 || L / kCsaRatio < kTopK) {
      std::fprintf(stderr, "kv_accuracy: context %d must be a multiple of %d and >= %d\n", L,
                   kHcaRatio, kTopK * kCsaRatio);
      return 2;
    }
  }
  if (queries < 1) {
    std::fprintf(stderr, "kv_accuracy: --queries must be >= 1\n");
    return 2;
  }

  const auto t_start = Clock::now();
  std::unique_ptr<Backend> backend = make_backend(device, threads);
  Backend& be = *backend;
  Bench bench{be};
  std::printf(
      "{\"device\": \"%s\", \"heads\": %d, \"head_dim\": %d, \"rope_dim\": %d, \"window\": %d, "
      "\"index_heads\": %d, \"index_head_dim\": %d, \"index_topk\": %d, \"csa_ratio\": %d, "
      "\"hca_ratio\": %d, \"queries\": %d, \"seed\": %llu}\n",
      be.name().c_str(), kHeads, kDim, kRope, kWindow, kIndexHeads, kIndexDim, kTopK, kCsaRatio,
      kHcaRatio, queries, static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kU8};
  std::vector<Row> table;
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(kIndexDim));
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(kIndexHeads));

  for (int L : contexts) {
    std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(L));
    const int max_blocks = L / kBlock;
    const int csa_entries = L / kCsaRatio;
    const int hca_entries = L / kHcaRatio;
    const int Q = queries;

    // Inputs, shared by every dtype.
    const std::vector<float> window_keys = rms_rows(rng, kWindow, kDim);  // positions L-128..L-1
    const std::vector<float> csa_keys = rms_rows(rng, csa_entries, kDim);
    const std::vector<float> hca_keys = rms_rows(rng, hca_entries, kDim);
    const std::vector<float> q = rms_rows(rng, int64_t{Q} * kHeads, kDim);
    const std::vector<float> sinks = normals(rng, kHeads);
    const std::vector<float> index_keys = rms_rows(rng, csa_entries, kIndexDim);
    const std::vector<float> index_q = rms_rows(rng, int64_t{Q} * kIndexHeads, kIndexDim);
    const std::vector<float> index_w = normals(rng, int64_t{Q} * kIndexHeads);
    // 512 distinct random entries per query for the sparse attention.
    std::vector<int32_t> topk;
    {
      std::vector<int32_t> all(sz(csa_entries));
      for (int j = 0; j < csa_entries; ++j) all[sz(j)] = j;
      for (int t = 0; t < Q; ++t) {
        std::shuffle(all.begin(), all.end(), rng);
        std::vector<int32_t> pick(all.begin(), all.begin() + kTopK);
        std::sort(pick.begin(), pick.end());
        topk.insert(topk.end(), pick.begin(), pick.end());
      }
    }
    // The ring gets positions L-128..L-2 (one prefill-like write); the key at L-1 is `kv`.
    const std::vector<float> ring_rows(window_keys.begin(), window_keys.end() - kDim);
    std::vector<float> kv;
    for (int t = 0; t < Q; ++t) kv.insert(kv.end(), window_keys.end() - kDim, window_keys.end());
    const BatchLayout ring_layout = bench.layout(1, kWindow - 1, L - kWindow, max_blocks);
    const BatchLayout attn_layout = bench.layout(Q, 1, L - 1, max_blocks);
    std::vector<int32_t> csa_dest(sz(csa_entries)), hca_dest(sz(hca_entries));
    for (int j = 0; j < csa_entries; ++j) csa_dest[sz(j)] = j;  // identity table: row = entry
    for (int j = 0; j < hca_entries; ++j) hca_dest[sz(j)] = j;
    const Tensor q_t = bench.up(q, {Q, kHeads, kDim});
    const Tensor kv_t = bench.up(kv, {Q, kDim});
    const Tensor sinks_t = bench.up(sinks, {kHeads});
    const Tensor topk_t = bench.up_i(topk, {Q, kTopK});
    const Tensor ring_rows_t = bench.up(ring_rows, {kWindow - 1, kDim});
    const Tensor csa_rows_t = bench.up(csa_keys, {csa_entries, kDim});
    const Tensor hca_rows_t = bench.up(hca_keys, {hca_entries, kDim});
    const Tensor csa_dest_t = bench.up_i(csa_dest, {csa_entries});
    const Tensor hca_dest_t = bench.up_i(hca_dest, {hca_entries});
    const Tensor iq_t = bench.up(index_q, {Q, kIndexHeads, kIndexDim});
    const Tensor iw_t = bench.up(index_w, {Q, kIndexHeads});
    const Tensor ikeys_t = bench.up(index_keys, {csa_entries, kIndexDim});

    std::vector<float> ref_csa, ref_hca;
    std::vector<int32_t> ref_top;
    for (DType dtype : dtypes) {
      const char* name = dtype_label(dtype);
      if (!be.supports_kv_cache_dtype(dtype)) {
        std::printf(
            "{\"context\": %d, \"dtype\": \"%s\", \"skipped\": \"%s has no %s KV kernels\"}\n", L,
            name, be.name().c_str(), name);
        std::fflush(stdout);
        continue;
      }
      const int64_t width = kv_record::row_width(dtype, kDim, kRope);
      Tensor ring = be.zeros({1, kWindow, width}, dtype);
      be.ring_write(ring, ring_rows_t, ring_layout, kRope);
      Tensor csa = be.zeros({csa_entries, width}, dtype);
      be.scatter_rows(csa, csa_rows_t, csa_dest_t, kRope);
      Tensor hca = be.zeros({hca_entries, width}, dtype);
      be.scatter_rows(hca, hca_rows_t, hca_dest_t, kRope);
      const int64_t iwidth = kv_record::row_width(dtype, kIndexDim, 0);
      Tensor icache = be.zeros({csa_entries, iwidth}, dtype);
      be.scatter_rows(icache, ikeys_t, csa_dest_t, 0);
      be.synchronize();

      AttentionSpec spec;
      spec.window = kWindow;
      spec.scale = attn_scale;
      spec.rope_dim = kRope;

      // 1. CSA: sparse attention over the window and 512 chosen entries.
      spec.ratio = kCsaRatio;
      spec.sparse = true;
      auto t0 = Clock::now();
      std::vector<float> out_csa =
          bench.fetch_f32(be.attention(q_t, kv_t, ring, csa, topk_t, sinks_t, attn_layout, spec));
      const double csa_secs = seconds_since(t0);
      // 2. HCA: dense attention over every entry and the window.
      spec.ratio = kHcaRatio;
      spec.sparse = false;
      t0 = Clock::now();
      std::vector<float> out_hca =
          bench.fetch_f32(be.attention(q_t, kv_t, ring, hca, Tensor(), sinks_t, attn_layout, spec));
      const double hca_secs = seconds_since(t0);
      // 3. Indexer top-512.
      t0 = Clock::now();
      std::vector<int32_t> top = bench.fetch_i32(be.indexer_topk(
          iq_t, iw_t, icache, attn_layout, kCsaRatio, kTopK, score_scale, weight_scale));
      const double idx_secs = seconds_since(t0);

      if (dtype == DType::kF32) {
        ref_csa = std::move(out_csa);
        ref_hca = std::move(out_hca);
        ref_top = std::move(top);
        std::printf(
            "{\"context\": %d, \"dtype\": \"f32\", \"csa_s\": %.3f, \"hca_s\": %.3f, "
            "\"indexer_s\": %.3f}\n",
            L, csa_secs, hca_secs, idx_secs);
        std::fflush(stdout);
        continue;
      }
      if (ref_csa.empty()) {
        std::printf("{\"context\": %d, \"dtype\": \"%s\", \"skipped\": \"no f32 reference\"}\n", L,
                    name);
        continue;
      }

      const auto [csa_max, csa_mean] = row_rel_err(out_csa, ref_csa, kDim);
      const auto [hca_max, hca_mean] = row_rel_err(out_hca, ref_hca, kDim);
      std::printf(
          "{\"test\": \"csa_sparse_attention\", \"context\": %d, \"dtype\": \"%s\", "
          "\"keys_per_query\": %d, \"rows\": %d, \"rel_err_max\": %.4e, \"rel_err_mean\": %.4e, "
          "\"s\": %.3f}\n",
          L, name, kWindow + kTopK, Q * kHeads, csa_max, csa_mean, csa_secs);
      std::printf(
          "{\"test\": \"hca_dense_attention\", \"context\": %d, \"dtype\": \"%s\", "
          "\"keys_per_query\": %d, \"rows\": %d, \"rel_err_max\": %.4e, \"rel_err_mean\": %.4e, "
          "\"s\": %.3f}\n",
          L, name, kWindow + hca_entries, Q * kHeads, hca_max, hca_mean, hca_secs);
      table.push_back(
          {"csa_sparse_attention", L, name, kWindow + kTopK, csa_max, csa_mean, -1, -1, csa_secs});
      table.push_back({"hca_dense_attention", L, name, kWindow + hca_entries, hca_max, hca_mean, -1,
                       -1, hca_secs});

      // Indexer: recall of the f32 set, and the selected entries' scores with the stored keys.
      // With fp8 keys the model also rounds q to e4m3 per (token, head) (quantize_indexer_q, as
      // DeepSeek's engine does): its row, "fp8+q8", is what the engine selects.
      const kv_record::RowCodec codec{dtype, kIndexDim, 0};
      Tensor icache_host = be.to_host(icache);
      const auto* ibytes = static_cast<const uint8_t*>(icache_host.raw_data());
      std::vector<float> decoded(kIndexDim);
      auto indexer_row = [&](const std::vector<int32_t>& selected, const std::string& label,
                             double secs) {
        double recall_sum = 0, recall_min = 1, err_max = 0, err_sum = 0;
        for (int t = 0; t < Q; ++t) {
          const int32_t* mine = &selected[sz(t * kTopK)];
          std::vector<int32_t> a(mine, mine + kTopK),
              b(&ref_top[sz(t * kTopK)], &ref_top[sz(t * kTopK)] + kTopK);
          std::sort(a.begin(), a.end());
          std::sort(b.begin(), b.end());
          std::vector<int32_t> both;
          std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
          const double recall = static_cast<double>(both.size()) / kTopK;
          recall_sum += recall;
          recall_min = std::min(recall_min, recall);
          // The indexer's score formula (backend.h), in double, with either key.
          auto score = [&](const float* key) {
            double s = 0;
            for (int h = 0; h < kIndexHeads; ++h) {
              const float* qh = &index_q[sz((t * kIndexHeads + h) * kIndexDim)];
              double d = 0;
              for (int c = 0; c < kIndexDim; ++c) d += static_cast<double>(qh[c]) * key[c];
              s += static_cast<double>(index_w[sz(t * kIndexHeads + h)]) * weight_scale *
                   std::max(d, 0.0) * score_scale;
            }
            return s;
          };
          double num = 0, den = 0;
          for (int i = 0; i < kTopK; ++i) {
            const int32_t j = mine[i];
            if (j < 0) continue;
            codec.decode(ibytes + j * codec.row_bytes(), decoded.data());
            const double s_ref = score(&index_keys[sz(int64_t{j} * kIndexDim)]);
            const double s_dt = score(decoded.data());
            num += (s_dt - s_ref) * (s_dt - s_ref);
            den += s_ref * s_ref;
          }
          const double err = std::sqrt(num / std::max(den, 1e-300));
          err_max = std::max(err_max, err);
          err_sum += err;
        }
        const double recall_mean = recall_sum / Q, err_mean = err_sum / Q;
        std::printf(
            "{\"test\": \"indexer_topk\", \"context\": %d, \"dtype\": \"%s\", \"entries\": %d, "
            "\"top_k\": %d, \"queries\": %d, \"recall_mean\": %.4f, \"recall_min\": %.4f, "
            "\"score_rel_err_max\": %.4e, \"score_rel_err_mean\": %.4e, \"s\": %.3f}\n",
            L, label.c_str(), csa_entries, kTopK, Q, recall_mean, recall_min, err_max, err_mean,
            secs);
        std::fflush(stdout);
        table.push_back({"indexer_topk", L, label, csa_entries, recall_mean, recall_min, err_max,
                         err_mean, secs});
      };
      indexer_row(top, name, idx_secs);
      if (dtype == DType::kU8) {
        t0 = Clock::now();
        const IndexerQFp8 q8 = be.quantize_indexer_q(iq_t, iw_t);
        const std::vector<int32_t> top_q8 = bench.fetch_i32(be.indexer_topk(
            q8.q, q8.weights, icache, attn_layout, kCsaRatio, kTopK, score_scale, weight_scale));
        indexer_row(top_q8, std::string(name) + "+q8", seconds_since(t0));
      }
    }
  }

  const double total = seconds_since(t_start);
  std::printf("{\"total_s\": %.1f}\n", total);
  std::printf("\n%-22s %8s %5s %8s  %-34s %s\n", "test", "context", "dtype", "keys",
              "output rel err / recall", "indexer scores");
  for (const Row& r : table) {
    char out[64], extra[64] = "";
    if (r.test == "indexer_topk") {
      std::snprintf(out, sizeof out, "recall mean %.4f min %.4f", r.a, r.b);
      std::snprintf(extra, sizeof extra, "rel err max %.2e mean %.2e", r.c, r.d);
    } else {
      std::snprintf(out, sizeof out, "rel err max %.2e mean %.2e", r.a, r.b);
    }
    std::printf("%-22s %8d %5s %8d  %-34s %s\n", r.test.c_str(), r.context, r.dtype.c_str(), r.keys,
                out, extra);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_accuracy: %s\n", e.what());
    return 1;
  }
}
