// Sampling ops of the CPU backend: per-row token sampling (sample::sample_row is the reference
// every backend matches), the token selection that carries device-sampled tokens into the next
// step, the move of rows planned before the previous step's verification was known, and row
// copies between state slots.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_checks.h"
#include "backend/cpu_math.h"
#include "backend/row_shift.h"
#include "sample/sampler.h"

namespace deepinfer {

using cpu::fail;

namespace {

// First index i with values[i] == value (the caller knows there is one); for error messages.
int64_t index_of(const int32_t* values, int64_t n, int32_t value) {
  return std::find(values, values + n, value) - values;
}

}  // namespace

SampleResult CpuBackend::sample_impl(const Tensor& logits, const SamplingBatch& batch) {
  const char* op = "sample";
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);

  const int64_t cols = batch.max_logprobs;
  SampleResult out;
  out.tokens = Tensor::zeros({rows}, DType::kI32);
  out.logprobs = Tensor::zeros({rows}, DType::kF32);
  if (cols > 0) {
    out.top_ids = Tensor::zeros({rows, cols}, DType::kI32);
    out.top_logprobs = Tensor::zeros({rows, cols}, DType::kF32);
  }
  enqueue([=](ThreadPool& pool) {
    const float* x = logits.data<float>();
    const float* temperature = batch.temperature.data<float>();
    const int32_t* top_k = batch.top_k.data<int32_t>();
    const float* top_p = batch.top_p.data<float>();
    const int64_t* seed = batch.seed.data<int64_t>();
    const int32_t* position = batch.position.data<int32_t>();
    const int32_t* num_logprobs = batch.num_logprobs.data<int32_t>();
    for (int64_t b = 0; b < rows; ++b) {
      if (num_logprobs[b] < 0 || num_logprobs[b] > cols) {
        fail(op, "batch.num_logprobs[" + std::to_string(b) +
                     "] = " + std::to_string(num_logprobs[b]) + " is outside [0, max_logprobs " +
                     std::to_string(cols) + "]");
      }
    }
    int32_t* tokens = out.tokens.data<int32_t>();
    float* logprobs = out.logprobs.data<float>();
    int32_t* top_ids = cols > 0 ? out.top_ids.data<int32_t>() : nullptr;
    float* top_lps = cols > 0 ? out.top_logprobs.data<float>() : nullptr;
    // Rows are independent and each writes only its own outputs, so the split over threads
    // cannot change a row's token.
    pool.parallel_for(
        rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) {
            sample::RowParams params;
            params.temperature = temperature[b];
            params.top_k = top_k[b];
            params.top_p = top_p[b];
            params.seed = static_cast<uint64_t>(seed[b]);
            params.position = position[b];
            params.num_logprobs = num_logprobs[b];
            sample::RowResult r;
            try {
              r = sample::sample_row(
                  std::span<const float>(x + b * vocab, static_cast<size_t>(vocab)), params);
            } catch (const Error& e) {
              throw Error(e.code(),
                          std::string(op) + ": row " + std::to_string(b) + ": " + e.what());
            }
            tokens[b] = r.token;
            logprobs[b] = r.logprob;
            // Columns past the row's N (or past the vocabulary) hold id -1 and logprob -inf.
            for (int64_t c = 0; c < cols; ++c) {
              const bool has = static_cast<size_t>(c) < r.top.size();
              top_ids[b * cols + c] = has ? r.top[static_cast<size_t>(c)].first : -1;
              top_lps[b * cols + c] = has ? r.top[static_cast<size_t>(c)].second
                                          : -std::numeric_limits<float>::infinity();
            }
          }
        },
        1);
  });
  return out;
}

void CpuBackend::adjust_logits_impl(const Tensor& logits, const LogitAdjustments& adjustments) {
  const char* op = "adjust_logits";
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t n = adjustments.rows.defined() ? adjustments.rows.size(0) : 0;
  const LogitAdjustments a = adjustments;
  enqueue([=](ThreadPool&) {
    float* x = logits.data<float>();
    // Every index first, so a bad one leaves the logits untouched.
    for (int64_t i = 0; i < n; ++i) {
      const int32_t r = a.rows.data<int32_t>()[i];
      const int32_t t = a.tokens.data<int32_t>()[i];
      if (r < 0 || r >= rows || t < 0 || t >= vocab) {
        fail(op, "entry " + std::to_string(i) + " (row " + std::to_string(r) + ", token " +
                     std::to_string(t) + ") is outside logits [" + std::to_string(rows) + ", " +
                     std::to_string(vocab) + "]");
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      x[a.rows.data<int32_t>()[i] * vocab + a.tokens.data<int32_t>()[i]] +=
          a.values.data<float>()[i];
    }
    if (!a.allowed.defined()) return;
    const int64_t words = (vocab + 31) / 32;
    const auto* allowed = reinterpret_cast<const uint32_t*>(a.allowed.data<int32_t>());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < vocab; ++t) {
        if (((allowed[r * words + t / 32] >> (t % 32)) & 1u) == 0)
          x[r * vocab + t] = -std::numeric_limits<float>::infinity();
      }
    }
  });
}

void CpuBackend::select_tokens_impl(const Tensor& tokens, const Tensor& remap,
                                    const Tensor& previous) {
  const char* op = "select_tokens";
  const int64_t n = tokens.size(0);
  const int64_t num_previous = previous.size(0);
  enqueue([=](ThreadPool&) {
    const int32_t* r = remap.data<int32_t>();
    const int32_t* prev = previous.data<int32_t>();
    int32_t* dst = tokens.data<int32_t>();
    // Every index first, so a bad one leaves the tokens untouched.
    for (int64_t i = 0; i < n; ++i) {
      if (r[i] >= num_previous) {
        fail(op, "remap[" + std::to_string(i) + "] = " + std::to_string(r[i]) +
                     " is outside previous's rows [0, " + std::to_string(num_previous) + ")");
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (r[i] >= 0) dst[i] = prev[r[i]];
    }
  });
}

void CpuBackend::shift_rows_impl(const RowShift& shift) {
  const char* op = "shift_rows";
  enqueue([shift, op](ThreadPool&) {
    const BatchLayout& l = shift.layout;
    const int32_t b = l.num_seqs;
    const int32_t* q_start = l.seq_q_start.data<int32_t>();
    const int32_t* from = shift.shift_from.data<int32_t>();
    const int32_t* max_shift = shift.max_shift.data<int32_t>();
    const int32_t* accepted = shift.accepted.data<int32_t>();
    const int64_t num_accepted = shift.accepted.size(0);
    int32_t* ctx_len = l.seq_ctx_len.data<int32_t>();
    int32_t* positions = l.positions.data<int32_t>();
    int32_t* carry = shift.carry_remap.defined() ? shift.carry_remap.data<int32_t>() : nullptr;
    // Every row's move first, so a bad one leaves the metadata untouched.
    std::vector<int32_t> moves(static_cast<size_t>(b), 0);
    for (int32_t s = 0; s < shift.num_real_seqs; ++s) {
      bool ok = true;
      moves[s] =
          row_shift::row_move(from[s], max_shift[s], accepted, num_accepted, ctx_len[s], &ok);
      if (!ok) {
        fail(op, "row " + std::to_string(s) + ": shift_from " + std::to_string(from[s]) +
                     " and max_shift " + std::to_string(max_shift[s]) + " against " +
                     std::to_string(num_accepted) +
                     " accepted counts do not give a move in [-max_shift, 0] to a start >= 0");
      }
    }
    for (int32_t s = 0; s < shift.num_real_seqs; ++s) {
      if (moves[s] == 0) continue;
      ctx_len[s] += moves[s];
      for (int32_t r = q_start[s]; r < q_start[s + 1]; ++r) {
        positions[r] += moves[s];
        if (carry != nullptr && carry[r] >= 0) carry[r] += moves[s];
      }
    }
    const int32_t* logit_rows =
        shift.logit_rows.defined() ? shift.logit_rows.data<int32_t>() : nullptr;
    int32_t* next = shift.next_positions.data<int32_t>();
    for (int64_t i = 0; i < shift.next_positions.size(0); ++i)
      next[i] = positions[logit_rows != nullptr ? logit_rows[i] : i] + 1;
    const int32_t* table = l.block_table.data<int32_t>();
    const int64_t width = l.max_blocks_per_seq;
    for (const auto& [ratio, e] : shift.entries) {
      const int32_t epb = l.block_size / ratio;
      int32_t* seq = e.seq.data<int32_t>();
      int32_t* window = e.window.data<int32_t>();
      int32_t* rope_pos = e.rope_pos.data<int32_t>();
      int32_t* dest = e.dest.data<int32_t>();
      auto put = [&](int64_t i, const row_shift::Entry& x) {
        seq[i] = x.seq;
        window[i] = x.window;
        rope_pos[i] = x.rope_pos;
        dest[i] = x.dest;
      };
      if (shift.entry_per_row) {
        for (int32_t s = 0; s < b; ++s) {
          put(s, row_shift::row_entry(s, s < shift.num_real_seqs, ratio, epb, ctx_len[s],
                                      table + s * width));
        }
      } else if (!row_shift::fill_dense_entries(ratio, epb, ctx_len, q_start, table, width,
                                                shift.num_real_seqs, b, e.num_entries, put)) {
        fail(op, "the shifted rows close more entries of ratio " + std::to_string(ratio) +
                     " than the batch's " + std::to_string(e.num_entries));
      }
    }
  });
}

Tensor CpuBackend::accept_drafts_impl(const Tensor& samples, const Tensor& tokens,
                                      const Tensor& row_start) {
  const char* op = "accept_drafts";
  const int64_t rows = row_start.size(0) - 1;
  Tensor accepted = Tensor::zeros({rows}, DType::kI32);
  const int64_t n = samples.size(0);
  enqueue([=](ThreadPool&) {
    const int32_t* start = row_start.data<int32_t>();
    for (int64_t r = 0; r <= rows; ++r) {
      if (start[r] < 0 || start[r] > n || (r > 0 && start[r] < start[r - 1])) {
        fail(op, "row_start[" + std::to_string(r) + "] = " + std::to_string(start[r]) +
                     " is not a non-decreasing start in [0, " + std::to_string(n) + "]");
      }
    }
    int32_t* out = accepted.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      out[r] = row_shift::accepted_drafts(samples.data<int32_t>(), tokens.data<int32_t>(), start[r],
                                          start[r + 1]);
    }
  });
  return accepted;
}

void CpuBackend::copy_rows_impl(const Tensor& t, const Tensor& src, const Tensor& dst) {
  const char* op = "copy_rows";
  const int64_t n = src.size(0);
  const int64_t num_rows = t.size(0);
  size_t row_bytes = dtype_size(t.dtype());
  for (int64_t d = 1; d < t.dim(); ++d) row_bytes *= static_cast<size_t>(t.size(d));
  enqueue([=](ThreadPool& pool) {
    const int32_t* s = src.data<int32_t>();
    const int32_t* d = dst.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      for (const auto& [name, row] : {std::pair{"src", s[i]}, std::pair{"dst", d[i]}}) {
        if (row < 0 || row >= num_rows) {
          fail(op, std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(row) +
                       " is outside t's rows [0, " + std::to_string(num_rows) + ")");
        }
      }
    }
    // The copies run in parallel and in no particular order, so the result is well defined only
    // when no row is written twice and no written row is also read. A source may be read many
    // times (one snapshot copied to several slots).
    std::vector<int32_t> srcs(s, s + n);
    std::vector<int32_t> dsts(d, d + n);
    std::sort(srcs.begin(), srcs.end());
    std::sort(dsts.begin(), dsts.end());
    const auto twice = std::adjacent_find(dsts.begin(), dsts.end());
    if (twice != dsts.end()) {
      const int64_t first = index_of(d, n, *twice);
      const int64_t second = first + 1 + index_of(d + first + 1, n - first - 1, *twice);
      fail(op, "row " + std::to_string(*twice) + " is a destination twice (dst[" +
                   std::to_string(first) + "] and dst[" + std::to_string(second) + "])");
    }
    std::vector<int32_t> both;
    std::set_intersection(srcs.begin(), srcs.end(), dsts.begin(), dsts.end(),
                          std::back_inserter(both));
    if (!both.empty()) {
      fail(op, "row " + std::to_string(both[0]) + " is both a source (src[" +
                   std::to_string(index_of(s, n, both[0])) + "]) and a destination (dst[" +
                   std::to_string(index_of(d, n, both[0])) + "])");
    }
    char* base = static_cast<char*>(t.raw_data());
    pool.parallel_for(
        n,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            std::memcpy(base + static_cast<size_t>(d[i]) * row_bytes,
                        base + static_cast<size_t>(s[i]) * row_bytes, row_bytes);
          }
        },
        cpu::grain_for(static_cast<int64_t>(row_bytes / sizeof(float)) + 1));
  });
}

}  // namespace deepinfer
