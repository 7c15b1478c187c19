// Choices of the CUDA indexer_topk that a benchmark may force (plain C++, no CUDA headers):
// which kernel scores, which selects, and which of the two stages run, so that one run can
// compare the kernels and time the scores and the selection apart. The backend's op uses the
// defaults. Also the A/B switch the backend reads at its creation (DEEPINFER_INDEXER_FP8_SCORES),
// here so that the backend's header holds it without the heuristics.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

class CudaBackend;

// Which kernel scores V4 fp8 index keys at 64 heads by default on an sm_90 device (kAuto and
// kTensorCore), the backend's DEEPINFER_INDEXER_FP8_SCORES at its creation. For q in fp8 (the
// engine's path with fp8 index keys) wgmma_persistent_fp8 by default (below), otherwise
// wgmma_pipelined: on the H200 it scored fp8 keys 1.6-1.8x faster than the wgmma kernel in session
// 11 (B = 64: 42.0 vs 73.9 us at 32K, 149.2 vs 240.7 us at 128K), passed the op table's 183 indexer
// rows against the CPU and, in session 12, its own byte-for-byte test against the wgmma kernel.
// The wgmma kernel had in turn scored them 1.6-1.8x faster than the mma.sync kernel at B = 64
// (32K: 71.5 vs 114.6 us; 128K: 238.9 vs 425.5 us), level with it at B = 1.
enum class IndexerFp8Scores {
  // "wgmma_pipelined": indexer_score_wgmma_pipelined.cu where kWgmma's kernel takes the problem
  // and the records may be copied in runs (else kWgmma's kernel); the default for q in f32.
  kWgmmaPipelined,
  kWgmma,    // "wgmma": indexer_score_wgmma.cu where it takes the problem (the same scores)
  kMmaSync,  // "mma_sync": indexer_score_mma.cu
  // "wgmma_persistent": indexer_score_wgmma_persistent.cu where q comes in fp8 (the engine's
  // path: quantize_indexer_q) and kWgmmaPipelined's kernel would run, 3 of its 8 k-steps' key codes
  // through cvt and 5 through integer operations; elsewhere kWgmmaPipelined's choice. The same
  // score bytes as kWgmmaPipelined (its GPU test, session 13 on the H200).
  kWgmmaPersistent,
  // "wgmma_persistent_cvt": the same kernel with every key code through cvt (the default from
  // session 13 to 31): on the H200, B = 64, 35.4 us at 32K (pipelined 38.8, kWgmmaPersistent
  // 36.8) and 122.5 us at 128K (131.1, 125.9); B = 1 at 32K 6.6 us (8.7). The same score bytes as
  // kWgmmaPipelined (its GPU test): the choice for scores exact to f32 rounding.
  kWgmmaPersistentCvt,
  // "wgmma_persistent_fp8" or unset: the persistent kernel with no key conversion, the codes on
  // e4m3 MMAs (IndexerScoreKernel::kTensorCoreWgmmaPersistentFp8), as DeepSeek's paged MQA logits
  // kernels on Hopper (DeepInfer's indexer): their numerics, not the CPU op's scores to f32
  // rounding (Hopper's fp8 MMAs keep 13 fraction bits of each k32 step's sum: within ~5e-4 of a
  // row's largest score on the H200, session 17). The default since session 31: faster at every
  // shape measured (session 30, B = 64: 27.7 against 31.0 us at 32K, 82.2 against 94.1 at 128K;
  // B = 256 at 32K 81.0 against 96.6). q in f32 keeps kWgmmaPipelined's choice.
  kWgmmaPersistentFp8,
};

// The choice DEEPINFER_INDEXER_FP8_SCORES names (nullptr: unset); nullopt for an unknown name.
inline std::optional<IndexerFp8Scores> parse_indexer_fp8_scores(const char* name) {
  const std::string_view v = name == nullptr ? "" : name;
  if (v.empty()) return IndexerFp8Scores::kWgmmaPersistentFp8;
  if (v == "wgmma_pipelined") return IndexerFp8Scores::kWgmmaPipelined;
  if (v == "wgmma") return IndexerFp8Scores::kWgmma;
  if (v == "mma_sync") return IndexerFp8Scores::kMmaSync;
  if (v == "wgmma_persistent") return IndexerFp8Scores::kWgmmaPersistent;
  if (v == "wgmma_persistent_cvt") return IndexerFp8Scores::kWgmmaPersistentCvt;
  if (v == "wgmma_persistent_fp8") return IndexerFp8Scores::kWgmmaPersistentFp8;
  return std::nullopt;
}

enum class IndexerScoreKernel {
  kAuto,        // indexer_heuristics.h decides
  kCudaCore,    // indexer_score.cu: f32 math, every key format and shape
  kTensorCore,  // indexer_score_mma.cu: bf16 / fp8 / FP4 keys at its shapes, else kUnsupported
  // kTensorCore with q rounded once to the MMA input (one MMA instead of two; q to 8 significant
  // bits for bf16 keys, 11 for fp8 and FP4): what the split of q costs. Measurement only: its
  // scores are not held to the CPU op's, and kAuto never picks it.
  kTensorCoreOnePass,
  // kTensorCore with fp8 keys copied in runs of a paged block (16-byte copies) where
  // score_mma_key_runs allows, instead of key by key (33 four-byte copies per 132-byte record).
  // Scores as kTensorCore's. Not the default: on the H200 the runs measured slower at B = 64
  // (130 vs 116 us at 32K context, 488 vs 426 us at 128K) and no faster at B = 1, when every
  // 16-byte piece still looked up its row (now each run does, once).
  kTensorCoreKeyRuns,
  // The mma.sync kernel (indexer_score_mma.cu) for every format it takes, also where kAuto and
  // kTensorCore take a wgmma kernel (DEEPINFER_INDEXER_FP8_SCORES unset or wgmma). Scores as
  // kTensorCore's.
  kTensorCoreMmaSync,
  // The wgmma kernel (indexer_score_wgmma.cu): fp8 keys at 64 heads of 128 channels on sm_90
  // (indexer_wgmma_runs), else kUnsupported. Scores as kTensorCore's.
  kTensorCoreWgmma,
  // kTensorCoreWgmma with q's lo parts in e4m3 (an e4m3 MMA at twice the f16 rate on the codes as
  // loaded; q to 15 significant bits instead of 22): what an fp8 lo part would save. Measurement
  // only: its scores are not held to the CPU op's, and kAuto never picks it.
  kTensorCoreWgmmaLoE4m3,
  // The pipelined wgmma kernel (indexer_score_wgmma_pipelined.cu: a producer warp's bulk copies
  // of the records, three warpgroups scoring), where kTensorCoreWgmma runs and the records may be
  // copied in runs of a paged block (score_mma_key_runs; elsewhere kTensorCoreWgmma's kernel);
  // else kUnsupported. Scores bit-identical to kTensorCoreWgmma's.
  kTensorCoreWgmmaPipelined,
  // The persistent wgmma kernel (indexer_score_wgmma_persistent.cu: blocks over the flattened
  // tiles, q staged from its e4m3 codes, key codes split between cvt and integer conversion) where
  // q is in fp8 and kTensorCoreWgmmaPipelined's kernel would run; else kUnsupported. Scores
  // bit-identical to kTensorCoreWgmmaPipelined's.
  kTensorCoreWgmmaPersistent,
  // ... with every key code through cvt.
  kTensorCoreWgmmaPersistentCvt,
  // ... with no conversion: the key and q codes multiplied on e4m3 MMAs (wgmma.m64n64k32), as
  // DeepSeek's paged MQA logits kernels do on Hopper. Hopper's fp8 MMAs keep fewer bits of their
  // sums than f32 (SageAttention2 reports 13 mantissa bits), so its scores are not the CPU op's
  // to f32 rounding. kAuto takes it under DEEPINFER_INDEXER_FP8_SCORES=wgmma_persistent_fp8 (the
  // default).
  kTensorCoreWgmmaPersistentFp8,
};

enum class IndexerSelectKernel {
  kAuto,      // indexer_heuristics.h decides
  kOneBlock,  // indexer_select.cu: one block per token
  kSplit,     // indexer_select_split.cu: a token's keys over several blocks (where it fits)
  // indexer_select_binned.cu: one wide block per token, the row in shared memory (where it fits;
  // elsewhere kAuto's choice among the other two), by its histogram passes at every row length.
  kBinned,
  // kBinned, except that a token of at most kRowSortMaxSlots slots sorts its whole row instead
  // (one bitonic network over the block: no histogram, refinement or rank search). kAuto's choice
  // where kBinned runs.
  kRowSort,
};

struct IndexerRunOptions {
  IndexerScoreKernel score_kernel = IndexerScoreKernel::kAuto;
  IndexerSelectKernel select_kernel = IndexerSelectKernel::kAuto;
  bool run_scores = true;  // false: select from `scores` as they stand
  bool run_select = true;  // false: only the scores (the returned indices stay unwritten)
  // The caller's scores, [tokens, max_blocks_per_seq * entries per block] f32, all tokens in one
  // group; null: the backend's scratch (then run_scores must be true).
  float* scores = nullptr;
};

// Whether kTensorCoreWgmma can run on `be`'s device (sm_90).
bool indexer_wgmma_runs(const CudaBackend& be);

// Whether the binned selection takes a token row of `row` slots at `top_k` on `be`'s device
// (its keys and pairs fit one block's shared memory); elsewhere a forced kBinned runs kAuto's
// choice among the other kernels.
bool indexer_binned_selection_fits(const CudaBackend& be, int64_t top_k, int64_t row);

// indexer_topk on `be`'s stream with `opt`'s choices (arguments as Backend::indexer_topk, which
// checks them; this entry point does not).
Tensor indexer_topk_run(CudaBackend& be, const Tensor& q, const Tensor& weights,
                        const Tensor& index_cache, const BatchLayout& layout, int ratio, int top_k,
                        float score_scale, float weight_scale, const IndexerRunOptions& opt);

}  // namespace deepinfer::cuda
