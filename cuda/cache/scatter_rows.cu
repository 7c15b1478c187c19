// scatter_rows of the CUDA backend: pooled entries into the paged entry caches
// (docs/model.md#paged-entry-blocks), as the CPU reference op (cpp/src/backend/cpu_ops_cache.cpp).
// A destination outside [0, rows) is skipped (the other rows are stored; the CPU op throws and
// stores none). Duplicate destinations race (the CPU keeps the last); callers never pass them.
// Rows are stored in the cache's KV format (kv_record.cuh): f32 copied, bf16 and fp8 encoded.
#include <cstdint>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/copy_row.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

__global__ void scatter_rows_kernel(uint8_t* __restrict__ cache, const float* __restrict__ rows,
                                    const int32_t* __restrict__ dest, int64_t cache_rows,
                                    KvRowFormat f, bool vec4) {
  enter_dependent_grid();
  const int64_t i = blockIdx.x;
  const int64_t d = dest[i];
  if (d < 0 || d >= cache_rows) return;
  store_kv_row(cache + d * f.row_bytes, rows + i * f.dim, f, vec4);
}

}  // namespace

void CudaBackend::scatter_rows_impl(const Tensor& cache, const Tensor& rows, const Tensor& dest,
                                    int rope_dim) {
  const char* op = "scatter_rows";
  const int64_t n = rows.size(0);
  const int64_t dim = rows.size(1);
  const KvRowFormat f = kv_row_format(cache.dtype(), dim, rope_dim);
  check_kv_row_format(op, f);
  if (n == 0 || f.row_bytes == 0) return;
  if (n > 0x7fffffff) fail(op, std::to_string(n) + " rows exceed one launch");  // gridDim.x
  const bool vec4 = dim % 4 == 0 && aligned16(cache.raw_data()) && aligned16(rows.raw_data());
  launch_programmatic(op, dim3(static_cast<unsigned>(n)), dim3(kRowThreads), 0, stream(), pdl(),
                      scatter_rows_kernel, static_cast<uint8_t*>(cache.raw_data()),
                      rows.data<float>(), dest.data<int32_t>(), cache.size(0), f, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
