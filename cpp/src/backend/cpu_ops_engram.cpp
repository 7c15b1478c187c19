// Engram ops of the CPU backend (V4.1's n-gram memory, model.md C.7): the n-gram hash rows, the
// lookup of a table kept as shipped (FP8 rows with a UE8M0 scale per 32 columns) and the
// per-stream gate. A dense table's lookup is `embedding`, the projection `linear`.
// See docs/model.md#v41-ops.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_checks.h"
#include "backend/cpu_math.h"

namespace deepinfer {

using cpu::fail;
using cpu::grain_for;

Tensor CpuBackend::engram_hash_impl(const Tensor& ngram, const Tensor& token_map,
                                    const EngramHashParams& params) {
  const char* op = "engram_hash";
  const int64_t tokens = ngram.size(0);
  const int64_t n = ngram.size(1);
  const int64_t heads = params.heads;
  const int64_t cols = (n - 1) * heads;
  Tensor rows = Tensor::zeros({tokens, cols}, DType::kI32);
  // Offsets: the tables of all (order, head) pairs are stacked in one embedding, in that order.
  std::vector<uint64_t> primes(params.primes.begin(), params.primes.end());
  std::vector<uint64_t> offsets(primes.size());
  uint64_t total = 0;
  for (size_t i = 0; i < primes.size(); ++i) {
    offsets[i] = total;
    total += primes[i];
  }
  const std::vector<uint64_t> mult(params.multipliers.begin(), params.multipliers.end());
  const auto pad = static_cast<uint64_t>(params.pad_id);
  enqueue([=](ThreadPool& pool) {
    const int32_t* ng = ngram.data<int32_t>();
    const int32_t* map = token_map.data<int32_t>();
    const int64_t vocab = token_map.size(0);
    int32_t* dst = rows.data<int32_t>();
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            // Unsigned arithmetic: the reference's exact integers while the products stay below
            // 2^64 (the spec keeps them below 2^63), and no signed-overflow UB past that.
            uint64_t h = 0;
            for (int64_t r = 0; r < n; ++r) {
              const int32_t token = ng[t * n + r];
              uint64_t id = pad;
              if (token != -1) {
                if (token < 0 || token >= vocab) {
                  fail(op, "ngram[" + std::to_string(t) + "][" + std::to_string(r) +
                               "] = " + std::to_string(token) + " is outside [-1, " +
                               std::to_string(vocab) + ")");
                }
                const int32_t mapped = map[token];
                if (mapped < 0) {
                  fail(op, "token_map[" + std::to_string(token) + "] = " + std::to_string(mapped) +
                               " is negative");
                }
                id = static_cast<uint64_t>(mapped);
              }
              const uint64_t term = id * mult[static_cast<size_t>(r)];
              h = r == 0 ? term : (h ^ term);
              if (r == 0) continue;  // orders start at bigrams
              for (int64_t head = 0; head < heads; ++head) {
                const auto i = static_cast<size_t>((r - 1) * heads + head);
                // Fits i32: the front checked that the primes sum below 2^31.
                dst[t * cols + static_cast<int64_t>(i)] =
                    static_cast<int32_t>(h % primes[i] + offsets[i]);
              }
            }
          }
        },
        grain_for(n * heads * 4));
  });
  return rows;
}

Tensor CpuBackend::embedding_fp8_impl(const Tensor& values, const Tensor& scales,
                                      const Tensor& ids) {
  const int64_t vocab = values.size(0);
  const int64_t cols = values.size(1);
  const int64_t groups = scales.size(1);
  const int64_t tokens = ids.size(0);
  Tensor out = Tensor::zeros({tokens, cols}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const int32_t* id = ids.data<int32_t>();
    for (int64_t t = 0; t < tokens; ++t) {
      if (id[t] < 0 || id[t] >= vocab) {
        fail("embedding_fp8", "ids[" + std::to_string(t) + "] = " + std::to_string(id[t]) +
                                  " is outside the table's rows [0, " + std::to_string(vocab) +
                                  ")");
      }
    }
    // Only the looked-up rows are touched: an mmap-ed table is paged in row by row.
    const auto* codes = static_cast<const uint8_t*>(values.raw_data());
    const auto* exps = static_cast<const uint8_t*>(scales.raw_data());
    float* dst = out.data<float>();
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            const int64_t row = id[t];
            const uint8_t* v = codes + row * cols;
            const uint8_t* e = exps + row * groups;
            float* o = dst + t * cols;
            for (int64_t c = 0; c < cols; ++c) {
              // e4m3 times a power of two is exact in f32 (dtype.h).
              o[c] = f8e4m3_to_f32(v[c]) * e8m0_to_f32(e[c / 32]);
            }
          }
        },
        grain_for(cols * 4));
  });
  return out;
}

Tensor CpuBackend::engram_gate_impl(const Tensor& X, const Tensor& kv, const Tensor& q_weight,
                                    const Tensor& k_weight, float eps) {
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  Tensor out = Tensor::zeros(X.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(hidden));
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            const float* kvt = kv.data<float>() + t * (n + 1) * hidden;
            const float* v = kvt + n * hidden;  // the value follows the N keys
            for (int64_t s = 0; s < n; ++s) {
              const float* x = X.data<float>() + (t * n + s) * hidden;
              const float* k = kvt + s * hidden;
              const float* wq = q_weight.data<float>() + s * hidden;
              const float* wk = k_weight.data<float>() + s * hidden;
              const float rx =
                  1.0f / std::sqrt(static_cast<float>(cpu::mean_square(x, hidden)) + eps);
              const float rk =
                  1.0f / std::sqrt(static_cast<float>(cpu::mean_square(k, hidden)) + eps);
              double dot = 0.0;
              for (int64_t c = 0; c < hidden; ++c) {
                dot += static_cast<double>(x[c] * wq[c] * wk[c] * k[c]);
              }
              const float d = static_cast<float>(dot) * rx * rk * inv_sqrt_h;
              // sign(d) * sqrt(max(|d|, 1e-6)): the clamp keeps the gate's slope finite at 0,
              // and sign(0) = 0 gives g = 1/2 there, as the reference does.
              const float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : 0.0f);
              const float g = cpu::sigmoid(sign * std::sqrt(std::fmax(std::fabs(d), 1e-6f)));
              float* dst = out.data<float>() + (t * n + s) * hidden;
              for (int64_t c = 0; c < hidden; ++c) dst[c] = x[c] + g * v[c];
            }
          }
        },
        grain_for(n * hidden * 8));
  });
  return out;
}

}  // namespace deepinfer
