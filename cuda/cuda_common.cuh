// Shared helpers of the CUDA backend: error checks, launch geometry, bf16 loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/op_checks.h"
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

// Error(kInvalidArgument) "<op>: <what>". The metadata of every op's arguments is checked by the
// Backend front (op_checks.h); the ops use this for limits of the CUDA kernels only.
using checks::fail;

}  // namespace deepinfer::cuda
