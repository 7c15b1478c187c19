// quantize_activations: dynamic activation quantization (weight.h MatrixWeight::act_group),
// returned dequantized in f32. One warp per (row, group): the group's max |x| by a warp
// reduction, then each value rounded to its e4m3 grid. Bit-identical to the CPU op.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/quant/quant_launch.h"

namespace deepinfer::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void quantize_activations_kernel(const float* __restrict__ x, float* __restrict__ out,
                                            int64_t rows, int64_t cols, int group) {
  enter_dependent_grid();
  const int64_t groups_per_row = (cols + group - 1) / group;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= rows * groups_per_row) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = item / groups_per_row;
  const int64_t c0 = (item % groups_per_row) * group;
  const int64_t c1 = c0 + group < cols ? c0 + group : cols;
  const float* xr = x + row * cols;
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c1; c += 32) amax = fmaxf(amax, fabsf(xr[c]));
  const float scale = act_group_scale(warp_max(amax));
  const float inv = 1.0f / scale;  // exact: a power of two
  for (int64_t c = c0 + lane; c < c1; c += 32) {
    out[row * cols + c] = round_to_e4m3(xr[c] * inv) * scale;
  }
}

}  // namespace

void launch_quantize_activations(const float* x, float* out, int64_t rows, int64_t cols, int group,
                                 bool pdl, cudaStream_t stream) {
  const int64_t items = rows * ((cols + group - 1) / group);
  if (items == 0) return;
  launch_programmatic("quantize_activations", dim3(ceil_div(items, kWarpsPerBlock)),
                      dim3(32 * kWarpsPerBlock), 0, stream, pdl, quantize_activations_kernel, x,
                      out, rows, cols, group);
}

Tensor CudaBackend::quantize_activations_impl(const Tensor& x, int group) {
  Tensor out = empty(x.shape(), DType::kF32);
  launch_quantize_activations(x.data<float>(), out.data<float>(), x.size(0), x.size(1), group,
                              pdl(), stream());
  DEEPINFER_CUDA_LAUNCH_CHECK("quantize_activations");
  return out;
}

}  // namespace deepinfer::cuda
