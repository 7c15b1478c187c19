// The CUDA backend the Hopper attention kernels' GPU tests share, where it runs the wgmma kernels
// (sm_90a code on an sm_90 device).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "cuda/backend/cuda_backend.h"
#include "device_backends.h"

namespace deepinfer::backend_ops {

// The shared CUDA backend when it runs wgmma; else null, with the reason in *why and *must_fail
// set where the device must be tested (DEEPINFER_REQUIRE_DEVICE): no CUDA backend, or an sm_90
// device in a build without sm_90a code, fails rather than skips.
inline cuda::CudaBackend* wgmma_cuda_backend(std::string* why, bool* must_fail) {
  Backend* be = shared_backend("cuda", why);
  if (be == nullptr) {
    *must_fail = device_required();
    return nullptr;
  }
  auto& cuda_be = dynamic_cast<cuda::CudaBackend&>(*be);
  if (cuda_be.wgmma_device()) return &cuda_be;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  *must_fail = device_required() && major == 9;
  *why = *must_fail ? "an sm_90 device, but no sm_90a code built"
                    : "the wgmma attention needs sm_90a code (DEEPINFER_CUDA_ARCHITECTURES with "
                      "90a) and an sm_90 device";
  return nullptr;
}

}  // namespace deepinfer::backend_ops

// In a test body: declares `var`, the backend of wgmma_cuda_backend; without one the test fails
// where the device must be tested, else it is skipped, naming the reason either way.
#define DEEPINFER_WGMMA_BACKEND_OR_SKIP(var)                                      \
  std::string var##_why;                                                          \
  bool var##_must_fail = false;                                                   \
  ::deepinfer::cuda::CudaBackend* var =                                           \
      ::deepinfer::backend_ops::wgmma_cuda_backend(&var##_why, &var##_must_fail); \
  if (var == nullptr) {                                                           \
    if (var##_must_fail) FAIL() << var##_why;                                     \
    GTEST_SKIP() << var##_why;                                                    \
  }
