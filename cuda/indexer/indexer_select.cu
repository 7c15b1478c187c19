// The indexer's selection kernel, one block per token: an exact radix select of the top
// min(top_k, slots) scores, then a rank sort of the chosen (score, slot) pairs by score
// descending, slot ascending; the outputs are the slots' entries (or blocks), which ascend with
// the slots, so ties go to the lower index. The token's scores are copied into shared memory
// when a scores row fits there; otherwise the same code reads them from the global scratch row.
// Scores compare as floats (the CPU's order): the scoring kernel turned NaN into -inf and -0 into
// +0.
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

namespace {

// A float's bits mapped so that unsigned order is float order (for non-NaN values).
__device__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (score, index) packed so that a larger value ranks first: score descending, index ascending.
__device__ uint64_t pack_pair(uint32_t key, int64_t j) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}

// One block per token: the top k = min(top_k, n) of the token's n slot scores.
//  1. Radix select (8 bits per pass, most significant first) finds the k-th largest key `thr`
//     and how many keys equal to it are taken (`take_eq`, the lowest indices among them).
//  2. Every key > thr and the first take_eq keys == thr (in index order, by a block scan) are
//     packed into `buf`.
//  3. A rank sort writes them out by score descending, then index ascending.
__global__ void __launch_bounds__(kSelectThreads, 2)
    indexer_select_kernel(SelectArgs a, DeviceLayout l) {
  enter_dependent_grid();
  extern __shared__ float4 smem4[];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int nthreads = blockDim.x;
  const int g = static_cast<int>(blockIdx.x);
  const int t = a.token0 + g;
  uint64_t* buf = reinterpret_cast<uint64_t*>(smem4);         // [cap]
  uint32_t* hist = reinterpret_cast<uint32_t*>(buf + a.cap);  // [256]
  int* misc = reinterpret_cast<int*>(hist + 256);  // [0, 32): scan; 32, 33: select; 34: count
  float* scores_smem = reinterpret_cast<float*>(misc + 40);

  const int64_t n = select_slots(a, l, g);
  const int k = static_cast<int>(n < a.top_k ? n : a.top_k);
  int32_t* out = a.out + static_cast<int64_t>(t) * a.top_k;
  if (k == 0) {
    for (int i = tid; i < a.top_k; i += nthreads) out[i] = -1;
    return;
  }
  const float* sc = a.scores + static_cast<int64_t>(g) * a.row;
  if (a.scores_in_smem) {
    for (int64_t i = tid; i < n; i += nthreads) cp_async_4(scores_smem + i, sc + i);
    cp_async_wait_all();
    sc = scores_smem;
  }
  if (tid == 0) misc[34] = 0;
  __syncthreads();

  // 1. Radix select. Invariant: `remaining` (>= 1) of the keys matching `prefix` under `mask`
  //    are still to be taken, and at least that many match.
  uint32_t thr = 0;  // with k == n every key is taken: order_key of a non-NaN is never 0
  int take_eq = 0;
  if (k < n) {
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += nthreads) hist[i] = 0;
      __syncthreads();
      // Four keys per thread per step, loaded together (the scores may be in global memory).
      for (int64_t base = 0; base < n; base += 4 * nthreads) {
        int bins[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t i = base + u * nthreads + tid;
          bins[u] = 256;  // none
          if (i < n) {
            const uint32_t key = order_key(sc[i]);
            if ((key & mask) == prefix) bins[u] = static_cast<int>((key >> shift) & 0xffu);
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          // One atomic per distinct bin of the warp: many keys often share the top bits.
          const unsigned peers = __match_any_sync(kFullMask, bins[u]);
          if (bins[u] < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bins[u]], __popc(peers));
        }
      }
      __syncthreads();
      if (warp == 0) radix_select_bin(hist, remaining, misc + 32);
      __syncthreads();
      prefix |= static_cast<uint32_t>(misc[32]) << shift;
      mask |= 0xffu << shift;
      remaining = misc[33];
      // misc[32..33] are rewritten only after the next pass's two barriers.
    }
    thr = prefix;
    take_eq = remaining;
  }

  // 2. Collect. Thread tid owns the contiguous range [lo, hi) so that equal keys are ranked in
  //    index order by one block scan.
  const int64_t seg = (n + nthreads - 1) / nthreads;
  const int64_t lo = min(n, seg * tid);
  const int64_t hi = min(n, lo + seg);
  int eq = 0;
  if (take_eq > 0) {
    for (int64_t i = lo; i < hi; ++i) eq += order_key(sc[i]) == thr;
  }
  int eq_before = block_exclusive_scan(eq, misc);
  for (int64_t i = lo; i < hi; ++i) {
    const uint32_t key = order_key(sc[i]);
    bool take = key > thr;
    if (key == thr && eq_before < take_eq) {
      take = true;
      ++eq_before;
    }
    if (take) buf[atomicAdd(&misc[34], 1)] = pack_pair(key, i);
  }
  __syncthreads();

  // 3. Rank sort: the k packed pairs are distinct (distinct indices), so the number of pairs
  //    ranking above a pair is its output column. The loop over j reads the same buf[j] in
  //    every thread (a broadcast); O(k^2 / threads) comparisons, no barriers.
  for (int i = tid; i < k; i += nthreads) {
    const uint64_t mine = buf[i];
    int rank = 0;
#pragma unroll 4
    for (int j = 0; j < k; ++j) rank += buf[j] > mine;
    const auto slot = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(mine));
    out[rank] = static_cast<int32_t>(slot_entry(a.list, g, slot));
  }
  for (int i = k + tid; i < a.top_k; i += nthreads) out[i] = -1;
}

}  // namespace

void launch_indexer_select(const SelectArgs& a, const DeviceLayout& l, int64_t n, size_t smem,
                           KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream) {
  smem_limits.allow(indexer_select_kernel, smem);
  launch_programmatic("indexer select", dim3(static_cast<unsigned>(n)), dim3(kSelectThreads), smem,
                      stream, pdl, indexer_select_kernel, a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer select");
}

}  // namespace deepinfer::cuda
