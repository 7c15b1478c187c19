// PTX wrappers for instructions of sm_80 and later (built here for sm_90a and sm_100a):
// cp.async copies, ldmatrix, mma.sync m16n8k16 on bf16 and f16 and named barriers. Fragment layouts
// are the PTX ISA's (A row-major 16x16, B "col" 16x8, C 16x8 f32: c0, c1 in row lane/4 and c2, c3
// in row lane/4 + 8, columns 2(lane%4) + {0, 1}).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async -----------------------------------------------------------------------------------
//
// Asynchronous global -> shared copies: a thread issues all its copies back to back and waits
// once, so a tile's loads are in flight together instead of one latency each.

// 16 bytes global -> shared, bypassing L1 (.cg); completes with the thread's cp_async groups.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem)
               : "memory");
}

// cp_async_16 that also has L2 fetch the kPrefetch-byte (128 or 256) aligned block around the
// source: a stream read 64 bytes per row at a time then reaches DRAM in whole lines, the rest
// of each line waiting in L2 for the next copies.
template <int kPrefetch>
__device__ __forceinline__ void cp_async_16_prefetch(void* smem, const void* gmem) {
  static_assert(kPrefetch == 128 || kPrefetch == 256, "L2 prefetch sizes of cp.async");
  if constexpr (kPrefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem_addr(smem)),
                 "l"(gmem)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr(smem)),
                 "l"(gmem)
                 : "memory");
  }
}

// cp_async_16_prefetch<256> of a row that may be masked: with `real` false no byte is read and
// the 16 shared bytes are zero-filled (src-size 0), so a masked key costs no branch and its
// zeros land with the thread's other copies (gmem must still be a valid address to form).
__device__ __forceinline__ void cp_async_16_zfill_l2_256(void* smem, const void* gmem, bool real) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(real ? 16 : 0)
               : "memory");
}

// 8 bytes global -> shared through L1 (.ca; .cg takes only 16).
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(smem)), "l"(gmem)
               : "memory");
}

// 4 bytes global -> shared through L1 (.ca).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Waits for all of this thread's copies; a __syncthreads() after it publishes them to the block.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Asks L2 to fetch the line holding global address `gmem` (no register, no completion): a load
// issued a while later finds it there instead of waiting for DRAM.
__device__ __forceinline__ void prefetch_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}

// ---- ldmatrix and mma.sync ----------------------------------------------------------------------

// Four 8x8 b16 matrices; lanes 8i .. 8i+7 give the row addresses of matrix i, and lane l gets
// row l/4, columns 2(l%4), 2(l%4)+1 of each matrix (of its transpose with .trans).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a b for a 16x16 bf16 A (row), a 16x8 bf16 B (col) and a 16x8 f32 C.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a b as mma_bf16, for f16 A and B.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- named barriers -----------------------------------------------------------------------------

// Barrier `id` (1..15; 0 is __syncthreads) over kThreads threads (a multiple of 32).
template <int kThreads>
__device__ __forceinline__ void named_barrier(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// The same over a count known at run time (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` over kThreads threads without waiting (the producer side of a
// producer / consumer pair: the consumers bar.sync the same id with the same count).
template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

}  // namespace deepinfer::cuda
