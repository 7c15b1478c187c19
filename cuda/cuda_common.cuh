// Shared helpers of the CUDA backend: error checks, launch geometry, bf16 loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// Throws Error(kInternal) naming the CUDA call, the operation and the CUDA error.
void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

#define DEEPINFER_CUDA_CHECK(call)                                                    \
  do {                                                                                \
    cudaError_t deepinfer_err_ = (call);                                              \
    if (deepinfer_err_ != cudaSuccess) {                                              \
      ::deepinfer::cuda::throw_cuda_error(deepinfer_err_, #call, __FILE__, __LINE__); \
    }                                                                                 \
  } while (false)

// After a kernel launch: surfaces launch-configuration errors at once (not a sync).
#define DEEPINFER_CUDA_LAUNCH_CHECK(op) DEEPINFER_CUDA_CHECK(cudaPeekAtLastError())

inline unsigned ceil_div(int64_t a, int64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

// Element access that works for f32 and bf16 storage.
__device__ __forceinline__ float load_as_float(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// Argument checks on the calling thread (metadata only). Each throws
// Error(kInvalidArgument) "<op>: argument <arg> ...".
[[noreturn]] void fail(const char* op, const std::string& what);
void check_device(const char* op, const char* arg,
                  const Tensor& t);  // defined, on CUDA, contiguous
void check_dtype(const char* op, const char* arg, const Tensor& t, DType dtype);
void check_rank(const char* op, const char* arg, const Tensor& t, int64_t rank);
// check_device + check_dtype + a shape match (-1 in `shape`: any size).
void check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype,
                  const Shape& shape);

}  // namespace deepinfer::cuda
