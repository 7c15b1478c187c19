// The V4.1 candidate-block kernels of the indexer (docs/model.md#v41-ops), between its score and
// select kernels:
//  - indexer_block_max_kernel (indexer_candidates): a block of block_entries entries scores the
//    max of its visible entries' scores, so that the select kernel ranks blocks;
//  - indexer_candidate_list_kernel (indexer_topk_in_candidates): a token's candidate block ids,
//    deduplicated and sorted through a bitmap, with the number of visible entries they hold
//    (the CandidateList the score and select kernels walk).
#include <cstdint>

#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

namespace {

// Grid (token of the group, split); thread = block c of the token's visible entries. The scores
// are never NaN and never -0 (the score kernel maps those), so fmaxf is the CPU's fmax order.
__global__ void __launch_bounds__(kBlocksThreads)
    indexer_block_max_kernel(BlockMaxArgs a, DeviceLayout l) {
  enter_dependent_grid();
  const int g = static_cast<int>(blockIdx.x);
  const int t = a.token0 + g;
  const int64_t visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t blocks = (visible + a.block_entries - 1) / a.block_entries;
  const float* sc = a.scores + static_cast<int64_t>(g) * a.entry_row;
  float* out = a.block_scores + static_cast<int64_t>(g) * a.block_row;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < blocks;
       c += step) {
    const int64_t first = c * a.block_entries;
    const int64_t last = min(visible, first + a.block_entries);
    float mx = sc[first];
    for (int64_t j = first + 1; j < last; ++j) mx = fmaxf(mx, sc[j]);
    out[c] = mx;
  }
}

// One block per token of the group. Marks the token's candidate blocks that hold visible entries
// in a bitmap (a repeated block once; ids that are negative or past the visible blocks are not
// candidates: the CPU op rejects the former, and the latter hold no visible entry), then writes
// the marked ids in ascending order and counts their visible entries.
__global__ void __launch_bounds__(kBlocksThreads)
    indexer_candidate_list_kernel(CandidateListArgs a, DeviceLayout l) {
  enter_dependent_grid();
  extern __shared__ uint32_t smem_bits[];
  __shared__ int scan[32];
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int g = static_cast<int>(blockIdx.x);
  const int t = a.token0 + g;
  const int64_t visible = visible_entries(l.positions[t], a.ratio, a.bound);
  const int64_t blocks = (visible + a.block_entries - 1) / a.block_entries;
  const int64_t words = (blocks + 31) / 32;
  uint32_t* bits = a.bitmap != nullptr ? a.bitmap + static_cast<int64_t>(g) * a.words : smem_bits;
  for (int64_t w = tid; w < words; w += nthreads) bits[w] = 0;
  __syncthreads();
  const int32_t* cand = a.candidates + static_cast<int64_t>(t) * a.kb;
  for (int64_t i = tid; i < a.kb; i += nthreads) {
    const int64_t c = cand[i];
    if (c >= 0 && c < blocks) atomicOr(&bits[c / 32], 1u << (c % 32));
  }
  __syncthreads();
  // Thread tid owns the contiguous words [lo, hi), so a block scan of the counts orders the ids.
  const int64_t seg = (words + nthreads - 1) / nthreads;
  const int64_t lo = min(words, seg * tid);
  const int64_t hi = min(words, lo + seg);
  int marked = 0;
  for (int64_t w = lo; w < hi; ++w) marked += __popc(bits[w]);
  int next = block_exclusive_scan(marked, scan);
  int32_t* list = a.blocks + static_cast<int64_t>(g) * a.kb;
  int entries = 0;  // <= bound < 2^31
  for (int64_t w = lo; w < hi; ++w) {
    for (uint32_t m = bits[w]; m != 0; m &= m - 1) {
      const int64_t c = w * 32 + (__ffs(static_cast<int>(m)) - 1);
      list[next++] = static_cast<int32_t>(c);
      entries += static_cast<int>(
          min(static_cast<int64_t>(a.block_entries), visible - c * a.block_entries));
    }
  }
  entries = block_sum(entries);
  if (tid == 0) a.counts[g] = entries;
}

}  // namespace

void launch_indexer_block_max(const BlockMaxArgs& a, const DeviceLayout& l, int64_t n,
                              int64_t splits, bool pdl, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(splits));
  launch_programmatic("indexer_candidates", grid, dim3(kBlocksThreads), 0, stream, pdl,
                      indexer_block_max_kernel, a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_candidates");
}

void launch_indexer_candidate_list(const CandidateListArgs& a, const DeviceLayout& l, int64_t n,
                                   size_t smem, KernelSmemLimits& smem_limits, bool pdl,
                                   cudaStream_t stream) {
  smem_limits.allow(indexer_candidate_list_kernel, smem);
  launch_programmatic("indexer_topk_in_candidates", dim3(static_cast<unsigned>(n)),
                      dim3(kBlocksThreads), smem, stream, pdl, indexer_candidate_list_kernel, a, l);
  DEEPINFER_CUDA_LAUNCH_CHECK("indexer_topk_in_candidates");
}

}  // namespace deepinfer::cuda
