// fill_random_normal: sample::normal keyed by (seed, element index), the CPU backend's values.
#include <algorithm>
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"
#include "sample/counter_rng.h"

namespace deepinfer::cuda {

namespace {

template <typename T>
__global__ void fill_normal_kernel(T* out, int64_t n, uint64_t seed, float mean, float std) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = mean + std * sample::normal(seed, static_cast<uint64_t>(i));
    if constexpr (sizeof(T) == 4) {
      out[i] = v;
    } else {
      out[i] = __float2bfloat16(v);
    }
  }
}

}  // namespace

void CudaBackend::fill_random_normal_impl(const Tensor& t, uint64_t seed, float mean, float std) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const unsigned blocks =
      std::min<unsigned>(ceil_div(n, 256), static_cast<unsigned>(num_sms()) * 32);
  if (t.dtype() == DType::kF32) {
    fill_normal_kernel<<<blocks, 256, 0, stream()>>>(t.data<float>(), n, seed, mean, std);
  } else {  // bf16 (the front accepts f32 or bf16)
    fill_normal_kernel<<<blocks, 256, 0, stream()>>>(t.data<__nv_bfloat16>(), n, seed, mean, std);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK("fill_random_normal");
}

}  // namespace deepinfer::cuda
