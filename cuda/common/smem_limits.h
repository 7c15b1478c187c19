// The dynamic shared memory limits a backend raises on its device's kernels. A kernel that takes
// more than the default 48 KiB of dynamic shared memory per block needs its limit raised first
// (cudaFuncAttributeMaxDynamicSharedMemorySize); this registry does it once per kernel and
// backend instead of on every launch. It also keeps how many clusters of a persistent kernel the
// device runs at once, asked once per kernel and shape. Host code only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

namespace deepinfer::cuda {

// One per backend (CudaBackend::smem_limits), keyed by the kernel's address. Limits only go up:
// the attribute belongs to the device's context, which every backend of that device shares, so a
// kernel's limit is read from the device the first time (another backend may have raised it) and
// raised only when a launch needs more; lowering it could fail another backend's (or a captured
// graph's) launch. Launches of kernels that need at most 48 KiB leave it alone.
class KernelSmemLimits {
 public:
  // Before a launch of `kernel` with `bytes` of dynamic shared memory (on the current device,
  // the backend's).
  template <typename Kernel>
  void allow(Kernel kernel, size_t bytes) {
    if (bytes > kDefaultBytes) allow_address(reinterpret_cast<const void*>(kernel), bytes);
  }

  // The most clusters (`cluster` blocks of `block` threads and `smem` bytes of dynamic shared
  // memory each) of `kernel` that the current device runs at once
  // (cudaOccupancyMaxActiveClusters; after allow(kernel, smem)); throws when none fits.
  template <typename Kernel>
  int max_active_clusters(Kernel kernel, dim3 block, dim3 cluster, size_t smem) {
    return max_active_clusters_of(reinterpret_cast<const void*>(kernel), block, cluster, smem);
  }

 private:
  static constexpr size_t kDefaultBytes = 48 * 1024;
  void allow_address(const void* kernel, size_t bytes);
  int max_active_clusters_of(const void* kernel, dim3 block, dim3 cluster, size_t smem);

  using ClusterShape = std::tuple<const void*, unsigned, unsigned, unsigned, unsigned, size_t>;

  std::mutex mu_;
  std::unordered_map<const void*, size_t> limits_;  // at least the kernel's limit on the device
  std::map<ClusterShape, int> active_clusters_;     // (kernel, block.x, cluster, smem) -> count
};

}  // namespace deepinfer::cuda
