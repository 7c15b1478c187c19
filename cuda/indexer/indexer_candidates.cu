// V4.1's candidate blocks on the CUDA backend (docs/model.md#v41-ops): indexer_candidates and
// indexer_topk_in_candidates, matching the CPU reference ops
// (cpp/src/backend/cpu_ops_attention.cpp) on the same inputs. They are the lightning indexer's
// score and select kernels (indexer_topk.cu) over other slots (indexer_launch.h):
//  - indexer_candidates scores every visible entry, reduces each block of block_entries entries
//    to its max (indexer_blocks.cu) and selects the top blocks;
//  - indexer_topk_in_candidates first lists each token's distinct visible candidate blocks in
//    ascending order (indexer_blocks.cu), then scores only their entries and selects among them,
//    so that the restriction saves the scoring of every other entry.
// Both give sets with the CPU's tie rule (lower index first), in the CPU's order. Every
// per-token quantity is computed on the device; the host sizes grids and scratch from shapes
// and layout.max_blocks_per_seq, so no op waits for the stream and both can be captured.
// indexer_candidates' entry scores are indexer_topk's (tensor cores for bf16 and fp8 keys where
// indexer_heuristics.h chooses them); the candidate entries of indexer_topk_in_candidates are
// scored by the CUDA-core kernel, which reads a candidate list.
//
// Content errors cannot be raised without a host sync. Where the CPU ops throw, these kernels
// behave as indexer_topk does (indexer_topk.cu), and a candidate block id below -1 is no
// candidate.
#include <algorithm>
#include <cstdint>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/indexer/indexer_args.h"
#include "cuda/indexer/indexer_heuristics.h"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

Tensor CudaBackend::indexer_candidates_impl(const Tensor& q, const Tensor& weights,
                                            const Tensor& index_cache, const BatchLayout& layout,
                                            int ratio, int block_entries, int top_blocks,
                                            float score_scale, float weight_scale) {
  const char* op = "indexer_candidates";
  const int64_t tokens = layout.num_tokens;
  Tensor out = empty({tokens, top_blocks}, DType::kI32);
  if (tokens == 0 || top_blocks == 0) return out;
  const int64_t bound = indexer_bound(layout, ratio);
  if (bound == 0 || index_cache.size(0) == 0) {
    // No entry is addressable: every row is all -1.
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0xff, out.nbytes(), stream()));
    return out;
  }
  const Tensor q_values = indexer_q_values(*this, q);
  ScoreArgs sa = indexer_score_args(op, q_values, weights, index_cache, layout, ratio, score_scale,
                                    weight_scale);
  sa.q_fp8 = q.dtype() == DType::kF8E4M3;
  const int64_t block_row = (bound + block_entries - 1) / block_entries;
  const IndexerProblem p{tokens,
                         q.size(1),
                         q.size(2),
                         top_blocks,
                         /*scored=*/bound,
                         /*selected=*/block_row,
                         /*scratch_bytes=*/(bound + block_row) * int64_t{sizeof(float)},
                         sa.key.format,
                         /*listed=*/false};
  const size_t smem_max = max_shared_memory_per_block();
  const IndexerConfig c = choose_indexer(p, num_sms(), smem_max, IndexerScoreKernel::kAuto,
                                         IndexerSelectKernel::kAuto, indexer_wgmma_choice(*this));
  require_indexer_fits(op, c, q, top_blocks, smem_max);

  Tensor scores = scratch(static_cast<size_t>(c.group * bound) * sizeof(float));
  Tensor block_scores = scratch(static_cast<size_t>(c.group * block_row) * sizeof(float));
  const SelectScratch select_scratch = indexer_select_scratch(*this, c, block_row);
  const DeviceLayout dl = device_layout(layout);
  sa.scores = reinterpret_cast<float*>(scores.raw_data());
  BlockMaxArgs bm{};
  bm.scores = sa.scores;
  bm.block_scores = reinterpret_cast<float*>(block_scores.raw_data());
  bm.entry_row = bound;
  bm.block_row = block_row;
  bm.bound = bound;
  bm.ratio = ratio;
  bm.block_entries = block_entries;
  SelectArgs se = indexer_select_args(bm.block_scores, out.data<int32_t>(), block_row, bound, c,
                                      block_entries, top_blocks, ratio);
  for (int64_t t0 = 0; t0 < tokens; t0 += c.group) {
    const int64_t n = std::min(c.group, tokens - t0);
    sa.token0 = bm.token0 = se.token0 = static_cast<int>(t0);
    launch_indexer_scores(sa, c, dl, n, smem_limits(), pdl(), stream());
    launch_indexer_block_max(bm, dl, n, block_max_splits(n, block_row, num_sms()), pdl(), stream());
    launch_indexer_selection(se, c, select_scratch, dl, n, smem_limits(), pdl(), stream());
  }
  return out;
}

Tensor CudaBackend::indexer_topk_in_candidates_impl(const Tensor& q, const Tensor& weights,
                                                    const Tensor& index_cache,
                                                    const BatchLayout& layout, int ratio,
                                                    const Tensor& candidates, int block_entries,
                                                    int top_k, float score_scale,
                                                    float weight_scale) {
  const char* op = "indexer_topk_in_candidates";
  const int64_t tokens = layout.num_tokens;
  const int64_t kb = candidates.size(1);
  Tensor out = empty({tokens, top_k}, DType::kI32);
  if (tokens == 0 || top_k == 0) return out;
  const int64_t bound = indexer_bound(layout, ratio);
  if (bound == 0 || index_cache.size(0) == 0 || kb == 0) {
    // No entry is addressable, or none is a candidate: every row is all -1.
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0xff, out.nbytes(), stream()));
    return out;
  }
  const Tensor q_values = indexer_q_values(*this, q);
  ScoreArgs sa = indexer_score_args(op, q_values, weights, index_cache, layout, ratio, score_scale,
                                    weight_scale);
  sa.q_fp8 = q.dtype() == DType::kF8E4M3;
  // A token's slots: at most kb blocks of block_entries entries, and at most its bound.
  const int64_t row = std::min(bound, kb * block_entries);
  const int64_t words = ((bound + block_entries - 1) / block_entries + 31) / 32;
  const size_t smem_max = max_shared_memory_per_block();
  const bool bitmap_in_smem = candidate_bitmap_in_smem(words, smem_max);
  const int64_t scratch_bytes =
      (row + kb + 1 + (bitmap_in_smem ? 0 : words)) * int64_t{sizeof(int32_t)};
  const IndexerProblem p{tokens, q.size(1),     q.size(2),     top_k,          row,
                         row,    scratch_bytes, sa.key.format, /*listed=*/true};
  const IndexerConfig c = choose_indexer(p, num_sms(), smem_max);
  require_indexer_fits(op, c, q, top_k, smem_max);

  Tensor scores = scratch(static_cast<size_t>(c.group * row) * sizeof(float));
  Tensor lists = scratch(static_cast<size_t>(c.group * (kb + 1)) * sizeof(int32_t));
  Tensor bitmap;
  if (!bitmap_in_smem) bitmap = scratch(static_cast<size_t>(c.group * words) * sizeof(uint32_t));
  const SelectScratch select_scratch = indexer_select_scratch(*this, c, row);
  const DeviceLayout dl = device_layout(layout);
  CandidateListArgs cl{};
  cl.candidates = candidates.data<int32_t>();
  cl.blocks = reinterpret_cast<int32_t*>(lists.raw_data());
  cl.counts = cl.blocks + c.group * kb;
  cl.bitmap = bitmap_in_smem ? nullptr : reinterpret_cast<uint32_t*>(bitmap.raw_data());
  cl.kb = kb;
  cl.words = words;
  cl.bound = bound;
  cl.ratio = ratio;
  cl.block_entries = block_entries;
  const size_t list_smem = bitmap_in_smem ? static_cast<size_t>(words) * sizeof(uint32_t) : 0;
  const CandidateList list{cl.blocks, cl.counts, kb, block_entries};
  sa.scores = reinterpret_cast<float*>(scores.raw_data());
  sa.row = row;
  sa.list = list;
  SelectArgs se =
      indexer_select_args(sa.scores, out.data<int32_t>(), row, bound, c, 1, top_k, ratio, list);
  for (int64_t t0 = 0; t0 < tokens; t0 += c.group) {
    const int64_t n = std::min(c.group, tokens - t0);
    cl.token0 = sa.token0 = se.token0 = static_cast<int>(t0);
    launch_indexer_candidate_list(cl, dl, n, list_smem, smem_limits(), pdl(), stream());
    launch_indexer_scores(sa, c, dl, n, smem_limits(), pdl(), stream());
    launch_indexer_selection(se, c, select_scratch, dl, n, smem_limits(), pdl(), stream());
  }
  return out;
}

}  // namespace deepinfer::cuda
