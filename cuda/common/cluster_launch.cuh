// Launches of kernels in thread-block clusters (sm_90+), optionally as programmatic dependent
// launches: the cudaLaunchKernelEx configuration and attributes the clustered kernels (the FP8
// decode GEMV, the streaming FP8 linear, the cluster RMSNorm) share; and programmatic dependent
// launches without clusters. Host code only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

struct ClusterLaunch {
  dim3 grid;
  dim3 block;
  dim3 cluster;     // blocks per cluster along each grid dimension (each divides the grid's)
  size_t smem = 0;  // dynamic shared memory per block
  cudaStream_t stream = nullptr;
  // A programmatic dependent launch: the kernel may start before the previous one on the stream
  // finished (it waits with griddepcontrol where it reads that one's output).
  bool pdl = false;
};

// Launches `kernel` on `args` as `l` says; throws Error(kInternal) naming `op` when the launch
// is refused.
template <typename... Params, typename... Args>
void launch_clustered(const char* op, const ClusterLaunch& l, void (*kernel)(Params...),
                      Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = l.grid;
  config.blockDim = l.block;
  config.dynamicSmemBytes = l.smem;
  config.stream = l.stream;
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = l.cluster.x;
  attributes[0].val.clusterDim.y = l.cluster.y;
  attributes[0].val.clusterDim.z = l.cluster.z;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = l.pdl ? 2 : 1;
  DEEPINFER_CUDA_THROW_IF_ERROR(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...),
                                std::string("a clustered launch of ") + op);
}

// Launches `kernel` on `args` over `grid` x `block` with `smem` bytes of dynamic shared memory,
// as a programmatic dependent launch where `pdl` (it may start before the previous kernel on the
// stream finished, and waits with griddepcontrol where it reads that one's output); throws
// Error(kInternal) naming `op` when the launch is refused.
template <typename... Params, typename... Args>
void launch_programmatic(const char* op, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         bool pdl, void (*kernel)(Params...), Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[1] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = pdl ? 1 : 0;
  DEEPINFER_CUDA_THROW_IF_ERROR(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...),
                                std::string("a kernel launch of ") + op);
}

}  // namespace deepinfer::cuda
