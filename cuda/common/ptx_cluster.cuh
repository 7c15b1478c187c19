// PTX wrappers for thread-block clusters (sm_90+) that a kernel sharing shared-memory tiles
// between the blocks of a cluster needs: the block's rank, the split cluster barrier
// (barrier.cluster.arrive / wait, so that independent work can run between the two), the
// mapping of a shared-memory address to the same address in another block of the cluster
// (mapa), stores through that mapping (distributed shared memory) and the proxy fence that makes
// such stores visible to the async proxy (wgmma, TMA) of the block that owns the memory.
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

// Stores to a shared::cluster address (map_shared_to_rank's), 16, 8 and 4 bytes.
__device__ __forceinline__ void st_cluster_16(uint32_t addr, uint4 v) {
  DEEPINFER_CLUSTER_PTX("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x),
                        "r"(v.y), "r"(v.z), "r"(v.w)
                        : "memory");
}
__device__ __forceinline__ void st_cluster_8(uint32_t addr, uint2 v) {
  DEEPINFER_CLUSTER_PTX("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(v.x),
                        "r"(v.y)
                        : "memory");
}
__device__ __forceinline__ void st_cluster_4(uint32_t addr, uint32_t v) {
  DEEPINFER_CLUSTER_PTX("st.shared::cluster.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// fence.proxy.async over every state space: this thread's plain stores, to its own block's
// shared memory or through map_shared_to_rank to another's, become visible to the async proxy
// (a later cluster barrier publishes them to the owning block's wgmma). The unrestricted form:
// .shared::cluster would likely do, but whether it covers stores through the block's own
// (shared::cta) addresses is not spelled out, and the fence runs once per tile.
__device__ __forceinline__ void fence_async_all() {
  DEEPINFER_CLUSTER_PTX("fence.proxy.async;\n" ::: "memory");
}

// One arrival on the mbarrier at shared::cluster address `addr` (map_shared_to_rank's: this
// block's own or a peer's), with release semantics at cluster scope: this thread's earlier
// stores, local or remote, happen before the accesses of a thread whose wait sees the phase
// complete.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t addr) {
  DEEPINFER_CLUSTER_PTX("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(addr)
                        : "memory");
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
