#include "cuda/common/launch.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

void KernelSmemLimits::allow_address(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto known = limits_.find(kernel);
  if (known != limits_.end() && bytes <= known->second) return;
  if (known == limits_.end()) {
    cudaFuncAttributes attributes{};
    DEEPINFER_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    known =
        limits_.emplace(kernel, static_cast<size_t>(attributes.maxDynamicSharedSizeBytes)).first;
    if (bytes <= known->second) return;
  }
  DEEPINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
  known->second = bytes;
}

}  // namespace deepinfer::cuda
