// The device side of the overlap kernel's timing instrumentation (attention_wgmma_trace.h):
// OverlapTraceRecorder<kOn> is empty and every call a no-op unless kOn, so the kernel's ordinary
// instantiations compile to the same code as without it. With kOn the first thread of each
// warpgroup of a traced block (the first `ctas` blocks) stores clock64 stamps into the block's
// record (the clocks of cuda/common/trace_clock.cuh).
#pragma once

#include <cstdint>

#include "cuda/attention/sm90/attention_wgmma_trace.h"
#include "cuda/common/trace_clock.cuh"

namespace deepinfer::cuda::attention_wgmma {

// Makes the thread wait until `v` (a register a load writes) has landed, so that the next
// stamp comes after the load completed (trace builds only: it serialises on the load).
__device__ __forceinline__ void trace_wait_for(uint32_t v) {
  asm volatile("" ::"r"(v) : "memory");
}

template <bool kOn>
struct OverlapTraceRecorder {
  __device__ explicit OverlapTraceRecorder(const OverlapTraceBuffer&, int) {}
  __device__ void stamp(int, int) const {}
  __device__ void header(int, int64_t) const {}
  __device__ void header_clock(int) const {}
  __device__ void header_timer(int) const {}
  __device__ void clear(int, int) const {}
  static constexpr bool kRecords = false;
};

template <>
struct OverlapTraceRecorder<true> {
  int64_t* record = nullptr;  // this block's record, for the first thread of a warpgroup

  // `tid`: the thread's index in the block; only the first thread of each warpgroup records.
  __device__ explicit OverlapTraceRecorder(const OverlapTraceBuffer& t, int tid) {
    const int64_t cta =
        blockIdx.x + int64_t{gridDim.x} * (blockIdx.y + int64_t{gridDim.y} * blockIdx.z);
    if (t.stamps != nullptr && cta < t.ctas && (tid & 127) == 0) {
      record = t.stamps + cta * kOverlapTraceWordsPerCta;
    }
  }
  __device__ void stamp(int event, int tile) const {
    if (record != nullptr && tile < kOverlapTraceTiles) {
      record[kOverlapTraceHeaderWords + event * kOverlapTraceTiles + tile] = trace_clock();
    }
  }
  __device__ void header(int field, int64_t v) const {
    if (record != nullptr) record[field] = v;
  }
  __device__ void header_clock(int field) const { header(field, trace_clock()); }
  __device__ void header_timer(int field) const { header(field, trace_globaltimer()); }
  // Zeroes events first .. last - 1 (all tiles) of the record: a role's own, before it stamps.
  __device__ void clear(int first, int last) const {
    if (record == nullptr) return;
    for (int i = kOverlapTraceHeaderWords + first * kOverlapTraceTiles;
         i < kOverlapTraceHeaderWords + last * kOverlapTraceTiles; ++i) {
      record[i] = 0;
    }
  }
  static constexpr bool kRecords = true;
};

}  // namespace deepinfer::cuda::attention_wgmma
