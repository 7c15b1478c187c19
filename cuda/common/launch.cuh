// Launch helpers of the CUDA backend: error checks, grid arithmetic, alignment and shared-memory
// limits. Host code only; every op file includes it.
#pragma once

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

// Error(kInvalidArgument) "<op>: <what>". The metadata of every op's arguments is checked by the
// Backend front (op_checks.h); the ops use this for limits of the CUDA kernels only.
using checks::fail;

inline unsigned ceil_div(int64_t a, int64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

// 16-byte aligned: float4 / uint4 loads and cp.async need it (a view of a tensor may not be).
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The float4 paths need 16-byte aligned rows: a width that is a multiple of 4 on an aligned base.
inline void check_vec4(const char* op, const char* arg, const Tensor& t) {
  if (!aligned16(t.raw_data())) {
    throw Error(ErrorCode::kUnsupported, std::string(op) + ": argument " + arg + " " +
                                             t.describe() +
                                             " does not start on a 16-byte boundary");
  }
}

// Raises a kernel's dynamic shared memory limit when it needs more than the default 48 KiB, at
// every call. The backend's KernelSmemLimits (smem_limits.h) does it once per kernel instead.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024) {
    DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
  }
}

// Grid-stride elementwise kernels run kElementwiseThreads per block and enough blocks to fill
// the device, never more than the elements need.
constexpr int kElementwiseThreads = 256;

inline unsigned elementwise_blocks(int num_sms, int64_t n) {
  const int64_t fill = static_cast<int64_t>(num_sms) * 16;
  const int64_t need = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(need < fill ? need : fill);
}

// Threads of a one-block-per-row kernel over rows of `width` elements (a multiple of 32).
inline int row_threads(int64_t width) {
  if (width >= 4096) return 512;
  if (width >= 1024) return 256;
  return 128;
}

}  // namespace deepinfer::cuda
