// select_tokens of the CUDA backend, in place: the sampled tokens of carried rows replaced by the
// previous step's (cpp/src/backend/cpu_ops_sample.cpp).
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

// tokens[i] = previous[remap[i]] where remap[i] >= 0; other entries keep their value. A remap
// past `previous` (the CPU op throws) leaves tokens[i] as it was.
__global__ void select_tokens_kernel(int32_t* __restrict__ tokens,
                                     const int32_t* __restrict__ remap,
                                     const int32_t* __restrict__ previous, int64_t num_previous,
                                     int64_t n) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int32_t r = remap[i];
    if (r >= 0 && r < num_previous) tokens[i] = previous[r];
  }
}

}  // namespace

void CudaBackend::select_tokens_impl(const Tensor& tokens, const Tensor& remap,
                                     const Tensor& previous) {
  const int64_t n = tokens.size(0);
  if (n == 0) return;
  launch_programmatic("select_tokens", dim3(elementwise_blocks(num_sms(), n)),
                      dim3(kElementwiseThreads), 0, stream(), pdl(), select_tokens_kernel,
                      tokens.data<int32_t>(), remap.data<int32_t>(), previous.data<int32_t>(),
                      previous.size(0), n);
  DEEPINFER_CUDA_LAUNCH_CHECK("select_tokens");
}

}  // namespace deepinfer::cuda
