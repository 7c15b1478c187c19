// The mHC ops of the CUDA backend that widen and update the trunk, elementwise
// (docs/model.md#hyper-connections): hc_expand copies the embedding into every stream, hc_post
// writes the sub-layer's output into the streams and mixes them by comb, in the CPU's order and
// rounding (hc_weights.cuh). The mixing ops are in hc_pre.cu; hc_post_pre's fused kernel in
// hc_fused.cu.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/hc/hc_weights.cuh"

namespace deepinfer::cuda {

namespace {

// out[t, s, h] = x[t, h].
__global__ void hc_expand_kernel(const float* __restrict__ x, float* __restrict__ out, int n,
                                 int64_t hidden, int64_t total) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t h = e % hidden;
    const int64_t t = e / (static_cast<int64_t>(n) * hidden);
    out[e] = x[t * hidden + h];
  }
}

// One thread per (t, h): for each output stream j,
//   X_new[t, j, h] = post[t, j] * out[t, h] + sum_i comb[t, i, j] * X[t, i, h]   (i ascending).
__global__ void hc_post_kernel(const float* __restrict__ X, const float* __restrict__ out,
                               const float* __restrict__ post, const float* __restrict__ comb,
                               float* __restrict__ result, int n, int64_t hidden, int64_t total) {
  enter_dependent_grid();
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

Tensor CudaBackend::hc_expand_impl(const Tensor& x, int hc_mult) {
  const char* op = "hc_expand";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  Tensor out = empty({tokens, hc_mult, hidden}, DType::kF32);
  const int64_t total = out.numel();
  if (total == 0) return out;
  launch_programmatic(op, dim3(elementwise_blocks(num_sms(), total)), dim3(kElementwiseThreads), 0,
                      stream(), pdl(), hc_expand_kernel, x.data<float>(), out.data<float>(),
                      hc_mult, hidden, total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::hc_post_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                 const Tensor& comb) {
  const char* op = "hc_post";
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  Tensor result = empty(X.shape(), DType::kF32);
  const int64_t total = tokens * hidden;
  if (total == 0 || n == 0) return result;
  launch_programmatic(op, dim3(elementwise_blocks(num_sms(), total)), dim3(kElementwiseThreads), 0,
                      stream(), pdl(), hc_post_kernel, X.data<float>(), out.data<float>(),
                      post.data<float>(), comb.data<float>(), result.data<float>(),
                      static_cast<int>(n), hidden, total);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return result;
}

}  // namespace deepinfer::cuda
