// PTX wrappers for shared-memory mbarriers and the bulk asynchronous copy (cp.async.bulk, sm_90+)
// that a producer / consumer pipeline needs: a producer thread arms a stage's "full" barrier with
// the bytes it expects and issues bulk copies that complete them; consumers wait on it, read the
// stage and arrive on its "empty" barrier, which the producer waits on before refilling it.
//
// Parity: a barrier's phases alternate 0, 1, 0, ...; mbarrier_wait(bar, p) returns once the
// phase of parity p has completed, so the n-th use of a barrier (from 0) waits on parity n & 1.
// A waiter may lag at most one phase behind, which a full / empty pair guarantees.
#pragma once

#include <cstdint>

#include "cuda/common/ptx_sm80.cuh"

namespace deepinfer::cuda {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals)
               : "memory");
}

// Makes the mbarrier_init of this thread visible to the other threads' and the bulk copies'
// barrier operations (with a __syncthreads after it).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival (release at CTA scope: this thread's earlier shared-memory accesses happen before
// the phase completes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_addr(bar))
      : "memory");
}

// One arrival that also adds `bytes` to the transactions the phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
          smem_addr(bar)),
      "r"(bytes)
      : "memory");
}

// Blocks until the phase of parity `parity` has completed (acquire at CTA scope). The _at forms
// here take shared-memory addresses (smem_addr's), so that a loop can form them once.
__device__ __forceinline__ void mbarrier_wait_at(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  mbarrier_wait_at(smem_addr(bar), parity);
}

// One arrival on `bar` once all of this thread's earlier cp.async copies have landed (.noinc:
// the arrival is one of the phase's expected count, so a barrier that producer threads signal
// this way is initialised with their number). The thread itself does not wait.
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared, completing that
// many transactions of `bar`'s current phase.
__device__ __forceinline__ void bulk_copy_to_shared_at(uint32_t smem, const void* gmem,
                                                       uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem),
      "l"(gmem), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* gmem, uint32_t bytes,
                                                    uint64_t* bar) {
  bulk_copy_to_shared_at(smem_addr(smem), gmem, bytes, smem_addr(bar));
}

// The box at coordinates {x, y} (x the innermost dimension, in elements) of the 2-D tensor map at
// `map` (a CUtensorMap in global memory, 64-byte aligned; cuda/common/tensor_map.h) global ->
// shared at `smem` (128-byte aligned), completing the box's bytes (elements past the tensor read
// as zeros and count too) as transactions of `bar`'s current phase.
__device__ __forceinline__ void tensor_copy_2d_to_shared_at(uint32_t smem, const void* map, int x,
                                                            int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(smem),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// An L2 cache policy that evicts the lines it is given first (createpolicy), for data read once
// that should not push out what others read again.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// bulk_copy_to_shared_at with an L2 cache policy for the lines it reads.
__device__ __forceinline__ void bulk_copy_to_shared_hinted_at(uint32_t smem, const void* gmem,
                                                              uint32_t bytes, uint32_t bar,
                                                              uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1], %2, [%3], %4;\n" ::"r"(smem),
      "l"(gmem), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// `bytes` (a multiple of 16; 16-byte aligned) of global memory into L2 by the bulk copy engine,
// a hint: nothing waits for it, and a later read of the lines is coherent whatever it found.
__device__ __forceinline__ void bulk_prefetch_l2(const void* gmem, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) shared -> global by the bulk copy
// engine, in this thread's bulk group (bulk_store_commit); the thread does not wait for it.
// Shared memory written by plain stores needs fence_async_shared before it.
__device__ __forceinline__ void bulk_store_to_global(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until this thread's committed bulk stores have read their shared memory (not until
// their writes are visible): after it the source may be reused or the block may end.
__device__ __forceinline__ void bulk_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

}  // namespace deepinfer::cuda
