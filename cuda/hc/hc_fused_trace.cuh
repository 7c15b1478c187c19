// The device side of the fused mHC kernel's timing instrumentation (hc_fused_trace.h):
// HcFusedTraceRecorder<kOn> is empty and every call a no-op unless kOn, so the kernel's ordinary
// instantiations compile to the same code as without it. With kOn thread 0 of a traced CTA (the
// first `ctas`) stamps its record; stamp_here lets another thread (the Sinkhorn warp's first
// lane) stamp one word.
#pragma once

#include <cstdint>

#include "cuda/common/trace_clock.cuh"
#include "cuda/hc/hc_fused_trace.h"

namespace deepinfer::cuda {

template <bool kOn>
struct HcFusedTraceRecorder {
  __device__ explicit HcFusedTraceRecorder(const HcFusedTraceBuffer&) {}
  __device__ void start() const {}
  __device__ void stamp(int) const {}
  __device__ void stamp_here(int) const {}
  __device__ void finish() const {}
};

template <>
struct HcFusedTraceRecorder<true> {
  int64_t* record = nullptr;  // this CTA's record, or null (an untraced CTA)

  __device__ explicit HcFusedTraceRecorder(const HcFusedTraceBuffer& t) {
    if (t.stamps != nullptr && blockIdx.x < static_cast<unsigned>(t.ctas)) {
      record = t.stamps + int64_t{blockIdx.x} * kHcTraceWords;
    }
  }
  // At entry, thread 0: the entry stamps, and zeros where a stamp may not come (the norm, the
  // Sinkhorn), so that every word of the record is written.
  __device__ void start() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kHcTraceEntry] = trace_clock();
    record[kHcTraceTimerEntry] = trace_globaltimer();
    record[kHcTraceSm] = trace_smid();
    record[kHcTraceNormed] = 0;
    record[kHcTraceWeights] = 0;
  }
  __device__ void stamp(int word) const {
    if (record != nullptr && threadIdx.x == 0) record[word] = trace_clock();
  }
  __device__ void stamp_here(int word) const {
    if (record != nullptr) record[word] = trace_clock();
  }
  // Thread 0's last stamps: its channels stored.
  __device__ void finish() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kHcTraceCollapsed] = trace_clock();
    record[kHcTraceTimerEnd] = trace_globaltimer();
  }
};

}  // namespace deepinfer::cuda
