#include <string>

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

int KernelSmemLimits::max_active_clusters_of(const void* kernel, dim3 block, dim3 cluster,
                                             size_t smem) {
  const ClusterShape shape{kernel, block.x, cluster.x, cluster.y, cluster.z, smem};
  std::lock_guard<std::mutex> lock(mu_);
  auto known = active_clusters_.find(shape);
  if (known != active_clusters_.end()) return known->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = cluster;  // a grid of one cluster: the query's shape only
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster.x;
  attribute.val.clusterDim.y = cluster.y;
  attribute.val.clusterDim.z = cluster.z;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  DEEPINFER_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  if (clusters < 1) {
    throw Error(ErrorCode::kUnsupported,
                "no cluster of " + std::to_string(cluster.x * cluster.y * cluster.z) +
                    " blocks of " + std::to_string(block.x) + " threads and " +
                    std::to_string(smem) + " bytes of shared memory fits the device");
  }
  active_clusters_.emplace(shape, clusters);
  return clusters;
}

}  // namespace deepinfer::cuda
