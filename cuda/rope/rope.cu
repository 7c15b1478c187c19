// rope of the CUDA backend (docs/model.md#rotary-embedding): the rotation of the last 2 *
// inv_freq channels of each head, as the CPU reference op (cpp/src/backend/cpu_ops_dense.cpp)
// computes it. The CPU build has no FMA contraction, so the products are rounded separately
// (__fmul_rn / __fsub_rn) and the angle's cos and sin are cosf / sinf (within 2 ulp of glibc's).
// x is f32, or bf16 (the attention output under AttentionSpec::bf16_output), widened exactly on
// load; the result is f32.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/rope/rope_quad.cuh"

namespace deepinfer::cuda {

namespace {

__device__ __forceinline__ float widen(float v) {
  return v;
}
__device__ __forceinline__ float widen(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Elements 4 qd .. 4 qd + 3 of x (16-byte aligned f32, 8-byte aligned bf16).
__device__ __forceinline__ float4 load_quad(const float* x, int qd) {
  return reinterpret_cast<const float4*>(x)[qd];
}
__device__ __forceinline__ float4 load_quad(const __nv_bfloat16* x, int qd) {
  const uint2 u = reinterpret_cast<const uint2*>(x)[qd];
  // A bf16's bits are the high half of its f32's.
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
}

// One thread per output element of x viewed as [rows = T * heads, dim]. Channels before `first`
// are copied; channel first + 2i (+1) is the first (second) element of rotated pair i. Both
// threads of a pair compute the same angle, cos and sin as the CPU: float(pos) * inv_freq[i],
// cosf, sinf (not the __cosf intrinsics), products rounded separately.
template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, const int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, float* __restrict__ y,
                            int64_t heads, int64_t dim, int64_t first, bool inverse, int64_t n) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t c = e % dim;
    if (c < first) {
      y[e] = widen(x[e]);
      continue;
    }
    const int64_t row = e / dim;
    const int64_t k = c - first;
    const int64_t i = k / 2;
    const int64_t pair = e - (k % 2);  // flat index of the pair's first element
    const float a = widen(x[pair]);
    const float b = widen(x[pair + 1]);
    const float angle = static_cast<float>(positions[row / heads]) * inv_freq[i];
    const float co = cosf(angle);
    const float si = inverse ? -sinf(angle) : sinf(angle);
    y[e] = (k % 2 == 0) ? __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si))
                        : __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
  }
}

// The same rotation, one thread per 4 consecutive elements of a row (float4 loads and stores, two
// whole pairs when the quad is rotated) with 32-bit offsets: one division per quad instead of
// three 64-bit ones per element (the inverse rotation of the attention output reads and writes
// all of [T, heads, 512] every layer). Needs dim % 4 == 0, `first` a multiple of 4 (a quad is
// wholly copied or wholly two rotated pairs; an even `first` alone let a quad straddle the two
// and left its rotated half unrotated), 16-byte aligned y and x (8-byte for bf16 x) and fewer
// than 2^30 quads (the grid-stride index stays an int). The angles, cos, sin and products are
// the element kernel's, so the bytes are meant to be too (tests/gpu/cpp/test_cuda_only.cpp:
// RopeQuadsMatchTheElementKernel).
template <typename T>
__global__ void rope_quads_kernel(const T* __restrict__ x, const int32_t* __restrict__ positions,
                                  const float* __restrict__ inv_freq, float4* __restrict__ y,
                                  int heads, int quads_per_row, int first, bool inverse,
                                  int quads) {
  enter_dependent_grid();
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  for (int qd = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); qd < quads; qd += stride) {
    const int row = qd / quads_per_row;
    const int c = (qd - row * quads_per_row) * 4;
    const float4 v = load_quad(x, qd);
    if (c < first) {
      y[qd] = v;
      continue;
    }
    const float pos = static_cast<float>(positions[row / heads]);
    y[qd] = rope_rotate_quad(v, pos, inv_freq, (c - first) / 2, inverse);
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
  const int64_t first = dim - 2 * half;
  auto run = [&]<typename T>(const T* src) {
    const auto x_addr = reinterpret_cast<uintptr_t>(src);
    const bool x_aligned = x_addr % (4 * sizeof(*src)) == 0;
    if (dim % 4 == 0 && first % 4 == 0 && n / 4 < (int64_t{1} << 30) && x_aligned &&
        aligned16(out.raw_data())) {
      const int64_t quads = n / 4;
      launch_programmatic(op, dim3(elementwise_blocks(num_sms(), quads)), dim3(kElementwiseThreads),
                          0, stream(), pdl(), rope_quads_kernel<T>, src, positions.data<int32_t>(),
                          inv_freq.data<float>(), reinterpret_cast<float4*>(out.data<float>()),
                          static_cast<int>(heads), static_cast<int>(dim / 4),
                          static_cast<int>(first), inverse, static_cast<int>(quads));
    } else {
      launch_programmatic(op, dim3(elementwise_blocks(num_sms(), n)), dim3(kElementwiseThreads), 0,
                          stream(), pdl(), rope_kernel<T>, src, positions.data<int32_t>(),
                          inv_freq.data<float>(), out.data<float>(), heads, dim, first, inverse, n);
    }
    DEEPINFER_CUDA_LAUNCH_CHECK(op);
  };
  if (x.dtype() == DType::kBF16) {
    run(static_cast<const __nv_bfloat16*>(x.raw_data()));
  } else {
    run(x.data<float>());
  }
  return out;
}

}  // namespace deepinfer::cuda
