// Hyper-connection (mHC) ops of the CUDA backend: expand, pre (weights + collapse), post (mix),
// head (final collapse). They follow the CPU reference (cpp/src/backend/cpu_ops_hc.cpp) step by
// step, and reuse this backend's own ops where the CPU does the same computation:
//   mix = linear(rms_norm(flatten(X)), fn)   (the CPU's hc_mix: unweighted norm, then fp32 GEMM)
// then one block per token turns mix into the weights (thread 0, sequentially, in the CPU's
// order: sigmoid, softmax, Sinkhorn) and collapses the streams with all threads.
//
// Products that feed sums are rounded separately (__fmul_rn / __fadd_rn) because the CPU build has
// no FMA contraction; the collapse and hc_post are then the CPU's arithmetic exactly. Differences
// come from the GEMM's summation order and from expf (within 2 ulp of glibc's).
#include <cstdint>

#include "cuda_backend.h"
#include "cuda_common.cuh"

namespace deepinfer::cuda {

namespace {

void check_hc_weights(const char* op, const Tensor& X, const Tensor& fn, const Tensor& base,
                      const Tensor& scale, int64_t fn_rows, int64_t scales) {
  const int64_t width = X.size(1) * X.size(2);
  check_tensor(op, "fn", fn, DType::kF32, {fn_rows, width});
  check_tensor(op, "base", base, DType::kF32, {fn_rows});
  check_tensor(op, "scale", scale, DType::kF32, {scales});
}

// The per-token kernels keep the stream weights (and hc_pre's n x n matrix) in shared memory;
// this bounds hc_mult so that fits in the default 48 KB with room to spare.
constexpr int kMaxHcMult = 64;

void check_hc_mult(const char* op, int hc_mult) {
  if (hc_mult <= 0) fail(op, "hc_mult must be positive, got " + std::to_string(hc_mult));
  if (hc_mult > kMaxHcMult) {
    fail(op, "the CUDA backend supports hc_mult up to " + std::to_string(kMaxHcMult) + ", got " +
                 std::to_string(hc_mult));
  }
}

constexpr int kElementwiseThreads = 256;

unsigned elementwise_blocks(const CudaBackend& be, int64_t n) {
  const int64_t fill = static_cast<int64_t>(be.num_sms()) * 16;
  const int64_t need = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(need < fill ? need : fill);
}

int token_threads(int64_t hidden) {
  return hidden >= 2048 ? 256 : 128;
}

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// a * b + c with the product rounded first (no FMA), as the CPU computes it.
__device__ __forceinline__ float mul_add_rn(float a, float b, float c) {
  return __fadd_rn(__fmul_rn(a, b), c);
}

// y[h] = sum_s pre[s] * X[s][h] for one token, in the CPU's order (stream 0 first), threads
// strided over h.
__device__ void collapse_streams(const float* __restrict__ X, const float* pre, int n,
                                 int64_t hidden, float* __restrict__ y) {
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = __fmul_rn(pre[0], X[h]);
    for (int s = 1; s < n; ++s) acc = mul_add_rn(pre[s], X[s * hidden + h], acc);
    y[h] = acc;
  }
}

// out[t, s, h] = x[t, h].
__global__ void hc_expand_kernel(const float* __restrict__ x, float* __restrict__ out, int n,
                                 int64_t hidden, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t h = e % hidden;
    const int64_t t = e / (static_cast<int64_t>(n) * hidden);
    out[e] = x[t * hidden + h];
  }
}

// One block per token; dynamic shared memory holds pre [n] and comb [n, n].
//   pre[s]  = sigmoid(mix[s] * scale[0] + base[s]) + eps
//   post[s] = 2 * sigmoid(mix[n + s] * scale[1] + base[n + s])
//   comb    = softmax over j of (mix[2n + i*n + j] * scale[2] + base[...]) + eps, then Sinkhorn:
//             columns once, then (rows, columns) iters - 1 times, each dividing by (sum + eps).
//   y[h]    = sum_s pre[s] * X[s][h]
__global__ void hc_pre_finish_kernel(const float* __restrict__ X, const float* __restrict__ mix,
                                     const float* __restrict__ base,
                                     const float* __restrict__ scale, int n, int64_t hidden,
                                     int iters, float eps, float* __restrict__ post,
                                     float* __restrict__ comb, float* __restrict__ y) {
  extern __shared__ float shared[];
  float* pre = shared;
  float* c = shared + n;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    const int64_t fn_rows = static_cast<int64_t>(2 + n) * n;
    const float* m = mix + t * fn_rows;
    float* po = post + t * n;
    for (int s = 0; s < n; ++s) {
      pre[s] = sigmoid(mul_add_rn(m[s], scale[0], base[s])) + eps;
      po[s] = 2.0f * sigmoid(mul_add_rn(m[n + s], scale[1], base[n + s]));
    }
    for (int i = 0; i < n; ++i) {
      float* row = c + i * n;
      for (int j = 0; j < n; ++j) {
        row[j] = mul_add_rn(m[2 * n + i * n + j], scale[2], base[2 * n + i * n + j]);
      }
      float mx = row[0];
      for (int j = 1; j < n; ++j) mx = fmaxf(mx, row[j]);
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
      }
      for (int j = 0; j < n; ++j) row[j] = row[j] / sum + eps;
    }
    for (int it = 0; it < iters; ++it) {
      if (it > 0) {
        for (int i = 0; i < n; ++i) {
          float sum = 0.0f;
          for (int j = 0; j < n; ++j) sum += c[i * n + j];
          for (int j = 0; j < n; ++j) c[i * n + j] /= sum + eps;
        }
      }
      for (int j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int i = 0; i < n; ++i) sum += c[i * n + j];
        for (int i = 0; i < n; ++i) c[i * n + j] /= sum + eps;
      }
    }
    float* ct = comb + t * n * n;
    for (int k = 0; k < n * n; ++k) ct[k] = c[k];
  }
  __syncthreads();
  collapse_streams(X + t * n * hidden, pre, n, hidden, y + t * hidden);
}

// One block per token: pre[s] = sigmoid(mix[s] * scale[0] + base[s]) + eps, y = collapse.
__global__ void hc_head_finish_kernel(const float* __restrict__ X, const float* __restrict__ mix,
                                      const float* __restrict__ base,
                                      const float* __restrict__ scale, int n, int64_t hidden,
                                      float eps, float* __restrict__ y) {
  extern __shared__ float pre[];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < n; ++s) {
      pre[s] = sigmoid(mul_add_rn(mix[t * n + s], scale[0], base[s])) + eps;
    }
  }
  __syncthreads();
  collapse_streams(X + t * n * hidden, pre, n, hidden, y + t * hidden);
}

// One thread per (t, h): for each output stream j,
//   X_new[t, j, h] = post[t, j] * out[t, h] + sum_i comb[t, i, j] * X[t, i, h]   (i ascending).
__global__ void hc_post_kernel(const float* __restrict__ X, const float* __restrict__ out,
                               const float* __restrict__ post, const float* __restrict__ comb,
                               float* __restrict__ result, int n, int64_t hidden, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t t = e / hidden;
    const int64_t h = e % hidden;
    const float* xt = X + t * n * hidden;
    const float* c = comb + t * n * n;
    const float o = out[t * hidden + h];
    for (int j = 0; j < n; ++j) {
      float acc = __fmul_rn(post[t * n + j], o);
      for (int i = 0; i < n; ++i) acc = mul_add_rn(c[i * n + j], xt[i * hidden + h], acc);
      result[(t * n + j) * hidden + h] = acc;
    }
  }
}

}  // namespace

Tensor CudaBackend::hc_expand(const Tensor& x, int hc_mult) {
  const char* op = "hc_expand";
  check_tensor(op, "x", x, DType::kF32, {-1, -1});
  if (hc_mult <= 0) fail(op, "hc_mult must be positive, got " + std::to_string(hc_mult));
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  Tensor out = empty({tokens, hc_mult, hidden}, DType::kF32);
  const int64_t total = out.numel();
  if (total == 0) return out;
  hc_expand_kernel<<<elementwise_blocks(*this, total), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), out.data<float>(), hc_mult, hidden, total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

HcMix CudaBackend::hc_pre(const Tensor& X, const Tensor& fn, const Tensor& base,
                          const Tensor& scale, const HcParams& params) {
  const char* op = "hc_pre";
  check_hc_mult(op, params.hc_mult);
  check_tensor(op, "X", X, DType::kF32, {-1, params.hc_mult, -1});
  const int64_t tokens = X.size(0);
  const int n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const int64_t width = n * hidden;
  const int64_t fn_rows = static_cast<int64_t>(2 + n) * n;
  check_hc_weights(op, X, fn, base, scale, fn_rows, 3);
  if (params.sinkhorn_iters < 1) {
    fail(op, "sinkhorn_iters must be >= 1, got " + std::to_string(params.sinkhorn_iters));
  }
  HcMix result{empty({tokens, n}, DType::kF32), empty({tokens, n, n}, DType::kF32),
               empty({tokens, hidden}, DType::kF32)};
  if (tokens == 0) return result;
  // With no channels the CPU's GEMM sums nothing: mix = 0 (and cuBLAS rejects K = 0).
  Tensor mix = width > 0
                   ? linear(rms_norm(X.reshape({tokens, width}), Tensor(), params.norm_eps), fn)
                   : zeros({tokens, fn_rows}, DType::kF32);
  const size_t smem = static_cast<size_t>(n + n * n) * sizeof(float);
  hc_pre_finish_kernel<<<static_cast<unsigned>(tokens), token_threads(hidden), smem, stream()>>>(
      X.data<float>(), mix.data<float>(), base.data<float>(), scale.data<float>(), n, hidden,
      params.sinkhorn_iters, params.hc_eps, result.post.data<float>(), result.comb.data<float>(),
      result.y.data<float>());
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return result;
}

Tensor CudaBackend::hc_post(const Tensor& X, const Tensor& out, const Tensor& post,
                            const Tensor& comb) {
  const char* op = "hc_post";
  check_tensor(op, "X", X, DType::kF32, {-1, -1, -1});
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  check_tensor(op, "out", out, DType::kF32, {tokens, hidden});
  check_tensor(op, "post", post, DType::kF32, {tokens, n});
  check_tensor(op, "comb", comb, DType::kF32, {tokens, n, n});
  Tensor result = empty(X.shape(), DType::kF32);
  const int64_t total = tokens * hidden;
  if (total == 0 || n == 0) return result;
  hc_post_kernel<<<elementwise_blocks(*this, total), kElementwiseThreads, 0, stream()>>>(
      X.data<float>(), out.data<float>(), post.data<float>(), comb.data<float>(),
      result.data<float>(), static_cast<int>(n), hidden, total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return result;
}

Tensor CudaBackend::hc_head(const Tensor& X, const Tensor& fn, const Tensor& base,
                            const Tensor& scale, const HcParams& params) {
  const char* op = "hc_head";
  check_hc_mult(op, params.hc_mult);
  check_tensor(op, "X", X, DType::kF32, {-1, params.hc_mult, -1});
  const int64_t tokens = X.size(0);
  const int n = params.hc_mult;
  const int64_t hidden = X.size(2);
  const int64_t width = n * hidden;
  check_hc_weights(op, X, fn, base, scale, n, 1);
  Tensor y = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0) return y;
  Tensor mix = width > 0
                   ? linear(rms_norm(X.reshape({tokens, width}), Tensor(), params.norm_eps), fn)
                   : zeros({tokens, n}, DType::kF32);
  const size_t smem = static_cast<size_t>(n) * sizeof(float);
  hc_head_finish_kernel<<<static_cast<unsigned>(tokens), token_threads(hidden), smem, stream()>>>(
      X.data<float>(), mix.data<float>(), base.data<float>(), scale.data<float>(), n, hidden,
      params.hc_eps, y.data<float>());
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return y;
}

}  // namespace deepinfer::cuda
