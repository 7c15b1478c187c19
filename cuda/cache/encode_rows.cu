// launch_encode_kv_rows (encode_rows.cuh): f32 rows into a KV cache format, one block per row.
#include "cuda/cache/copy_row.cuh"
#include "cuda/cache/encode_rows.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

// Block t encodes row t.
__global__ void encode_kv_rows_kernel(const float* __restrict__ kv, uint8_t* __restrict__ rows,
                                      KvRowFormat f) {
  // Waits for the kernel before it (where launched as its programmatic dependent), then lets the
  // kernel after it start: with the attention kernels' _pdl variants (and wgmma_overlap_fused)
  // that one is a programmatic dependent launch and waits for this grid before it reads the rows.
  enter_dependent_grid();
  const int64_t t = blockIdx.x;
  encode_kv_row(kv + t * f.dim, rows + t * f.row_bytes, f);
}

}  // namespace

void launch_encode_kv_rows(const float* kv, uint8_t* rows, int64_t tokens, const KvRowFormat& f,
                           bool pdl, cudaStream_t stream, const char* op) {
  if (tokens <= 0) return;
  launch_programmatic(op, dim3(static_cast<unsigned>(tokens)), dim3(kRowThreads), 0, stream, pdl,
                      encode_kv_rows_kernel, kv, rows, f);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
