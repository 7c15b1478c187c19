// ring_write of the CUDA backend: this call's rows (SWA keys, compressor rows) into the
// per-sequence rings of the state slots (docs/model.md#state-slots-and-rings), as the CPU
// reference op (cpp/src/backend/cpu_ops_cache.cpp). The sequence, position and slot of a row are
// read on the device from the BatchLayout; nothing waits for the stream. Rows of a sequence whose
// slot is outside [0, slots), or whose position is negative, are not written (the CPU op throws).
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/cache/copy_row.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"

namespace deepinfer::cuda {

namespace {

// One block per row t: the row is stored at ring[slot][pos % R] when it is among the last R rows
// of its sequence (earlier rows of a longer chunk would be overwritten by later ones anyway, and
// skipping them keeps the writes of one call disjoint).
__global__ void ring_write_kernel(float* __restrict__ ring, const float* __restrict__ rows,
                                  DeviceLayout l, int64_t slots, int64_t ring_len, int64_t width,
                                  bool vec4) {
  const int t = blockIdx.x;
  const int b = seq_of_row(l, t);
  if (t < l.q_start[b + 1] - ring_len) return;
  const int64_t slot = l.slot[b];
  const int64_t pos = l.positions[t];
  if (slot < 0 || slot >= slots || pos < 0) return;
  copy_row(ring + (slot * ring_len + pos % ring_len) * width, rows + t * width, width, vec4);
}

}  // namespace

// f32 rings only (supports_kv_cache_dtype): rope_dim, which selects an fp8 record, is unused.
void CudaBackend::ring_write_impl(const Tensor& ring, const Tensor& rows, const BatchLayout& layout,
                                  int /*rope_dim*/) {
  const char* op = "ring_write";
  const int64_t slots = ring.size(0);
  const int64_t ring_len = ring.size(1);
  const int64_t width = ring.size(2);
  if (layout.num_tokens == 0 || width == 0) return;
  const bool vec4 = width % 4 == 0 && aligned16(ring.raw_data()) && aligned16(rows.raw_data());
  ring_write_kernel<<<static_cast<unsigned>(layout.num_tokens), kRowThreads, 0, stream()>>>(
      ring.data<float>(), rows.data<float>(), device_layout(layout), slots, ring_len, width, vec4);
  DEEPINFER_CUDA_LAUNCH_CHECK(op);
}

}  // namespace deepinfer::cuda
