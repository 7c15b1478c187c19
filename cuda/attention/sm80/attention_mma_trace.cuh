// The device side of the small-batch attention's timing instrumentation (attention_mma_trace.h):
// MmaTraceRecorder<kOn> (the split blocks) and CombineTraceRecorder<kOn> (the combine blocks) are
// empty and every call a no-op unless kOn, so the kernels' ordinary instantiations compile to the
// same code as without them. With kOn thread 0 of a traced block stamps its record.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/attention/sm80/attention_mma_trace.h"
#include "cuda/common/trace_clock.cuh"

namespace deepinfer::cuda {

template <bool kOn>
struct MmaTraceRecorder {
  __device__ explicit MmaTraceRecorder(const MmaTraceBuffer&) {}
  __device__ void start() const {}
  __device__ void stamp(int) const {}
  template <typename T>
  __device__ void stamp_after(int, T) const {}
  __device__ float probe_load(const float*) const { return 0.0f; }
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
    for (int w = kMmaTraceTopk; w <= kMmaTraceValues; ++w) record[w] = 0;
    record[kMmaTraceProbe] = 0;
  }
  __device__ void stamp(int word) const {
    if (record != nullptr && threadIdx.x == 0) record[word] = trace_clock();
  }
  // The stamp once `value` is in thread 0's registers: the clock is read under a condition on it,
  // so it waits for the load or the arithmetic that produces it (a plain stamp would be read as
  // soon as that was issued). The condition fails for one bit pattern only, which the compiler
  // cannot rule out and the kernel never produces (an odd address, a NaN payload other than the
  // canonical one); the word would then stay 0 (start's), a phase the summary skips.
  template <typename T>
  __device__ void stamp_after(int word, T value) const {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "a 32- or 64-bit value");
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    if (record == nullptr || threadIdx.x != 0) return;
    Bits bits;
    memcpy(&bits, &value, sizeof(T));
    if (bits != static_cast<Bits>(0x7fc0'1ee7u)) record[word] = trace_clock();
  }
  // Thread 0's load of `p` from L2 (for kMmaTraceProbe: stamp_after it); 0 elsewhere.
  __device__ float probe_load(const float* p) const {
    return record != nullptr && threadIdx.x == 0 ? __ldcg(p) : 0.0f;
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
