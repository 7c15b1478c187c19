// PTX wrappers for thread-block clusters (sm_90+) that a kernel sharing shared-memory tiles
// between the blocks of a cluster needs: the block's rank, the split cluster barrier
// (barrier.cluster.arrive / wait, so that independent work can run between the two), the
// mapping of a shared-memory address to the same address in another block of the cluster
// (mapa), asynchronous stores through that mapping (distributed shared memory) that complete on
// an mbarrier of the block that owns the memory, and mbarrier arrivals, local or remote.
//
// Every block of a cluster must execute the same sequence of cluster barriers: one that skips a
// barrier leaves the others waiting forever. The .aligned forms need the whole warp converged.
//
// Built for targets before sm_90 these trap (the host never launches a clustered kernel there).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DEEPINFER_CLUSTER_PTX(...) asm volatile(__VA_ARGS__)
#else
#define DEEPINFER_CLUSTER_PTX(...) __trap()
#endif

// The block's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_block_rank() {
  uint32_t rank = 0;
  DEEPINFER_CLUSTER_PTX("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// The thread arrives at the cluster barrier without ordering its memory accesses (the start
// rendezvous: nothing written yet).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  DEEPINFER_CLUSTER_PTX("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// The thread arrives with release semantics at cluster scope: its earlier stores, to its own
// block's shared memory or another's, happen before the accesses of threads past the wait.
__device__ __forceinline__ void cluster_arrive_release() {
  DEEPINFER_CLUSTER_PTX("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

// Waits until every thread of every block of the cluster has arrived (acquire).
__device__ __forceinline__ void cluster_wait_acquire() {
  DEEPINFER_CLUSTER_PTX("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of shared-memory address `addr` (smem_addr's) in the block of rank
// `rank`: the same offset in that block's shared memory.
__device__ __forceinline__ uint32_t map_shared_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t mapped = 0;
  DEEPINFER_CLUSTER_PTX("mapa.shared::cluster.u32 %0, %1, %2;\n"
                        : "=r"(mapped)
                        : "r"(addr), "r"(rank));
  return mapped;
}

// Asynchronous stores into another block's shared memory (st.async, distributed shared memory),
// 16 and 4 bytes at shared::cluster address `addr` (map_shared_to_rank's), each completing its
// bytes as transactions of the mbarrier at `bar`, which must live in the same block as `addr`:
// a thread waiting on that mbarrier's phase sees the bytes, so the storing thread needs neither
// a fence nor a remote arrival (the owning block's producer arms the phase with
// mbarrier_arrive_expect_tx_at). The stores are fire-and-forget: nothing here waits for them.
__device__ __forceinline__ void st_async_16(uint32_t addr, uint4 v, uint32_t bar) {
  DEEPINFER_CLUSTER_PTX(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(addr),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void st_async_4(uint32_t addr, uint32_t v, uint32_t bar) {
  DEEPINFER_CLUSTER_PTX(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
      "r"(v), "r"(bar)
      : "memory");
}

// One arrival on this block's mbarrier at shared-memory address `addr` (smem_addr's), release
// at CTA scope; with `tx_bytes` > 0 it also adds that many bytes to the transactions the phase
// waits for (the peer's st_async_* stores into this block, which may land before or after it:
// the phase completes once every arrival is in and the count is back at zero).
__device__ __forceinline__ void mbarrier_arrive_expect_tx_at(uint32_t addr, uint32_t tx_bytes) {
  DEEPINFER_CLUSTER_PTX(
      "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr),
      "r"(tx_bytes)
      : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_at(uint32_t addr) {
  DEEPINFER_CLUSTER_PTX("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(addr)
                        : "memory");
}

// One arrival on the mbarrier at shared::cluster address `addr` (map_shared_to_rank's: this
// block's own or a peer's) with the default semantics (release at CTA scope), as CUTLASS's
// cluster pipelines release a consumed stage to its producers: for a consumer whose reads of the
// stage have completed (wgmma.wait_group), so it only says "done" and orders nothing across
// blocks.
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t addr) {
  DEEPINFER_CLUSTER_PTX("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
}

// Blocks until the phase of parity `parity` of this block's mbarrier at shared-memory address
// `addr` (smem_addr's) has completed, with acquire semantics at cluster scope (the arrivals may
// come from the peer blocks).
__device__ __forceinline__ void mbarrier_wait_cluster(uint32_t addr, uint32_t parity) {
  DEEPINFER_CLUSTER_PTX(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

#undef DEEPINFER_CLUSTER_PTX

}  // namespace deepinfer::cuda
