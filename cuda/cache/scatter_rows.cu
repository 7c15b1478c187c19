// scatter_rows of the CUDA backend: pooled entries into the paged entry caches
// (docs/model.md#paged-entry-blocks), as the CPU reference op (cpp/src/backend/cpu_ops_cache.cpp).
// A destination outside [0, rows) is skipped (the other rows are stored; the CPU op throws and
// stores none). Duplicate destinations race (the CPU keeps the last); callers never pass them.
#include <cstdint>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/copy_row.cuh"
#include "cuda/common/launch.cuh"

namespace deepinfer::cuda {

namespace {

__global__ void scatter_rows_kernel(float* __restrict__ cache, const float* __restrict__ rows,
                                    const int32_t* __restrict__ dest, int64_t cache_rows,
                                    int64_t width, bool vec4) {
  const int64_t i = blockIdx.x;
  const int64_t d = dest[i];
  if (d < 0 || d >= cache_rows) return;
  copy_row(cache + d * width, rows + i * width, width, vec4);
}

}  // namespace

// f32 caches only (supports_kv_cache_dtype): rope_dim, which selects an fp8 record, is unused.
void CudaBackend::scatter_rows_impl(const Tensor& cache, const Tensor& rows, const Tensor& dest,
                                    int /*rope_dim*/) {
  const char* op = "scatter_rows";
  const int64_t n = rows.size(0);
  const int64_t width = cache.size(1);
  if (n == 0 || width == 0) return;
  if (n > 0x7fffffff) fail(op, std::to_string(n) + " rows exceed one launch");  // gridDim.x
  const bool vec4 = width % 4 == 0 && aligned16(cache.raw_data()) && aligned16(rows.raw_data());
  scatter_rows_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, stream()>>>(
      cache.data<float>(), rows.data<float>(), dest.data<int32_t>(), cache.size(0), width, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
