// Cache ops of the CPU backend: the per-sequence rings (SWA keys, compressor rows), compressor
// pooling and the scatter into paged entry caches (docs/model.md: #pooling-a-window,
// #kv-and-state-layout).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_checks.h"
#include "backend/cpu_math.h"
#include "tensor/kv_record.h"

namespace deepinfer {

using cpu::fail;
using cpu::LayoutView;

Tensor CpuBackend::rms_norm_rope_kv_impl(const Tensor& x, const Tensor& weight, float eps,
                                         const Tensor& positions, const Tensor& inv_freq,
                                         DType kv_dtype, int rope_dim) {
  Tensor f32 = rms_norm_rope_impl(x, weight, eps, positions, inv_freq, /*bf16_output=*/false);
  if (kv_dtype == DType::kF32) return f32;
  const kv_record::RowCodec codec{kv_dtype, x.size(1), rope_dim};
  Tensor rows = Tensor::zeros({x.size(0), codec.row_width()}, kv_dtype);
  enqueue([=](ThreadPool&) {
    const float* src = f32.data<float>();
    auto* dst = static_cast<uint8_t*>(rows.raw_data());
    for (int64_t t = 0; t < rows.size(0); ++t) {
      codec.encode(src + t * codec.dim, dst + t * codec.row_bytes());
    }
  });
  return rows;
}

void CpuBackend::ring_write_impl(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                                 int rope_dim) {
  const int64_t slots = ring.size(0);
  const int64_t ring_len = ring.size(1);
  // Rows are stored in the ring's KV format (f32 rows are copied as they are); rows already in it
  // (rms_norm_rope_kv's: the ring's dtype, not f32) are copied as records.
  const bool encoded = rows.dtype() != DType::kF32;
  const int64_t row_bytes = ring.size(2) * static_cast<int64_t>(dtype_size(ring.dtype()));
  const kv_record::RowCodec codec{ring.dtype(), encoded ? 0 : rows.size(1), rope_dim};
  enqueue([=](ThreadPool&) {
    const LayoutView lv("ring_write", layout, slots);
    const auto* src = static_cast<const uint8_t*>(rows.raw_data());
    auto* dst = static_cast<uint8_t*>(ring.raw_data());
    for (int b = 0; b < lv.num_seqs; ++b) {
      // Only the last ring_len rows survive; earlier ones would be overwritten by them.
      const int64_t end = lv.q_start[b + 1];
      const int64_t begin = std::max<int64_t>(lv.q_start[b], end - ring_len);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t slot_row = lv.slot[b] * ring_len + lv.positions[t] % ring_len;
        if (encoded) {
          std::memcpy(dst + slot_row * row_bytes, src + t * row_bytes,
                      static_cast<size_t>(row_bytes));
        } else {
          codec.encode(reinterpret_cast<const float*>(src) + t * codec.dim,
                       dst + slot_row * row_bytes);
        }
      }
    }
  });
}

Tensor CpuBackend::compress_pool_impl(const Tensor& proj, const Tensor& ring, const Tensor& ape,
                                      const BatchLayout& layout, const EntryBatch& entries,
                                      const CompressSpec& spec) {
  const char* op = "compress_pool";
  const int64_t m = spec.ratio;
  const int64_t dim = spec.head_dim;
  const int64_t c = spec.overlap ? 2 * dim : dim;  // one series per half with overlap
  const int64_t num_entries = entries.num_entries;
  const int64_t slots = ring.size(0);
  const int64_t ring_len = ring.size(1);
  const bool overlap = spec.overlap;
  const Tensor seq = entries.seq;
  const Tensor window = entries.window;
  Tensor out = Tensor::zeros({num_entries, dim}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const LayoutView lv(op, layout, slots);
    const int32_t* seq_of = seq.data<int32_t>();
    const int32_t* win = window.data<int32_t>();
    const float* proj_p = proj.data<float>();
    const float* ring_p = ring.data<float>();
    const float* ape_p = ape.data<float>();
    // Row [kv | gate] of the token at position p of sequence b: this call's projection, or the
    // ring for tokens of earlier calls (the ring keeps the last ring_len positions).
    auto row_of = [&](int b, int64_t p) -> const float* {
      const int64_t ctx = lv.ctx_len[b];
      if (p >= ctx) return proj_p + (lv.q_start[b] + p - ctx) * 2 * c;
      if (p < ctx - ring_len) {
        throw Error(ErrorCode::kInternal,
                    std::string(op) + ": position " + std::to_string(p) + " of sequence " +
                        std::to_string(b) + " is no longer in its ring (context " +
                        std::to_string(ctx) + ", ring of " + std::to_string(ring_len) + ")");
      }
      return ring_p + (lv.slot[b] * ring_len + p % ring_len) * 2 * c;
    };
    for (int64_t e = 0; e < num_entries; ++e) {
      if (win[e] == -1) continue;  // padding: stays a zero row
      const int b = seq_of[e];
      if (b < 0 || b >= lv.num_seqs || win[e] < 0) {
        fail(op, "entry " + std::to_string(e) + " has sequence " + std::to_string(b) +
                     " and window " + std::to_string(win[e]) + " (expected sequence in [0, " +
                     std::to_string(lv.num_seqs) + ") and window >= 0)");
      }
      const int64_t close = (static_cast<int64_t>(win[e]) + 1) * m;  // one past the last token
      if (close > static_cast<int64_t>(lv.ctx_len[b]) + lv.q_len(b)) {
        fail(op, "entry " + std::to_string(e) + " pools window " + std::to_string(win[e]) +
                     " of sequence " + std::to_string(b) + ", which is not closed: it needs " +
                     std::to_string(close) + " tokens, the sequence has " +
                     std::to_string(lv.ctx_len[b] + lv.q_len(b)));
      }
    }
    pool.parallel_for(
        num_entries,
        [&](int64_t begin, int64_t end) {
          const int64_t max_slots = 2 * m;
          std::vector<const float*> kv(static_cast<size_t>(max_slots));
          std::vector<const float*> gate(static_cast<size_t>(max_slots));
          std::vector<const float*> bias(static_cast<size_t>(max_slots));
          std::vector<float> z(static_cast<size_t>(max_slots * dim));
          std::vector<float> mx(static_cast<size_t>(dim));
          std::vector<float> den(static_cast<size_t>(dim));
          for (int64_t e = begin; e < end; ++e) {
            if (win[e] == -1) continue;
            const int b = seq_of[e];
            const int64_t w = win[e];
            size_t n = 0;
            if (!overlap) {
              for (int64_t i = 0; i < m; ++i, ++n) {
                const float* row = row_of(b, w * m + i);
                kv[n] = row;
                gate[n] = row + dim;
                bias[n] = ape_p + i * c;
              }
            } else {
              // Slots 0..m-1: the previous window's first series (Ca); window 0 has none, which
              // is the reference's zero kv with a -inf gate (weight exactly 0), so it is skipped.
              if (w > 0) {
                for (int64_t i = 0; i < m; ++i, ++n) {
                  const float* row = row_of(b, (w - 1) * m + i);
                  kv[n] = row;
                  gate[n] = row + 2 * dim;
                  bias[n] = ape_p + i * c;
                }
              }
              // Slots m..2m-1: this window's second series (Cb).
              for (int64_t i = 0; i < m; ++i, ++n) {
                const float* row = row_of(b, w * m + i);
                kv[n] = row + dim;
                gate[n] = row + 3 * dim;
                bias[n] = ape_p + i * c + dim;
              }
            }
            // Per channel: alpha = softmax over the slots of (gate + ape); out = sum alpha * kv.
            std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
            for (size_t s = 0; s < n; ++s) {
              float* zs = z.data() + s * static_cast<size_t>(dim);
              for (int64_t ch = 0; ch < dim; ++ch) {
                zs[ch] = gate[s][ch] + bias[s][ch];
                mx[static_cast<size_t>(ch)] = std::fmax(mx[static_cast<size_t>(ch)], zs[ch]);
              }
            }
            std::fill(den.begin(), den.end(), 0.0f);
            for (size_t s = 0; s < n; ++s) {
              float* zs = z.data() + s * static_cast<size_t>(dim);
              for (int64_t ch = 0; ch < dim; ++ch) {
                zs[ch] = std::exp(zs[ch] - mx[static_cast<size_t>(ch)]);
                den[static_cast<size_t>(ch)] += zs[ch];
              }
            }
            float* o = out.data<float>() + e * dim;
            for (size_t s = 0; s < n; ++s) {
              const float* zs = z.data() + s * static_cast<size_t>(dim);
              for (int64_t ch = 0; ch < dim; ++ch) {
                o[ch] += (zs[ch] / den[static_cast<size_t>(ch)]) * kv[s][ch];
              }
            }
          }
        },
        cpu::grain_for(2 * m * dim * 4));
  });
  return out;
}

void CpuBackend::scatter_rows_impl(const Tensor& cache, const Tensor& rows, const Tensor& dest,
                                   int rope_dim) {
  // Rows are stored in the cache's KV format (f32 rows are copied as they are).
  const kv_record::RowCodec codec{cache.dtype(), rows.size(1), rope_dim};
  enqueue([=](ThreadPool&) {
    const int64_t row_bytes = codec.row_bytes();
    const int64_t cache_rows = cache.size(0);
    const int32_t* d = dest.data<int32_t>();
    const float* src = rows.data<float>();
    auto* dst = static_cast<uint8_t*>(cache.raw_data());
    // Check every destination first so a bad one leaves the cache untouched.
    for (int64_t i = 0; i < rows.size(0); ++i) {
      if (d[i] == -1) continue;  // padding entry
      if (d[i] < 0 || d[i] >= cache_rows) {
        fail("scatter_rows", "dest[" + std::to_string(i) + "] = " + std::to_string(d[i]) +
                                 " is outside the cache's rows [0, " + std::to_string(cache_rows) +
                                 ")");
      }
    }
    for (int64_t i = 0; i < rows.size(0); ++i) {
      if (d[i] == -1) continue;
      codec.encode(src + i * codec.dim, dst + d[i] * row_bytes);
    }
  });
}

}  // namespace deepinfer
