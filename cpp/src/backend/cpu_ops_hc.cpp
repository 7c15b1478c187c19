// Hyper-connection (mHC) ops of the CPU backend: expand, pre (weights + collapse), post (mix),
// head (final collapse), and V4.1's shifted pre and plain collapse. See
// docs/model.md#hyper-connections and #v41-ops.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_gemm.h"
#include "backend/cpu_math.h"

namespace deepinfer {

using cpu::grain_for;

namespace {

// mix[T, rows_of_fn] = rmsnorm(flatten(X)) fn^T: the unweighted norm over all N*H channels of a
// token, then the projection, both fp32.
std::vector<float> hc_mix(const float* X, int64_t tokens, int64_t width, const float* fn,
                          int64_t fn_rows, float norm_eps, ThreadPool& pool) {
  std::vector<float> normed(static_cast<size_t>(tokens * width));
  pool.parallel_for(
      tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const float* x = X + t * width;
          const float r =
              1.0f / std::sqrt(static_cast<float>(cpu::mean_square(x, width)) + norm_eps);
          float* y = normed.data() + t * width;
          for (int64_t i = 0; i < width; ++i) y[i] = x[i] * r;
        }
      },
      grain_for(width * 3));
  std::vector<float> mix(static_cast<size_t>(tokens * fn_rows));
  cpu::gemm_nt(normed.data(), width, fn, width, mix.data(), fn_rows, tokens, fn_rows, width, pool);
  return mix;
}

// y[h] = sum_s pre[s] * X[s][h] for one token.
void collapse_streams(const float* X, const float* pre, int64_t streams, int64_t hidden, float* y) {
  for (int64_t h = 0; h < hidden; ++h) y[h] = pre[0] * X[h];
  for (int64_t s = 1; s < streams; ++s) {
    const float* xs = X + s * hidden;
    for (int64_t h = 0; h < hidden; ++h) y[h] += pre[s] * xs[h];
  }
}

// pre [N], post [N] and the Sinkhorn-normalised comb [N, N] of one token from its mix row m
// [(2+N)N]: the A.3 formulas, shared by hc_pre and hc_pre_shifted.
void hc_coefficients(const float* m, const float* b, const float* sc, const HcParams& params,
                     float* pre, float* po, float* c) {
  const int64_t n = params.hc_mult;
  const float eps = params.hc_eps;
  for (int64_t s = 0; s < n; ++s) {
    pre[s] = cpu::sigmoid(m[s] * sc[0] + b[s]) + eps;
    po[s] = 2.0f * cpu::sigmoid(m[n + s] * sc[1] + b[n + s]);
  }
  // comb rows: softmax over j, plus hc_eps.
  for (int64_t i = 0; i < n; ++i) {
    float* row = c + i * n;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = m[2 * n + i * n + j] * sc[2] + b[2 * n + i * n + j];
    }
    float mx = row[0];
    for (int64_t j = 1; j < n; ++j) mx = std::fmax(mx, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < n; ++j) row[j] = row[j] / sum + eps;
  }
  // Sinkhorn: columns once, then (rows, columns) sinkhorn_iters - 1 times.
  auto normalise_columns = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) sum += c[i * n + j];
      for (int64_t i = 0; i < n; ++i) c[i * n + j] /= sum + eps;
    }
  };
  normalise_columns();
  for (int it = 1; it < params.sinkhorn_iters; ++it) {
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += c[i * n + j];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] /= sum + eps;
    }
    normalise_columns();
  }
}

}  // namespace

Tensor CpuBackend::hc_expand_impl(const Tensor& x, int hc_mult) {
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t streams = hc_mult;
  Tensor out = Tensor::zeros({tokens, streams, hidden}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* src = x.data<float>();
    float* dst = out.data<float>();
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            for (int64_t s = 0; s < streams; ++s) {
              std::memcpy(dst + (t * streams + s) * hidden, src + t * hidden,
                          static_cast<size_t>(hidden) * sizeof(float));
            }
          }
        },
        grain_for(streams * hidden));
  });
  return out;
}

HcMix CpuBackend::hc_pre_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                              const Tensor& scale, const HcParams& params, const RowNorm& y_norm) {
  const int64_t tokens = X.size(0);
  const int64_t n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const int64_t fn_rows = (2 + n) * n;
  HcMix result{Tensor::zeros({tokens, n}, DType::kF32), Tensor::zeros({tokens, n, n}, DType::kF32),
               Tensor::zeros({tokens, hidden}, DType::kF32)};
  Tensor post = result.post;
  Tensor comb = result.comb;
  Tensor y = result.y;
  enqueue([=](ThreadPool& pool) {
    const float* x = X.data<float>();
    const std::vector<float> mix =
        hc_mix(x, tokens, n * hidden, fn.data<float>(), fn_rows, params.norm_eps, pool);
    const float* b = base.data<float>();
    const float* sc = scale.data<float>();
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          std::vector<float> pre(static_cast<size_t>(n));
          for (int64_t t = begin; t < end; ++t) {
            hc_coefficients(mix.data() + t * fn_rows, b, sc, params, pre.data(),
                            post.data<float>() + t * n, comb.data<float>() + t * n * n);
            collapse_streams(x + t * n * hidden, pre.data(), n, hidden,
                             y.data<float>() + t * hidden);
          }
        },
        grain_for(n * hidden + 4 * n * n * params.sinkhorn_iters));
  });
  if (y_norm.weight.defined()) result.y = rms_norm_impl(result.y, y_norm.weight, y_norm.eps);
  return result;
}

Tensor CpuBackend::hc_post_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                const Tensor& comb) {
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  Tensor result = Tensor::zeros(X.shape(), DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* x = X.data<float>();
    const float* o = out.data<float>();
    const float* po = post.data<float>();
    const float* cb = comb.data<float>();
    float* dst = result.data<float>();
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            const float* xt = x + t * n * hidden;
            const float* ot = o + t * hidden;
            const float* c = cb + t * n * n;
            for (int64_t j = 0; j < n; ++j) {
              // Output stream j gathers input stream i through comb[i][j] (comb transposed).
              float* yj = dst + (t * n + j) * hidden;
              const float pj = po[t * n + j];
              for (int64_t h = 0; h < hidden; ++h) yj[h] = pj * ot[h];
              for (int64_t i = 0; i < n; ++i) {
                const float cij = c[i * n + j];
                const float* xi = xt + i * hidden;
                for (int64_t h = 0; h < hidden; ++h) yj[h] += cij * xi[h];
              }
            }
          }
        },
        grain_for(n * (n + 1) * hidden));
  });
  return result;
}

Tensor CpuBackend::hc_head_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                const Tensor& scale, const HcParams& params,
                                const RowNorm& y_norm) {
  const int64_t tokens = X.size(0);
  const int64_t n = params.hc_mult;
  const int64_t hidden = X.size(2);
  Tensor y = Tensor::zeros({tokens, hidden}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const float* x = X.data<float>();
    const std::vector<float> mix =
        hc_mix(x, tokens, n * hidden, fn.data<float>(), n, params.norm_eps, pool);
    const float* b = base.data<float>();
    const float sc = scale.data<float>()[0];
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          std::vector<float> pre(static_cast<size_t>(n));
          for (int64_t t = begin; t < end; ++t) {
            for (int64_t s = 0; s < n; ++s) {
              pre[static_cast<size_t>(s)] =
                  cpu::sigmoid(mix[static_cast<size_t>(t * n + s)] * sc + b[s]) + params.hc_eps;
            }
            collapse_streams(x + t * n * hidden, pre.data(), n, hidden,
                             y.data<float>() + t * hidden);
          }
        },
        grain_for(n * hidden));
  });
  return y_norm.weight.defined() ? rms_norm_impl(y, y_norm.weight, y_norm.eps) : y;
}

HcShiftedMix CpuBackend::hc_pre_shifted_impl(const Tensor& X, const Tensor& fn, const Tensor& base,
                                             const Tensor& scale, const Tensor& prev_pre,
                                             const HcParams& params) {
  const int64_t tokens = X.size(0);
  const int64_t n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const int64_t fn_rows = (2 + n) * n;
  HcShiftedMix result{
      Tensor::zeros({tokens, n}, DType::kF32), Tensor::zeros({tokens, n}, DType::kF32),
      Tensor::zeros({tokens, n, n}, DType::kF32), Tensor::zeros({tokens, hidden}, DType::kF32)};
  Tensor pre = result.pre;
  Tensor post = result.post;
  Tensor comb = result.comb;
  Tensor y = result.y;
  enqueue([=](ThreadPool& pool) {
    const float* x = X.data<float>();
    const std::vector<float> mix =
        hc_mix(x, tokens, n * hidden, fn.data<float>(), fn_rows, params.norm_eps, pool);
    const float* b = base.data<float>();
    const float* sc = scale.data<float>();
    // The first sub-layer (no previous pre) reads stream 0: a one-hot collapse, i.e. a copy.
    const float* prev = prev_pre.defined() ? prev_pre.data<float>() : nullptr;
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            hc_coefficients(mix.data() + t * fn_rows, b, sc, params, pre.data<float>() + t * n,
                            post.data<float>() + t * n, comb.data<float>() + t * n * n);
            const float* xt = x + t * n * hidden;
            float* yt = y.data<float>() + t * hidden;
            if (prev != nullptr) {
              collapse_streams(xt, prev + t * n, n, hidden, yt);
            } else {
              std::memcpy(yt, xt, static_cast<size_t>(hidden) * sizeof(float));
            }
          }
        },
        grain_for(n * hidden + 4 * n * n * params.sinkhorn_iters));
  });
  return result;
}

Tensor CpuBackend::hc_collapse_impl(const Tensor& X, const Tensor& pre) {
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  Tensor y = Tensor::zeros({tokens, hidden}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    pool.parallel_for(
        tokens,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            collapse_streams(X.data<float>() + t * n * hidden, pre.data<float>() + t * n, n, hidden,
                             y.data<float>() + t * hidden);
          }
        },
        grain_for(n * hidden));
  });
  return y;
}

}  // namespace deepinfer
