// The host setup the indexer ops share (defined in indexer_topk.cu): the checks of the kernels'
// limits and the score kernel's arguments. indexer_topk, indexer_candidates and
// indexer_topk_in_candidates call them before their launches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/indexer/indexer_heuristics.h"
#include "cuda/indexer/indexer_launch.h"
#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// Entries a sequence can address: layout.max_blocks_per_seq * (block_size / ratio).
int64_t indexer_bound(const BatchLayout& layout, int ratio);

// The score kernel's arguments over all visible entries (row = bound; `list` and `scores` for the
// caller to set). q in fp8 (quantize_indexer_q's codes) sets q_codes and q_fp8 and leaves q null:
// the caller decodes it (indexer_q_values) unless the chosen kernel takes the codes
// (indexer_scores_take_codes), and then clears q_codes. Throws Error(kUnsupported) when q or the
// cache do not suit the kernels (a head dim not a multiple of 4, a base off 16 bytes) and
// Error(kInvalidArgument) when the bound overflows i32. Needs bound > 0.
ScoreArgs indexer_score_args(const char* op, const Tensor& q, const Tensor& weights,
                             const Tensor& index_cache, const BatchLayout& layout, int ratio,
                             float score_scale, float weight_scale);

class CudaBackend;

// q's values for the score kernels, f32: q itself, or quantize_indexer_q's e4m3 codes decoded on
// `be`'s stream (exact; the caller sets ScoreArgs::q_fp8). The caller keeps it until its score
// launches are enqueued.
Tensor indexer_q_values(CudaBackend& be, const Tensor& q);

// Where the wgmma kernels may score fp8 index keys (choose_indexer): `be`'s device is sm_90, and
// by default where the backend's DEEPINFER_INDEXER_FP8_SCORES is wgmma_pipelined
// (indexer_score_wgmma_pipelined.cu) or wgmma (indexer_score_wgmma.cu; mma_sync:
// indexer_score_mma.cu; wgmma_persistent / _cvt / _fp8 (unset: _fp8):
// indexer_score_wgmma_persistent.cu for q in fp8, else as wgmma_pipelined; the A/B switch, read
// at the backend's creation).
WgmmaChoice indexer_wgmma_choice(const CudaBackend& be);

// Throws Error(kUnsupported) when the config does not fit the device's shared memory.
void require_indexer_fits(const char* op, const IndexerConfig& c, const Tensor& q, int64_t top_k,
                          size_t max_smem);

// The split selection's scratch for one group (empty when `c` selects with one block per token).
struct SelectScratch {
  Tensor hist;   // [group, kSplitBins + 1] u32
  Tensor pairs;  // [group, row] u64
};
SelectScratch indexer_select_scratch(CudaBackend& be, const IndexerConfig& c, int64_t row);

// The selection's arguments for one call (SelectArgs::token0 is set per group by the caller):
// score rows of `row` floats, one slot per `per_slot` entries, or the slots of `list`.
inline SelectArgs indexer_select_args(const float* scores, int32_t* out, int64_t row, int64_t bound,
                                      const IndexerConfig& c, int per_slot, int top_k, int ratio,
                                      const CandidateList& list = {}) {
  SelectArgs se{};
  se.scores = scores;
  se.out = out;
  se.row = row;
  se.bound = bound;
  se.cap = c.cap;
  se.list = list;
  se.per_slot = per_slot;
  se.top_k = top_k;
  se.ratio = ratio;
  se.scores_in_smem = c.scores_in_smem;
  return se;
}

// The selection of the group's n tokens by the kernel `c` chose: indexer_select_binned.cu when
// c.binned, else indexer_select_split.cu when c.select_splits > 0, else indexer_select.cu;
// programmatic dependent launches where `pdl`.
void launch_indexer_selection(const SelectArgs& se, const IndexerConfig& c,
                              const SelectScratch& scratch, const DeviceLayout& l, int64_t n,
                              KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream);

// The scores of the group's n tokens by the kernel `c` chose: indexer_score_wgmma_persistent.cu
// when a.q_codes is set, the wgmma kernels, indexer_score_mma.cu when c.mma, else
// indexer_score.cu. `pdl`: the persistent kernel as a programmatic dependent launch (the others
// are ordinary launches).
void launch_indexer_scores(const ScoreArgs& a, const IndexerConfig& c, const DeviceLayout& l,
                           int64_t n, KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream);

}  // namespace deepinfer::cuda
