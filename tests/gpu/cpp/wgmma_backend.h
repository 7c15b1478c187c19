// The CUDA backend the Hopper attention kernels' GPU tests share, where it runs the wgmma kernels
// (sm_90a code on an sm_90 device).
#pragma once

#include <cuda_runtime.h>

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
