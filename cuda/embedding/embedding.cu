// embedding of the CUDA backend: rows of the table by token id, widened to f32, as the CPU
// reference op (cpp/src/backend/cpu_ops_dense.cpp).
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda {

namespace {

// One block per token. An id outside [0, vocab) gives a zero row (the CPU op throws).
template <typename T>
__global__ void embedding_kernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                 float* __restrict__ out, int64_t vocab, int64_t hidden) {
  enter_dependent_grid();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const T* src = table + (valid ? static_cast<int64_t>(id) : 0) * hidden;
  float* dst = out + t * hidden;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    dst[h] = valid ? load_as_float(src, h) : 0.0f;
  }
}

}  // namespace

Tensor CudaBackend::embedding_impl(const Tensor& table, const Tensor& ids) {
  const char* op = "embedding";
  const int64_t vocab = table.size(0);
  const int64_t hidden = table.size(1);
  const int64_t tokens = ids.size(0);
  Tensor out = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return out;
  const dim3 grid(static_cast<unsigned>(tokens));
  const dim3 block(row_threads(hidden));
  if (table.dtype() == DType::kF32) {
    launch_programmatic(op, grid, block, 0, stream(), pdl(), embedding_kernel<float>,
                        table.data<float>(), ids.data<int32_t>(), out.data<float>(), vocab, hidden);
  } else {
    launch_programmatic(op, grid, block, 0, stream(), pdl(), embedding_kernel<__nv_bfloat16>,
                        table.data<__nv_bfloat16>(), ids.data<int32_t>(), out.data<float>(), vocab,
                        hidden);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
  return out;
}

}  // namespace deepinfer::cuda
