// The indexer's split selection (indexer_launch.h says the three steps): the same set and order
// as the one-block kernel (indexer_select.cu), with one token's keys read by many blocks, so that
// a decode batch of a few long rows uses the whole GPU instead of one SM per row.
// Keys and (key, slot) pairs are those of indexer_select.cu: a float's bits mapped so that
// unsigned order is float order, and the slot stored inverted below them, so that the larger pair
// has the larger score or, at equal scores, the lower slot.
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

namespace {

constexpr int kBinShift = 32 - kSplitBinBits;
constexpr int kBinsPerThread = kSplitBins / kSplitThreads;
static_assert(kSplitBins % kSplitThreads == 0);

__device__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ uint64_t pack_pair(uint32_t key, int64_t j) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}

// The token's k: nothing to rank when k is 0 or every slot is taken (k == n).
struct TokenRow {
  int64_t n;
  int k;
};

__device__ TokenRow token_row(const SelectArgs& s, const DeviceLayout& l, int g) {
  const int64_t n = select_slots(s, l, g);
  return {n, static_cast<int>(n < s.top_k ? n : s.top_k)};
}

// Step 1, grid (token of the group, split): the token's histogram of key bins.
__global__ void __launch_bounds__(kSplitThreads)
    indexer_select_hist_kernel(SplitSelectArgs a, DeviceLayout l) {
  enter_dependent_grid();
  __shared__ uint32_t hist[kSplitBins];
  const int g = static_cast<int>(blockIdx.x);
  const TokenRow r = token_row(a.s, l, g);
  if (r.k == 0 || r.k == r.n) return;  // step 2 takes every slot without a threshold
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  for (int b = tid; b < kSplitBins; b += kSplitThreads) hist[b] = 0;
  __syncthreads();
  const float* sc = a.s.scores + static_cast<int64_t>(g) * a.s.row;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kSplitThreads;
  // The loop's trip count is the block's, so that every lane takes part in __match_any_sync.
  for (int64_t base = static_cast<int64_t>(blockIdx.y) * kSplitThreads; base < r.n; base += step) {
    const int64_t i = base + tid;
    const int bin = i < r.n ? static_cast<int>(order_key(sc[i]) >> kBinShift) : kSplitBins;
    // One atomic per distinct bin of the warp: neighbouring scores often share their top bits.
    const unsigned peers = __match_any_sync(kFullMask, bin);
    if (bin < kSplitBins && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
  }
  __syncthreads();
  uint32_t* global = a.hist + static_cast<int64_t>(g) * (kSplitBins + 1);
  for (int b = tid; b < kSplitBins; b += kSplitThreads) {
    if (hist[b] != 0) atomicAdd(&global[b], hist[b]);
  }
}

// Step 2, grid (token of the group, split): the threshold bin (the highest bin b with at least k
// keys in bins >= b), then the pairs of every key in bin b or above.
__global__ void __launch_bounds__(kSplitThreads)
    indexer_select_collect_kernel(SplitSelectArgs a, DeviceLayout l) {
  enter_dependent_grid();
  __shared__ int warp_sums[32];
  __shared__ uint32_t threshold_bin;
  const int g = static_cast<int>(blockIdx.x);
  const TokenRow r = token_row(a.s, l, g);
  if (r.k == 0) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  uint32_t* hist = a.hist + static_cast<int64_t>(g) * (kSplitBins + 1);
  uint32_t min_bin = 0;  // k == n: every key
  if (r.k < r.n) {
    // Thread tid owns kBinsPerThread bins from the top down; counts accumulate from the top bin.
    const int top = kSplitBins - 1 - kBinsPerThread * tid;
    int local = 0;
    for (int q = 0; q < kBinsPerThread; ++q) local += static_cast<int>(hist[top - q]);
    const int before = block_exclusive_scan(local, warp_sums);
    // The histogram holds all n > k keys, so exactly one thread's bins reach k.
    if (before < r.k && before + local >= r.k) {
      int cum = before;
      for (int q = 0; q < kBinsPerThread; ++q) {
        cum += static_cast<int>(hist[top - q]);
        if (cum >= r.k) {
          threshold_bin = static_cast<uint32_t>(top - q);
          break;
        }
      }
    }
    __syncthreads();
    min_bin = threshold_bin;
  }
  const float* sc = a.s.scores + static_cast<int64_t>(g) * a.s.row;
  uint64_t* pairs = a.pairs + static_cast<int64_t>(g) * a.s.row;
  uint32_t* count = hist + kSplitBins;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kSplitThreads;
  for (int64_t base = static_cast<int64_t>(blockIdx.y) * kSplitThreads; base < r.n; base += step) {
    const int64_t i = base + tid;
    uint32_t key = 0;
    bool take = false;
    if (i < r.n) {
      key = order_key(sc[i]);
      take = (key >> kBinShift) >= min_bin;
    }
    // One atomic per warp for the warp's pairs.
    const unsigned taken = __ballot_sync(kFullMask, take);
    if (taken == 0) continue;
    uint32_t first = 0;
    if (lane == 0) first = atomicAdd(count, static_cast<uint32_t>(__popc(taken)));
    first = __shfl_sync(kFullMask, first, 0);
    if (take) pairs[first + __popc(taken & ((1u << lane) - 1u))] = pack_pair(key, i);
  }
}

// Step 3, one block of kSelectThreads per token of the group: the top k of the token's m pairs
// by a radix select over their 64 bits (8 per pass, most significant first), then the rank sort.
__global__ void __launch_bounds__(kSelectThreads)
    indexer_select_final_kernel(SplitSelectArgs a, DeviceLayout l) {
  enter_dependent_grid();
  extern __shared__ float4 smem4[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int nthreads = static_cast<int>(blockDim.x);
  const int g = static_cast<int>(blockIdx.x);
  const SelectArgs& s = a.s;
  uint64_t* buf = reinterpret_cast<uint64_t*>(smem4);  // [cap]: the chosen pairs
  uint64_t* pairs_smem = buf + s.cap;                  // [smem_pairs]
  uint32_t* hist = reinterpret_cast<uint32_t*>(pairs_smem + a.smem_pairs);  // [256]
  int* misc = reinterpret_cast<int*>(hist + 256);  // 32, 33: select; 34: chosen count

  const TokenRow r = token_row(s, l, g);
  int32_t* out = s.out + static_cast<int64_t>(s.token0 + g) * s.top_k;
  if (r.k == 0) {
    for (int i = tid; i < s.top_k; i += nthreads) out[i] = -1;
    return;
  }
  const int64_t m = a.hist[static_cast<int64_t>(g) * (kSplitBins + 1) + kSplitBins];
  const uint64_t* pairs = a.pairs + static_cast<int64_t>(g) * s.row;
  if (m <= a.smem_pairs) {
    for (int64_t i = tid; i < m; i += nthreads) pairs_smem[i] = pairs[i];
    pairs = pairs_smem;
  }
  if (tid == 0) misc[34] = 0;
  __syncthreads();

  // Invariant: `remaining` (>= 1) of the pairs matching `prefix` under `mask` are still to be
  // taken, and at least that many match. Pairs are distinct, so after the last pass exactly one
  // matches: the k-th largest.
  uint64_t threshold = 0;  // with m == k every pair is taken; a pair is never 0
  if (m > r.k) {
    uint64_t prefix = 0, mask = 0;
    int remaining = r.k;
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += nthreads) hist[i] = 0;
      __syncthreads();
      for (int64_t i = tid; i < m; i += nthreads) {
        const uint64_t v = pairs[i];
        if ((v & mask) == prefix) atomicAdd(&hist[(v >> shift) & 0xffu], 1u);
      }
      __syncthreads();
      if (warp == 0) radix_select_bin(hist, remaining, misc + 32);
      __syncthreads();
      prefix |= static_cast<uint64_t>(misc[32]) << shift;
      mask |= uint64_t{0xff} << shift;
      remaining = misc[33];
      // misc[32..33] are rewritten only after the next pass's two barriers.
    }
    threshold = prefix;
  }

  // Exactly k pairs are >= threshold (distinct pairs).
  for (int64_t i = tid; i < m; i += nthreads) {
    const uint64_t v = pairs[i];
    if (v >= threshold) buf[atomicAdd(&misc[34], 1)] = v;
  }
  __syncthreads();

  // Rank sort, as indexer_select.cu: the number of chosen pairs above a pair is its column.
  for (int i = tid; i < r.k; i += nthreads) {
    const uint64_t mine = buf[i];
    int rank = 0;
#pragma unroll 4
    for (int j = 0; j < r.k; ++j) rank += buf[j] > mine;
    const auto slot = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(mine));
    out[rank] = static_cast<int32_t>(slot_entry(s.list, g, slot));
  }
  for (int i = r.k + tid; i < s.top_k; i += nthreads) out[i] = -1;
}

}  // namespace

void launch_indexer_select_split(const SplitSelectArgs& a, const DeviceLayout& l, int64_t n,
                                 int64_t splits, size_t final_smem, KernelSmemLimits& smem_limits,
                                 bool pdl, cudaStream_t stream) {
  DEEPINFER_CUDA_CHECK(cudaMemsetAsync(
      a.hist, 0, static_cast<size_t>(n) * (kSplitBins + 1) * sizeof(uint32_t), stream));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  const dim3 block(kSplitThreads);
  launch_programmatic("indexer select histogram", grid, block, 0, stream, pdl,
                      indexer_select_hist_kernel, a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer select histogram");
  launch_programmatic("indexer select collect", grid, block, 0, stream, pdl,
                      indexer_select_collect_kernel, a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer select collect");
  smem_limits.allow(indexer_select_final_kernel, final_smem);
  launch_programmatic("indexer select final", dim3(static_cast<unsigned>(n)), dim3(kSelectThreads),
                      final_smem, stream, pdl, indexer_select_final_kernel, a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer select final");
}

}  // namespace deepinfer::cuda
