// rope of the CUDA backend (docs/model.md#rotary-embedding): the rotation of the last 2 *
// inv_freq channels of each head, as the CPU reference op (cpp/src/backend/cpu_ops_dense.cpp)
// computes it. The CPU build has no FMA contraction, so the products are rounded separately
// (__fmul_rn / __fsub_rn) and the angle's cos and sin are cosf / sinf (within 2 ulp of glibc's).
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

namespace {

// One thread per output element of x viewed as [rows = T * heads, dim]. Channels before `first`
// are copied; channel first + 2i (+1) is the first (second) element of rotated pair i. Both
// threads of a pair compute the same angle, cos and sin as the CPU: float(pos) * inv_freq[i],
// cosf, sinf (not the __cosf intrinsics), products rounded separately.
__global__ void rope_kernel(const float* __restrict__ x, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, float* __restrict__ y,
                            int64_t heads, int64_t dim, int64_t first, bool inverse, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t c = e % dim;
    if (c < first) {
      y[e] = x[e];
      continue;
    }
    const int64_t row = e / dim;
    const int64_t k = c - first;
    const int64_t i = k / 2;
    const int64_t pair = e - (k % 2);  // flat index of the pair's first element
    const float a = x[pair];
    const float b = x[pair + 1];
    const float angle = static_cast<float>(positions[row / heads]) * inv_freq[i];
    const float co = cosf(angle);
    const float si = inverse ? -sinf(angle) : sinf(angle);
    y[e] = (k % 2 == 0) ? __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si))
                        : __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
  }
}

}  // namespace

Tensor CudaBackend::rope_impl(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                              bool inverse) {
  const char* op = "rope";
  const int64_t heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t dim = x.size(-1);
  const int64_t half = inv_freq.size(0);
  Tensor out = empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  if (n == 0) return out;
  rope_kernel<<<elementwise_blocks(num_sms(), n), kElementwiseThreads, 0, stream()>>>(
      x.data<float>(), positions.data<int32_t>(), inv_freq.data<float>(), out.data<float>(), heads,
      dim, dim - 2 * half, inverse, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
