// Shared helpers of the CUDA backend: error checks, launch geometry, bf16 loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// Throws Error(kInternal) naming what failed (a CUDA call, or the op of a kernel launch), the
// CUDA error and where.
[[noreturn]] void throw_cuda_error(cudaError_t err, const std::string& what, const char* file,
                                   int line);

// Throws when `err` is an error; `what` is evaluated only then.
#define DEEPINFER_CUDA_THROW_IF_ERROR(err, what)                                     \
  do {                                                                               \
    cudaError_t deepinfer_err_ = (err);                                              \
    if (deepinfer_err_ != cudaSuccess) {                                             \
      ::deepinfer::cuda::throw_cuda_error(deepinfer_err_, what, __FILE__, __LINE__); \
    }                                                                                \
  } while (false)

#define DEEPINFER_CUDA_CHECK(call) DEEPINFER_CUDA_THROW_IF_ERROR(call, #call)

// After a kernel launch of `op` (a const char*): surfaces launch-configuration errors at once
// (not a sync).
#define DEEPINFER_CUDA_LAUNCH_CHECK(op) \
  DEEPINFER_CUDA_THROW_IF_ERROR(cudaPeekAtLastError(), std::string("a kernel launch of ") + (op))

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
