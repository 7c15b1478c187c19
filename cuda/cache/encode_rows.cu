// launch_encode_kv_rows (encode_rows.cuh): f32 rows into a KV cache format, one block per row.
#include "cuda/cache/copy_row.cuh"
#include "cuda/cache/encode_rows.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm90.cuh"

namespace deepinfer::cuda {

namespace {

// Block t encodes row t.
__global__ void encode_kv_rows_kernel(const float* __restrict__ kv, uint8_t* __restrict__ rows,
                                      KvRowFormat f) {
  // With the attention kernels' _pdl variants (and wgmma_overlap_fused) the kernel after it is a
  // programmatic dependent launch: it may start now and waits for this grid before it reads the
  // rows (an ordinary launch ignores this).
  let_dependents_launch();
  const int64_t t = blockIdx.x;
  encode_kv_row(kv + t * f.dim, rows + t * f.row_bytes, f);
}

}  // namespace

void launch_encode_kv_rows(const float* kv, uint8_t* rows, int64_t tokens, const KvRowFormat& f,
                           cudaStream_t stream, const char* op) {
  if (tokens <= 0) return;
  encode_kv_rows_kernel<<<static_cast<unsigned>(tokens), kRowThreads, 0, stream>>>(kv, rows, f);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
