// Dense ops of the CPU backend: embedding, norms, linear layers, elementwise ops, RoPE, argmax.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_checks.h"
#include "backend/cpu_gemm.h"
#include "backend/cpu_math.h"

namespace deepinfer {

using cpu::fail;
using cpu::grain_for;

Tensor CpuBackend::embedding_impl(const Tensor& table, const Tensor& ids) {
  const int64_t vocab = table.size(0);
  const int64_t hidden = table.size(1);
  const int64_t tokens = ids.size(0);
  Tensor out = Tensor::zeros({tokens, hidden}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const int32_t* id = ids.data<int32_t>();
    for (int64_t t = 0; t < tokens; ++t) {
      if (id[t] < 0 || id[t] >= vocab) {
        fail("embedding", "ids[" + std::to_string(t) + "] = " + std::to_string(id[t]) +
                              " is outside the table's rows [0, " + std::to_string(vocab) + ")");
      }
    }
    const float* src = table.data<float>();
    float* dst = out.data<float>();
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            std::memcpy(dst + t * hidden, src + id[t] * hidden,
                        static_cast<size_t>(hidden) * sizeof(float));
          }
        },
        grain_for(hidden));
  });
  return out;
}

Tensor CpuBackend::rms_norm_impl(const Tensor& x, const Tensor& weight, float eps) {
  const int64_t dim = x.size(-1);
  const int64_t rows = dim > 0 ? x.numel() / dim : 0;
  Tensor out = Tensor::zeros(x.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* src = x.data<float>();
    const float* w = weight.defined() ? weight.data<float>() : nullptr;
    float* dst = out.data<float>();
    pool.parallel_for(
        rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const float* xr = src + r * dim;
            float* yr = dst + r * dim;
            const float inv = 1.0f / std::sqrt(static_cast<float>(cpu::mean_square(xr, dim)) + eps);
            if (w != nullptr) {
              for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * w[i];
            } else {
              for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
            }
          }
        },
        grain_for(dim * 3));
  });
  return out;
}

Tensor CpuBackend::linear_impl(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm) {
  if (x_norm.weight.defined()) {
    return linear_impl(rms_norm_impl(x, x_norm.weight, x_norm.eps), w, {});
  }
  const int64_t m = x.size(0);
  const int64_t k = x.size(1);
  const int64_t n = w.rows();
  const Tensor values = w.values;
  const int group = w.act_group;
  Tensor out = Tensor::zeros({m, n}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* a = x.data<float>();
    std::vector<float> quantized;
    if (group > 0) {
      quantized.resize(static_cast<size_t>(m * k));
      quantize_activation_rows(a, quantized.data(), m, k, group);
      a = quantized.data();
    }
    cpu::gemm_nt(a, k, values.data<float>(), k, out.data<float>(), n, m, n, k, pool);
  });
  return out;
}

Tensor CpuBackend::grouped_linear_impl(const Tensor& x, const MatrixWeight& w, int groups) {
  const int64_t m = x.size(0);
  const int64_t k = w.cols();
  const int64_t n = w.rows() / groups;
  const int64_t g_count = groups;
  const Tensor values = w.values;
  const int act_group = w.act_group;
  Tensor out = Tensor::zeros({m, g_count * n}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    std::vector<float> slice(static_cast<size_t>(m * k));
    for (int64_t g = 0; g < g_count; ++g) {
      // Each group's slice is its own GEMM input: activation groups restart at its first column.
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(slice.data() + r * k, x.data<float>() + r * g_count * k + g * k,
                    static_cast<size_t>(k) * sizeof(float));
      }
      if (act_group > 0) quantize_activation_rows(slice.data(), slice.data(), m, k, act_group);
      cpu::gemm_nt(slice.data(), k, values.data<float>() + g * n * k, k, out.data<float>() + g * n,
                   g_count * n, m, n, k, pool);
    }
  });
  return out;
}

Tensor CpuBackend::quantize_activations_impl(const Tensor& x, int group) {
  Tensor out = Tensor::zeros(x.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const int64_t rows = x.size(0);
    const int64_t cols = x.size(1);
    pool.parallel_for(
        rows,
        [&](int64_t begin, int64_t end) {
          quantize_activation_rows(x.data<float>() + begin * cols, out.data<float>() + begin * cols,
                                   end - begin, cols, group);
        },
        grain_for(cols * 4));
  });
  return out;
}

Tensor CpuBackend::scale_impl(const Tensor& x, float factor) {
  Tensor out = Tensor::zeros(x.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* src = x.data<float>();
    float* dst = out.data<float>();
    pool.parallel_for(
        x.numel(),
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = src[i] * factor;
        },
        grain_for(1));
  });
  return out;
}

namespace {
template <typename T>
void add_values(ThreadPool& pool, const Tensor& a, const Tensor& b, const Tensor& out) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* dst = out.data<T>();
  pool.parallel_for(
      a.numel(),
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = pa[i] + pb[i];
      },
      grain_for(1));
}
}  // namespace

Tensor CpuBackend::add_impl(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::zeros(a.shape(), a.dtype());
  enqueue([=](ThreadPool& pool) {
    if (a.dtype() == DType::kI32) {
      add_values<int32_t>(pool, a, b, out);
    } else {
      add_values<float>(pool, a, b, out);
    }
  });
  return out;
}

Tensor CpuBackend::gather_rows_impl(const Tensor& x, const Tensor& rows) {
  Shape shape = x.shape();
  const int64_t src_rows = shape[0];
  shape[0] = rows.size(0);
  size_t row_bytes = dtype_size(x.dtype());
  for (size_t d = 1; d < shape.size(); ++d) row_bytes *= static_cast<size_t>(shape[d]);
  Tensor out = Tensor::zeros(shape, x.dtype());
  enqueue([=](ThreadPool&) {
    const int32_t* r = rows.data<int32_t>();
    const char* src = static_cast<const char*>(x.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
    for (int64_t i = 0; i < rows.size(0); ++i) {
      if (r[i] < 0 || r[i] >= src_rows) {
        fail("gather_rows", "rows[" + std::to_string(i) + "] = " + std::to_string(r[i]) +
                                " is outside x's rows [0, " + std::to_string(src_rows) + ")");
      }
      std::memcpy(dst + static_cast<size_t>(i) * row_bytes,
                  src + static_cast<size_t>(r[i]) * row_bytes, row_bytes);
    }
  });
  return out;
}

Tensor CpuBackend::rope_impl(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                             bool inverse) {
  const int64_t tokens = x.size(0);
  const int64_t heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t dim = x.size(-1);
  const int64_t half = inv_freq.size(0);
  Tensor out = Tensor::zeros(x.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const int32_t* pos = positions.data<int32_t>();
    const float* freq = inv_freq.data<float>();
    float* dst = out.data<float>();
    if (x.dtype() == DType::kBF16) {  // widened exactly, then rotated in f32 as f32 x is
      const auto* src = static_cast<const uint16_t*>(x.raw_data());
      for (int64_t i = 0; i < x.numel(); ++i) dst[i] = bf16_to_f32(src[i]);
    } else {
      std::memcpy(dst, x.data<float>(), out.nbytes());
    }
    const int64_t first = dim - 2 * half;  // the rotated channels trail the "nope" ones
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            const float p = static_cast<float>(pos[t]);
            for (int64_t i = 0; i < half; ++i) {
              const float angle = p * freq[i];
              const float c = std::cos(angle);
              const float s = inverse ? -std::sin(angle) : std::sin(angle);
              for (int64_t h = 0; h < heads; ++h) {
                float* v = dst + (t * heads + h) * dim + first + 2 * i;
                const float a = v[0];
                const float b = v[1];
                v[0] = a * c - b * s;
                v[1] = b * c + a * s;
              }
            }
          }
        },
        grain_for(heads * 2 * half * 3));
  });
  return out;
}

Tensor CpuBackend::argmax_impl(const Tensor& x) {
  const int64_t rows = x.size(0);
  const int64_t cols = x.size(1);
  Tensor out = Tensor::zeros({rows}, DType::kI32);
  enqueue([=](ThreadPool& pool) {
    const float* src = x.data<float>();
    int32_t* dst = out.data<int32_t>();
    pool.parallel_for(
        rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const float* row = src + r * cols;
            int64_t best = 0;
            // Strictly greater keeps the lowest index among equal maxima.
            for (int64_t c = 1; c < cols; ++c) {
              if (row[c] > row[best]) best = c;
            }
            dst[r] = static_cast<int32_t>(best);
          }
        },
        grain_for(cols));
  });
  return out;
}

Tensor CpuBackend::swiglu_impl(const Tensor& gate, const Tensor& up, float swiglu_limit) {
  Tensor out = Tensor::zeros(gate.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* g = gate.data<float>();
    const float* u = up.data<float>();
    float* dst = out.data<float>();
    pool.parallel_for(
        gate.numel(),
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = cpu::swiglu(g[i], u[i], swiglu_limit);
        },
        grain_for(8));
  });
  return out;
}

}  // namespace deepinfer
