// ring_write of the CUDA backend: this call's rows (SWA keys, compressor rows) into the
// per-sequence rings of the state slots (docs/model.md#state-slots-and-rings), as the CPU
// reference op (cpp/src/backend/cpu_ops_cache.cpp). The sequence, position and slot of a row are
// read on the device from the BatchLayout; nothing waits for the stream. Rows of a sequence whose
// slot is outside [0, slots), or whose position is negative, are not written (the CPU op throws).
// Rows are stored in the ring's KV format (kv_record.cuh): f32 copied, bf16 and fp8 encoded; rows
// that come in the ring's format (rms_norm_rope_kv's) copied as records.
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/copy_row.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"

namespace deepinfer::cuda {

namespace {

// One block per row t: the row is stored at ring[slot][pos % R], in the ring's format f, when it
// is among the last R rows of its sequence (earlier rows of a longer chunk would be overwritten
// by later ones anyway, and skipping them keeps the writes of one call disjoint).
// kEncoded: rows hold records of f.row_bytes already (words: 4-byte units when both bases and the
// record allow, vec4 then); otherwise f32 rows of f.dim, stored by store_kv_row.
template <bool kEncoded>
__global__ void ring_write_kernel(uint8_t* __restrict__ ring, const uint8_t* __restrict__ rows,
                                  DeviceLayout l, int64_t slots, int64_t ring_len, KvRowFormat f,
                                  bool vec4) {
  enter_dependent_grid();
  const int t = blockIdx.x;
  const int b = seq_of_row(l, t);
  if (t < l.q_start[b + 1] - ring_len) return;
  const int64_t slot = l.slot[b];
  const int64_t pos = l.positions[t];
  if (slot < 0 || slot >= slots || pos < 0) return;
  uint8_t* dst = ring + (slot * ring_len + pos % ring_len) * f.row_bytes;
  if constexpr (kEncoded) {
    const uint8_t* src = rows + t * f.row_bytes;
    if (vec4) {
      for (int64_t i = threadIdx.x; i < f.row_bytes / 4; i += blockDim.x) {
        reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
      }
    } else {
      for (int64_t i = threadIdx.x; i < f.row_bytes; i += blockDim.x) dst[i] = src[i];
    }
  } else {
    store_kv_row(dst, reinterpret_cast<const float*>(rows) + t * f.dim, f, vec4);
  }
}

}  // namespace

void CudaBackend::ring_write_impl(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                                  int rope_dim) {
  const char* op = "ring_write";
  const int64_t slots = ring.size(0);
  const int64_t ring_len = ring.size(1);
  // Rows in the ring's format (not f32: the front checked their dtype and width) are records.
  const bool encoded = rows.dtype() != DType::kF32;
  KvRowFormat f;
  if (encoded) {
    f.format = kv_format_of(ring.dtype(), rope_dim);
    f.row_bytes = ring.size(2) * static_cast<int64_t>(dtype_size(ring.dtype()));
  } else {
    f = kv_row_format(ring.dtype(), rows.size(1), rope_dim);
    check_kv_row_format(op, f);
  }
  if (layout.num_tokens == 0 || f.row_bytes == 0) return;
  const auto* src = static_cast<const uint8_t*>(rows.raw_data());
  auto* dst = static_cast<uint8_t*>(ring.raw_data());
  const dim3 grid(static_cast<unsigned>(layout.num_tokens));
  if (encoded) {
    const bool words = f.row_bytes % 4 == 0 && aligned16(dst) && aligned16(src);
    launch_programmatic(op, grid, dim3(kRowThreads), 0, stream(), pdl(), ring_write_kernel<true>,
                        dst, src, device_layout(layout), slots, ring_len, f, words);
  } else {
    const bool vec4 = f.dim % 4 == 0 && aligned16(dst) && aligned16(src);
    launch_programmatic(op, grid, dim3(kRowThreads), 0, stream(), pdl(), ring_write_kernel<false>,
                        dst, src, device_layout(layout), slots, ring_len, f, vec4);
  }
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
