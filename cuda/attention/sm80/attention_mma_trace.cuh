// The device side of the small-batch attention's timing instrumentation (attention_mma_trace.h):
// MmaTraceRecorder<kOn> (the split blocks) and CombineTraceRecorder<kOn> (the combine blocks) are
// empty and every call a no-op unless kOn, so the kernels' ordinary instantiations compile to the
// same code as without them. With kOn thread 0 of a traced block stamps its record.
#pragma once

#include <cstdint>

#include "cuda/attention/sm80/attention_mma_trace.h"
#include "cuda/common/trace_clock.cuh"

namespace deepinfer::cuda {

template <bool kOn>
struct MmaTraceRecorder {
  __device__ explicit MmaTraceRecorder(const MmaTraceBuffer&) {}
  __device__ void start() const {}
  __device__ void stamp(int) const {}
  __device__ void waited() const {}
  __device__ void finish(int) const {}
};

template <>
struct MmaTraceRecorder<true> {
  int64_t* record = nullptr;  // this block's record, or null (an untraced block)

  __device__ explicit MmaTraceRecorder(const MmaTraceBuffer& t) {
    const int64_t block =
        blockIdx.x + int64_t{gridDim.x} * (blockIdx.y + int64_t{gridDim.y} * blockIdx.z);
    if (t.stamps != nullptr && block < t.blocks) record = t.stamps + block * kMmaTraceWords;
  }
  __device__ void start() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kMmaTraceEntry] = trace_clock();
    record[kMmaTraceTimerEntry] = trace_globaltimer();
    record[kMmaTraceSm] = trace_smid();
    // A block without keys never reaches these stamps.
    record[kMmaTraceIssued] = 0;
    record[kMmaTraceQuery] = 0;
    record[kMmaTraceFirstTile] = 0;
  }
  __device__ void stamp(int word) const {
    if (record != nullptr && threadIdx.x == 0) record[word] = trace_clock();
  }
  __device__ void waited() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kMmaTraceWaited] = trace_clock();
    record[kMmaTraceTimerWaited] = trace_globaltimer();
  }
  __device__ void finish(int tiles) const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kMmaTraceStored] = trace_clock();
    record[kMmaTraceTimerEnd] = trace_globaltimer();
    record[kMmaTraceTiles] = tiles;
  }
};

template <bool kOn>
struct CombineTraceRecorder {
  __device__ explicit CombineTraceRecorder(const MmaTraceBuffer&) {}
  __device__ void start() const {}
  __device__ void waited() const {}
  __device__ void loaded() const {}
  __device__ void finish() const {}
};

template <>
struct CombineTraceRecorder<true> {
  int64_t* record = nullptr;

  __device__ explicit CombineTraceRecorder(const MmaTraceBuffer& t) {
    const int64_t block = blockIdx.x + int64_t{gridDim.x} * blockIdx.y;
    if (t.stamps != nullptr && block < t.combines) {
      record = t.stamps + int64_t{t.blocks} * kMmaTraceWords + block * kCombineTraceWords;
    }
  }
  __device__ void start() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kCombineTraceEntry] = trace_clock();
    record[kCombineTraceTimerEntry] = trace_globaltimer();
    record[kCombineTraceSm] = trace_smid();
  }
  __device__ void waited() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kCombineTraceWaited] = trace_clock();
    record[kCombineTraceTimerWaited] = trace_globaltimer();
  }
  __device__ void loaded() const {
    if (record != nullptr && threadIdx.x == 0) record[kCombineTraceLoaded] = trace_clock();
  }
  __device__ void finish() const {
    if (record == nullptr || threadIdx.x != 0) return;
    record[kCombineTraceEnd] = trace_clock();
    record[kCombineTraceTimerEnd] = trace_globaltimer();
  }
};

}  // namespace deepinfer::cuda
