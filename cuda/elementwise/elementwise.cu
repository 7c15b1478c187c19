// The elementwise ops of the CUDA backend: scale, add and swiglu, grid-stride over the elements,
// each as the CPU reference op (cpp/src/backend/cpu_ops_dense.cpp) computes it.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/activation.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float factor,
                             int64_t n) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = x[i] * factor;
  }
}

template <typename T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                           int64_t n) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = a[i] + b[i];
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              float* __restrict__ y, float limit, int64_t n) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = swiglu(gate[i], up[i], limit);
  }
}

}  // namespace

Tensor CudaBackend::scale_impl(const Tensor& x, float factor) {
  const char* op = "scale";
  Tensor out = empty(x.shape(), DType::kF32);
  const int64_t n = x.numel();
  if (n == 0) return out;
  const dim3 grid(elementwise_blocks(num_sms(), n));
  launch_programmatic(op, grid, dim3(kElementwiseThreads), 0, stream(), pdl(), scale_kernel,
                      x.data<float>(), out.data<float>(), factor, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::add_impl(const Tensor& a, const Tensor& b) {
  const char* op = "add";
  Tensor out = empty(a.shape(), a.dtype());
  const int64_t n = a.numel();
  if (n == 0) return out;
  const dim3 grid(elementwise_blocks(num_sms(), n));
  if (a.dtype() == DType::kI32) {
    launch_programmatic(op, grid, dim3(kElementwiseThreads), 0, stream(), pdl(),
                        add_kernel<int32_t>, a.data<int32_t>(), b.data<int32_t>(),
                        out.data<int32_t>(), n);
  } else {
    launch_programmatic(op, grid, dim3(kElementwiseThreads), 0, stream(), pdl(), add_kernel<float>,
                        a.data<float>(), b.data<float>(), out.data<float>(), n);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

Tensor CudaBackend::swiglu_impl(const Tensor& gate, const Tensor& up, float swiglu_limit) {
  const char* op = "swiglu";
  Tensor out = empty(gate.shape(), DType::kF32);
  const int64_t n = gate.numel();
  if (n == 0) return out;
  const dim3 grid(elementwise_blocks(num_sms(), n));
  launch_programmatic(op, grid, dim3(kElementwiseThreads), 0, stream(), pdl(), swiglu_kernel,
                      gate.data<float>(), up.data<float>(), out.data<float>(), swiglu_limit, n);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
