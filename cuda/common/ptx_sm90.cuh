// PTX wrappers for Hopper's warpgroup MMA (wgmma, sm_90a only) that every wgmma kernel needs: the
// shared-memory matrix descriptor, the fence / commit / wait of the asynchronous MMAs, and the
// proxy fence that makes plain shared-memory stores visible to them. The MMA shapes themselves live
// next to the kernel that uses them.
//
// wgmma exists on sm_90a only: built for other targets (sm_100a), DEEPINFER_WGMMA traps, and the
// host never launches such a kernel there (DEEPINFER_HAVE_SM90A, cuda/CMakeLists.txt).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_sm80.cuh"

namespace deepinfer::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DEEPINFER_WGMMA(...) asm volatile(__VA_ARGS__)
#else
#define DEEPINFER_WGMMA(...) __trap()
#endif

// A shared-memory matrix descriptor without swizzle: start address, leading byte offset (between
// core matrices along k) and stride byte offset (between core matrices along M or N).
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lead, uint32_t stride) {
  const uint32_t addr = smem_addr(smem);
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>(lead >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() {
  DEEPINFER_WGMMA("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  DEEPINFER_WGMMA("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still running (0: all of them done).
template <int kPending = 0>
__device__ __forceinline__ void wgmma_wait() {
  DEEPINFER_WGMMA("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  wgmma_wait<0>();
}

// Keeps the compiler from moving accesses of the accumulators across the asynchronous MMAs.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// fence.proxy.async: tiles written to shared memory by plain stores become visible to wgmma's
// (and TMA's) reads.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// setmaxnreg (sm_90a; elsewhere nothing): a warpgroup of a warp-specialised kernel gives
// registers back (dec) or takes them (inc) up to kRegs per thread (a multiple of 8 in 24..256).
// Every warp of the warpgroup executes it.
template <int kRegs>
__device__ __forceinline__ void warpgroup_regs_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg's range");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_regs_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg's range");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace deepinfer::cuda
