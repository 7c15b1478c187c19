// adjust_logits of the CUDA backend, in place: sparse additive biases (logit_bias, penalties),
// then the constraint bitmask (cpp/src/backend/cpu_ops_sample.cpp is the reference).
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

// logits[rows[i], tokens[i]] += values[i]. The host builds each (row, token) pair once, so no
// two threads write one element. An entry outside the logits (the CPU op throws) is skipped.
__global__ void add_logit_entries_kernel(float* __restrict__ logits,
                                         const int32_t* __restrict__ rows,
                                         const int32_t* __restrict__ tokens,
                                         const float* __restrict__ values, int64_t n,
                                         int64_t num_rows, int64_t vocab) {
  enter_dependent_grid();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int32_t r = rows[i];
    const int32_t t = tokens[i];
    if (r >= 0 && r < num_rows && t >= 0 && t < vocab) logits[r * vocab + t] += values[i];
  }
}

// One thread per logit: -inf where the token's bit in its row's mask is clear.
__global__ void mask_logits_kernel(float* __restrict__ logits, const uint32_t* __restrict__ allowed,
                                   int64_t num_rows, int64_t vocab) {
  enter_dependent_grid();
  const int64_t words = (vocab + 31) / 32;
  const int64_t n = num_rows * vocab;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t r = i / vocab;
    const int64_t t = i - r * vocab;
    if (((allowed[r * words + t / 32] >> (t % 32)) & 1u) == 0) logits[i] = -INFINITY;
  }
}

}  // namespace

void CudaBackend::adjust_logits_impl(const Tensor& logits, const LogitAdjustments& adjustments) {
  const int64_t num_rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t n = adjustments.rows.defined() ? adjustments.rows.size(0) : 0;
  if (n > 0) {
    launch_programmatic("adjust_logits (entries)", dim3(elementwise_blocks(num_sms(), n)),
                        dim3(kElementwiseThreads), 0, stream(), pdl(), add_logit_entries_kernel,
                        logits.data<float>(), adjustments.rows.data<int32_t>(),
                        adjustments.tokens.data<int32_t>(), adjustments.values.data<float>(), n,
                        num_rows, vocab);
    DEEPINFER_CUDA_LAUNCH_CHECK("adjust_logits (entries)");
  }
  if (adjustments.allowed.defined() && num_rows * vocab > 0) {
    launch_programmatic(
        "adjust_logits (mask)", dim3(elementwise_blocks(num_sms(), num_rows * vocab)),
        dim3(kElementwiseThreads), 0, stream(), pdl(), mask_logits_kernel, logits.data<float>(),
        reinterpret_cast<const uint32_t*>(adjustments.allowed.data<int32_t>()), num_rows, vocab);
    DEEPINFER_CUDA_LAUNCH_CHECK("adjust_logits (mask)");
  }
}

}  // namespace deepinfer::cuda
