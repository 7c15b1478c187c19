// The clocks of the kernels' timing instrumentation (the attention overlap kernel's trace,
// attention_wgmma_trace.cuh; the fused mHC kernel's, hc_fused_trace.cuh): volatile asm with a
// memory clobber, so a stamp stays between the barriers and memory operations it brackets.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// The SM's cycle counter (per SM: compare stamps of one block only).
__device__ __forceinline__ int64_t trace_clock() {
  uint64_t v;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(v)::"memory");
  return static_cast<int64_t>(v);
}

// Nanoseconds on the device-wide timer (comparable across blocks).
__device__ __forceinline__ int64_t trace_globaltimer() {
  uint64_t v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v)::"memory");
  return static_cast<int64_t>(v);
}

__device__ __forceinline__ int64_t trace_smid() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}

}  // namespace deepinfer::cuda
