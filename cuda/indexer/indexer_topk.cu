// The lightning indexer's top-k on the CUDA backend (docs/model.md#lightning-indexer), over the
// paged layout (docs/model.md#kv-and-state-layout). It matches the CPU reference op in
// cpp/src/backend/cpu_ops_attention.cpp on the same inputs. f32 keys are scored with f32 math
// (indexer_score.cu); bf16, fp8 and FP4 keys, exact in bf16 / f16, on tensor cores with q split
// into two parts (indexer_score_mma.cu says how close to f32 that is) where that kernel takes the
// shape, else as f32 too (indexer_heuristics.h chooses).
//
// Every per-token quantity (sequence, position, context length, visible entries) is computed in
// the kernels from the device BatchLayout; the host only sizes grids and scratch from metadata it
// knows (shapes, layout.max_blocks_per_seq), so no op waits for the stream.
//
// indexer_topk runs two kernels per group of tokens (indexer_heuristics.h sizes the groups so
// that the scratch stays under kScoreScratchBytes):
//  1. indexer_score_wgmma_pipelined.cu or indexer_score_wgmma.cu (fp8 keys at 64 heads on
//     sm_90), indexer_score_mma.cu or
//     indexer_score.cu, grid (token, split): score[t][j] of every
//     visible entry j into a scratch row of `bound` = max_blocks_per_seq * epb floats.
//  2. indexer_select_binned.cu where a row fits one block's shared memory: one wide block per
//     token, a histogram of the keys' top bits, then a radix select over the threshold bin's
//     keys only (a token of at most 1,024 slots sorts its whole row instead); else
//     indexer_select.cu, one block per token: an exact radix select of the top min(top_k, visible)
//     keys, then a rank sort by score descending, index ascending; or, for a few long rows,
//     indexer_select_split.cu: the same set and order with each token's keys read by several
//     blocks.
//
// Content errors cannot be raised without a host sync. Where the CPU op throws, these kernels
// stay inside their buffers and do the following instead:
//  - entries past the block table's columns (j >= max_blocks_per_seq * epb) are not visible.
//  - an entry whose block is negative or maps past the cache is scored -inf (it ranks last).
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/indexer/indexer_args.h"
#include "cuda/indexer/indexer_heuristics.h"
#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_options.h"

namespace deepinfer::cuda {

int64_t indexer_bound(const BatchLayout& layout, int ratio) {
  return static_cast<int64_t>(layout.max_blocks_per_seq) * (layout.block_size / ratio);
}

ScoreArgs indexer_score_args(const char* op, const Tensor& q, const Tensor& weights,
                             const Tensor& index_cache, const BatchLayout& layout, int ratio,
                             float score_scale, float weight_scale) {
  const int64_t dim = q.size(2);
  const int64_t bound = indexer_bound(layout, ratio);
  if (dim % 4 != 0) {
    throw Error(
        ErrorCode::kUnsupported,
        std::string(op) + ": the index head dim must be a multiple of 4, got " + q.describe());
  }
  if (bound > 0x7fffffff) fail(op, "layout.max_blocks_per_seq * entries per block overflows");
  check_vec4(op, "q", q);
  check_vec4(op, "index_cache", index_cache);
  ScoreArgs a{};
  if (q.dtype() == DType::kF8E4M3) {
    a.q_codes = static_cast<const uint8_t*>(q.raw_data());
    a.q_fp8 = true;
  } else {
    a.q = q.data<float>();
  }
  a.weights = weights.data<float>();
  a.cache = static_cast<const uint8_t*>(index_cache.raw_data());
  a.key = kv_row_format(index_cache.dtype(), dim, /*rope_dim=*/0);
  a.row = bound;
  a.bound = bound;
  a.cache_rows = index_cache.size(0);
  a.heads = static_cast<int>(q.size(1));
  a.dim = static_cast<int>(dim);
  a.ratio = ratio;
  a.epb = layout.block_size / ratio;
  a.score_scale = score_scale;
  a.weight_scale = weight_scale;
  return a;
}

void require_indexer_fits(const char* op, const IndexerConfig& c, const Tensor& q, int64_t top_k,
                          size_t max_smem) {
  if (c.fits) return;
  throw Error(ErrorCode::kUnsupported,
              std::string(op) + ": " + std::to_string(q.size(1)) + " heads of " +
                  std::to_string(q.size(2)) + " channels and top " + std::to_string(top_k) +
                  " need " + std::to_string(std::max(c.score_smem, c.select_min_smem)) +
                  " bytes of shared memory per block, the device has " + std::to_string(max_smem));
}

bool indexer_wgmma_runs(const CudaBackend& be) {
  // wgmma: sm_90 only (Blackwell has tcgen05 instead), and only a build with sm_90a code has it.
  return be.wgmma_device();
}

WgmmaChoice indexer_wgmma_choice(const CudaBackend& be) {
  const IndexerFp8Scores s = be.indexer_fp8_scores();
  const bool persistent = s == IndexerFp8Scores::kWgmmaPersistent ||
                          s == IndexerFp8Scores::kWgmmaPersistentCvt ||
                          s == IndexerFp8Scores::kWgmmaPersistentFp8;
  // The persistent choices keep the pipelined kernel for q in f32.
  return {indexer_wgmma_runs(be),
          s == IndexerFp8Scores::kWgmma || s == IndexerFp8Scores::kWgmmaPipelined || persistent,
          s == IndexerFp8Scores::kWgmmaPipelined || persistent,
          persistent,
          s == IndexerFp8Scores::kWgmmaPersistentCvt,
          s == IndexerFp8Scores::kWgmmaPersistentFp8};
}

void launch_indexer_scores(const ScoreArgs& a, const IndexerConfig& c, const DeviceLayout& l,
                           int64_t n, KernelSmemLimits& smem_limits, bool pdl,
                           cudaStream_t stream) {
  const bool key_runs = score_mma_key_runs(a.key.format, a.epb, a.cache_rows);
  if (a.q_codes != nullptr) {
    // The caller left q as codes: indexer_scores_take_codes(c, key_runs) held.
    launch_indexer_score_wgmma_persistent(a, l, n, c.persistent_ctas, c.persistent_cvt_steps,
                                          c.persistent_fp8_mma, smem_limits, pdl, stream);
  } else if (c.wgmma_pipelined && key_runs) {
    launch_indexer_score_wgmma_pipelined(a, l, n, c.splits, smem_limits, stream);  // a.q_fp8: 1 MMA
  } else if (c.wgmma) {
    launch_indexer_score_wgmma(a, l, n, c.splits, key_runs, c.wgmma_lo_e4m3, smem_limits, stream);
  } else if (c.mma) {
    launch_indexer_score_mma(a, l, n, c.splits, c.score_smem, c.mma_q_one_part,
                             c.mma_key_runs && key_runs, smem_limits, stream);
  } else {
    launch_indexer_score(a, l, n, c.splits, c.score_smem, smem_limits, stream);
  }
}

SelectScratch indexer_select_scratch(CudaBackend& be, const IndexerConfig& c, int64_t row) {
  SelectScratch s;
  if (c.select_splits == 0) return s;
  s.hist = be.scratch(static_cast<size_t>(c.group) * (kSplitBins + 1) * sizeof(uint32_t));
  s.pairs = be.scratch(static_cast<size_t>(c.group * row) * sizeof(uint64_t));
  return s;
}

void launch_indexer_selection(const SelectArgs& se, const IndexerConfig& c,
                              const SelectScratch& scratch, const DeviceLayout& l, int64_t n,
                              KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream) {
  if (c.binned) {
    launch_indexer_select_binned(se, l, n, c.binned_smem, c.row_sort, smem_limits, pdl, stream);
    return;
  }
  if (c.select_splits == 0) {
    launch_indexer_select(se, l, n, c.select_smem, smem_limits, pdl, stream);
    return;
  }
  SplitSelectArgs a{};
  a.s = se;
  a.hist = reinterpret_cast<uint32_t*>(scratch.hist.raw_data());
  a.pairs = reinterpret_cast<uint64_t*>(scratch.pairs.raw_data());
  a.smem_pairs = std::min<int64_t>(se.row, kSplitSmemPairs);
  launch_indexer_select_split(a, l, n, c.select_splits, c.split_final_smem, smem_limits, pdl,
                              stream);
}

bool indexer_binned_selection_fits(const CudaBackend& be, int64_t top_k, int64_t row) {
  return binned_select_smem_bytes(std::min(top_k, row), row) <= be.max_shared_memory_per_block();
}

Tensor indexer_topk_run(CudaBackend& be, const Tensor& q, const Tensor& weights,
                        const Tensor& index_cache, const BatchLayout& layout, int ratio, int top_k,
                        float score_scale, float weight_scale, const IndexerRunOptions& opt) {
  const char* op = "indexer_topk";
  const int64_t tokens = layout.num_tokens;
  Tensor out = be.empty({tokens, top_k}, DType::kI32);
  if (tokens == 0 || top_k == 0) return out;
  const int64_t bound = indexer_bound(layout, ratio);
  if (bound == 0 || index_cache.size(0) == 0) {
    // No entry is addressable: every row is all -1.
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0xff, out.nbytes(), be.stream()));
    return out;
  }
  // q's codes as they are (the persistent kernel reads them), else decoded to f32 values.
  ScoreArgs sa =
      indexer_score_args(op, q, weights, index_cache, layout, ratio, score_scale, weight_scale);
  const size_t smem_max = be.max_shared_memory_per_block();
  IndexerProblem problem = topk_problem(tokens, q.size(1), q.size(2), top_k, bound, sa.key.format);
  problem.q_fp8 = sa.q_fp8;
  const IndexerConfig c = choose_indexer(problem, be.num_sms(), smem_max, opt.score_kernel,
                                         opt.select_kernel, indexer_wgmma_choice(be));
  const bool take_codes =
      indexer_scores_take_codes(c, score_mma_key_runs(sa.key.format, sa.epb, sa.cache_rows));
  const bool forced_persistent =
      opt.score_kernel == IndexerScoreKernel::kTensorCoreWgmmaPersistent ||
      opt.score_kernel == IndexerScoreKernel::kTensorCoreWgmmaPersistentCvt ||
      opt.score_kernel == IndexerScoreKernel::kTensorCoreWgmmaPersistentFp8;
  if (forced_persistent && !take_codes) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": the persistent wgmma scores take q in fp8 over fp8 keys of " +
                    std::to_string(kMmaDim) + " channels, " + std::to_string(kWgmmaHeads) +
                    " heads on sm_90, copied in runs of a block, got q " + q.describe() +
                    " and keys " + index_cache.describe());
  }
  Tensor q_values;  // kept until the score launches are enqueued
  if (sa.q_fp8 && !take_codes) {
    q_values = indexer_q_values(be, q);
    sa.q = q_values.data<float>();
    sa.q_codes = nullptr;
  }
  const bool forced_wgmma = opt.score_kernel == IndexerScoreKernel::kTensorCoreWgmma ||
                            opt.score_kernel == IndexerScoreKernel::kTensorCoreWgmmaLoE4m3;
  if (opt.score_kernel == IndexerScoreKernel::kTensorCoreWgmmaPipelined && !c.wgmma) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": the pipelined wgmma scores take fp8 keys of " +
                    std::to_string(kMmaDim) + " channels and " + std::to_string(kWgmmaHeads) +
                    " heads on sm_90, got q " + q.describe() + " and keys " +
                    index_cache.describe());
  }
  if (forced_wgmma && !c.wgmma) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": the wgmma scores take fp8 keys of " + std::to_string(kMmaDim) +
                    " channels and " + std::to_string(kWgmmaHeads) + " heads on sm_90, got q " +
                    q.describe() + " and keys " + index_cache.describe());
  }
  const bool forced_mma = opt.score_kernel == IndexerScoreKernel::kTensorCore ||
                          opt.score_kernel == IndexerScoreKernel::kTensorCoreOnePass ||
                          opt.score_kernel == IndexerScoreKernel::kTensorCoreKeyRuns ||
                          opt.score_kernel == IndexerScoreKernel::kTensorCoreMmaSync;
  if (forced_mma && !c.mma) {
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": the tensor-core scores take bf16, fp8 or FP4 keys of " +
                    std::to_string(kMmaDim) + " channels and 16, 32 or 64 heads, got q " +
                    q.describe() + " and keys " + index_cache.describe());
  }
  require_indexer_fits(op, c, q, top_k, smem_max);
  if (opt.scores != nullptr ? c.group < tokens : !opt.run_scores) {
    fail(op, "caller's scores need all " + std::to_string(tokens) +
                 " tokens in one group (and are needed when the scores are not computed)");
  }

  Tensor scratch_scores;
  float* scores = opt.scores;
  if (scores == nullptr) {
    scratch_scores = be.scratch(static_cast<size_t>(c.group * bound) * sizeof(float));
    scores = reinterpret_cast<float*>(scratch_scores.raw_data());
  }
  const SelectScratch select_scratch = indexer_select_scratch(be, c, bound);
  const DeviceLayout dl = device_layout(layout);
  sa.scores = scores;
  SelectArgs se =
      indexer_select_args(sa.scores, out.data<int32_t>(), bound, bound, c, 1, top_k, ratio);
  for (int64_t t0 = 0; t0 < tokens; t0 += c.group) {
    const int64_t n = std::min(c.group, tokens - t0);
    sa.token0 = static_cast<int>(t0);
    se.token0 = static_cast<int>(t0);
    if (opt.run_scores) {
      launch_indexer_scores(sa, c, dl, n, be.smem_limits(), be.pdl(), be.stream());
    }
    if (opt.run_select) {
      launch_indexer_selection(se, c, select_scratch, dl, n, be.smem_limits(), be.pdl(),
                               be.stream());
    }
  }
  return out;
}

Tensor CudaBackend::indexer_topk_impl(const Tensor& q, const Tensor& weights,
                                      const Tensor& index_cache, const BatchLayout& layout,
                                      int ratio, int top_k, float score_scale, float weight_scale) {
  return indexer_topk_run(*this, q, weights, index_cache, layout, ratio, top_k, score_scale,
                          weight_scale, IndexerRunOptions{});
}

}  // namespace deepinfer::cuda
