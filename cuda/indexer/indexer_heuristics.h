// How the indexer ops (indexer_topk, indexer_candidates, indexer_topk_in_candidates) are cut
// into launches: which kernel scores (tensor cores for bf16, fp8 and FP4 keys at the shapes
// indexer_score_mma.cu takes, else the f32 CUDA-core kernel, which also serves f32 keys and
// candidate lists), which kernel selects (the binned one where a row fits its shared memory, else
// one block per token, or the split selection for a few long rows), whether a token's scores fit in
// the select kernel's shared memory, how many tokens share one scratch allocation, and how many
// blocks score one token. Host code on shapes only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/indexer/indexer_launch.h"
#include "cuda/indexer/indexer_options.h"

namespace deepinfer::cuda {

// Scratch of one group of tokens at most: the tokens of a call are scored and selected in groups
// that fit.
constexpr int64_t kScoreScratchBytes = int64_t{256} << 20;

struct IndexerProblem {
  int64_t tokens;
  int64_t heads;
  int64_t dim;
  int64_t top_k;
  int64_t scored;         // the most slots the score kernel scores for a token (> 0)
  int64_t selected;       // the most slots the select kernel ranks for a token (> 0)
  int64_t scratch_bytes;  // scratch of one token: its scores and whatever else the op keeps
  KvFormat keys;          // the index cache's format
  bool listed;            // the scored slots are a candidate list, not the visible entries
  bool q_fp8 = false;     // q comes as e4m3 codes (quantize_indexer_q)
};

// indexer_topk: every visible entry, up to bound = max_blocks_per_seq * epb, scored and ranked.
inline IndexerProblem topk_problem(int64_t tokens, int64_t heads, int64_t dim, int64_t top_k,
                                   int64_t bound, KvFormat keys) {
  return {tokens, heads, dim, top_k, bound, bound, bound * int64_t{sizeof(float)}, keys, false};
}

// Whether indexer_score_mma.cu takes the problem: it scores visible entries (no candidate list),
// its keys are exact in an MMA input type (bf16, V4 fp8 and V4.1 FP4 index keys; f32 keys are
// not), its warps cover the heads (16 each), and their count divides a tile's keys (heads 16, 32
// or 64).
inline bool score_mma_takes(const IndexerProblem& p) {
  const bool exact_keys =
      p.keys == KvFormat::kBf16 || p.keys == KvFormat::kFp8 || p.keys == KvFormat::kV41Fp4Index;
  return !p.listed && exact_keys && p.dim == kMmaDim && p.heads > 0 &&
         p.heads % kMmaHeadsPerWarp == 0 && kMmaMaxHeads % p.heads == 0;
}

// Whether indexer_score_wgmma.cu takes the problem (on an sm_90 device): every visible entry of
// V4 fp8 index keys, 64 heads of kMmaDim channels.
inline bool score_wgmma_takes(const IndexerProblem& p) {
  return !p.listed && p.keys == KvFormat::kFp8 && p.dim == kMmaDim && p.heads == kWgmmaHeads;
}

// Whether the tensor-core kernel may copy fp8 keys in runs of a paged block with 16-byte copies
// (indexer_score_mma.cu): a run of min(epb, kMmaKeys) records of kMmaDim + 4 bytes starts 16-byte
// aligned when epb is a multiple of 4; a tile of kMmaKeys keys is whole runs when epb divides
// kMmaKeys or kMmaKeys divides epb; and cache rows a multiple of 4 keep a run's copy, rounded up
// to 16 bytes, inside the cache.
inline bool score_mma_key_runs(KvFormat keys, int64_t epb, int64_t cache_rows) {
  return keys == KvFormat::kFp8 && epb > 0 && epb % 4 == 0 &&
         (kMmaKeys % epb == 0 || epb % kMmaKeys == 0) && cache_rows % 4 == 0;
}

struct IndexerConfig {
  bool mma;            // tensor-core scores (indexer_score_mma.cu, or the wgmma kernel below)
  bool wgmma;          // ... fp8 keys on wgmma (indexer_score_wgmma.cu)
  bool wgmma_lo_e4m3;  // ... q's lo parts in e4m3 (IndexerScoreKernel::kTensorCoreWgmmaLoE4m3)
  // ... on the pipelined kernel (indexer_score_wgmma_pipelined.cu) where the records may be
  // copied in runs of a paged block (launch_indexer_scores checks; else the kernel above)
  bool wgmma_pipelined;
  // ... for q in fp8, on the persistent kernel (indexer_score_wgmma_persistent.cu) where the
  // records may be copied in runs (indexer_scores_take_codes), over persistent_ctas blocks, its
  // key codes of persistent_cvt_steps k-steps (of 8) through cvt
  bool wgmma_persistent;
  int persistent_cvt_steps;
  bool persistent_fp8_mma;  // ... its codes on e4m3 MMAs instead (kTensorCoreWgmmaPersistentFp8)
  int64_t persistent_ctas;
  bool mma_q_one_part;  // ... without q's lo part (IndexerScoreKernel::kTensorCoreOnePass)
  bool mma_key_runs;  // ... fp8 keys in runs where allowed (IndexerScoreKernel::kTensorCoreKeyRuns)
  int64_t cap;        // pairs the select kernel collects: min(top_k, selected)
  size_t score_smem;  // the score kernel's shared memory
  size_t select_min_smem;  // the select kernel's with the scores left in global memory
  bool fits;               // both kernels fit the device's shared memory
  bool scores_in_smem;     // the select kernel copies a token's scores into shared memory
  size_t select_smem;
  int64_t group;   // tokens per launch pair
  int64_t splits;  // score blocks per token
  // The binned selection (indexer_select_binned.cu) and its shared memory; when false:
  // the split selection (indexer_select_split.cu): its blocks per token in steps 1 and 2, or 0
  // for the one-block kernel (indexer_select.cu); and its step 3's shared memory.
  bool binned;
  size_t binned_smem;
  // With binned: tokens of at most kRowSortMaxSlots slots sort their whole row (kAuto, kRowSort).
  bool row_sort;
  int64_t select_splits;
  size_t split_final_smem;
};

// The split selection's blocks per token: enough for two waves over the tokens, each block
// reading at least kSplitSlotsPerBlock keys; the heuristic takes it from kSplitMinBlocks blocks
// (long rows, few tokens), else 0 (the one-block kernel).
constexpr int64_t kSplitSlotsPerBlock = 2048;
// From 5: on the H200 the split lost at 4 blocks per token (32K context: 31.0 vs 28.6 us at B = 1,
// 35.6 vs 32.9 us at B = 64) and won from 5 (128K: 31 vs 90 us at B = 1, 64 vs 105 us at B = 64).
constexpr int64_t kSplitMinBlocks = 5;

// A forced kBinned or kRowSort that does not fit counts as kAuto here.
inline int64_t split_select_blocks(int64_t tokens, int64_t selected, int num_sms,
                                   IndexerSelectKernel want) {
  if (want == IndexerSelectKernel::kOneBlock) return 0;
  const int64_t per_token = (2 * static_cast<int64_t>(num_sms) + tokens - 1) / tokens;
  const int64_t by_slots = (selected + kSplitSlotsPerBlock - 1) / kSplitSlotsPerBlock;
  const int64_t blocks = std::min({per_token, by_slots, int64_t{65535}});
  if (want == IndexerSelectKernel::kSplit) return std::max<int64_t>(1, blocks);
  return blocks >= kSplitMinBlocks ? blocks : 0;
}

// Where the wgmma kernel (indexer_score_wgmma.cu) may score fp8 keys: `device`, the device runs
// wgmma (sm_90); `by_default`, kAuto and kTensorCore take it where it takes the problem (else
// only a forced kTensorCoreWgmma does). indexer_wgmma_choice (indexer_args.h) fills it.
// `pipelined`: kAuto and kTensorCore take indexer_score_wgmma_pipelined.cu instead (with
// by_default). (A bf16-key twin measured 2.4-2.7x slower than the mma.sync kernel on the H200 in
// session 11, B = 64: 196 vs 82 us at 32K, 775 vs 301 us at 128K; it was removed.)
// `persistent`: for q in fp8 they take indexer_score_wgmma_persistent.cu instead, `persistent_cvt`
// its variant with every key code through cvt, `persistent_fp8` the one with none (e4m3 MMAs).
struct WgmmaChoice {
  bool device = false;
  bool by_default = false;
  bool pipelined = false;
  bool persistent = false;
  bool persistent_cvt = false;
  bool persistent_fp8 = false;
};

// `want` forces the scoring kernel; a forced tensor-core kernel that does not take the problem
// leaves `mma` (or, for kTensorCoreWgmma, `wgmma`) false and the caller refuses.
inline IndexerConfig choose_indexer(const IndexerProblem& p, int num_sms, size_t max_smem,
                                    IndexerScoreKernel want = IndexerScoreKernel::kAuto,
                                    IndexerSelectKernel want_select = IndexerSelectKernel::kAuto,
                                    WgmmaChoice wgmma = {}) {
  IndexerConfig c{};
  const bool auto_tc = want == IndexerScoreKernel::kAuto || want == IndexerScoreKernel::kTensorCore;
  const bool forced_pipelined = want == IndexerScoreKernel::kTensorCoreWgmmaPipelined;
  const bool forced_persistent = want == IndexerScoreKernel::kTensorCoreWgmmaPersistent ||
                                 want == IndexerScoreKernel::kTensorCoreWgmmaPersistentCvt ||
                                 want == IndexerScoreKernel::kTensorCoreWgmmaPersistentFp8;
  const bool forced_wgmma = want == IndexerScoreKernel::kTensorCoreWgmma ||
                            want == IndexerScoreKernel::kTensorCoreWgmmaLoE4m3 ||
                            forced_pipelined || forced_persistent;
  c.wgmma = wgmma.device && (forced_wgmma || (wgmma.by_default && auto_tc)) &&
            score_wgmma_takes(p) && score_wgmma_smem_bytes() <= max_smem;
  c.wgmma_lo_e4m3 = c.wgmma && want == IndexerScoreKernel::kTensorCoreWgmmaLoE4m3;
  c.wgmma_pipelined = c.wgmma && (forced_pipelined || (wgmma.pipelined && auto_tc)) &&
                      score_wgmma_pipelined_smem_bytes() <= max_smem;
  const bool fp8_mma = forced_persistent ? want == IndexerScoreKernel::kTensorCoreWgmmaPersistentFp8
                                         : wgmma.persistent_fp8;
  c.wgmma_persistent = c.wgmma && p.q_fp8 && (forced_persistent || (wgmma.persistent && auto_tc)) &&
                       score_wgmma_persistent_smem_bytes(fp8_mma) <= max_smem;
  const bool all_cvt = forced_persistent ? want == IndexerScoreKernel::kTensorCoreWgmmaPersistentCvt
                                         : wgmma.persistent_cvt;
  c.persistent_cvt_steps = all_cvt ? kMmaDim / 16 : kPersistMixedCvtSteps;
  c.persistent_fp8_mma = c.wgmma_persistent && fp8_mma;
  c.mma = c.wgmma || (want != IndexerScoreKernel::kCudaCore && !forced_wgmma &&
                      score_mma_takes(p) && score_mma_smem_bytes(p.heads, p.keys) <= max_smem);
  c.mma_q_one_part = c.mma && want == IndexerScoreKernel::kTensorCoreOnePass;
  c.mma_key_runs = c.mma && want == IndexerScoreKernel::kTensorCoreKeyRuns;
  c.score_smem = c.wgmma_persistent  ? score_wgmma_persistent_smem_bytes(c.persistent_fp8_mma)
                 : c.wgmma_pipelined ? score_wgmma_pipelined_smem_bytes()
                 : c.wgmma           ? score_wgmma_smem_bytes()
                 : c.mma             ? score_mma_smem_bytes(p.heads, p.keys)
                                     : score_smem_bytes(p.heads, p.dim);
  c.cap = std::min<int64_t>(p.top_k, p.selected);
  c.select_min_smem = select_smem_bytes(c.cap, p.selected, false);
  c.fits = c.score_smem <= max_smem && c.select_min_smem <= max_smem;
  c.scores_in_smem = select_smem_bytes(c.cap, p.selected, true) <= max_smem;
  c.select_smem = select_smem_bytes(c.cap, p.selected, c.scores_in_smem);
  // The binned selection wherever a row's keys and pairs fit one block's shared memory (top 512:
  // rows up to 18,333 slots on the H200, 32K context at ratio 4 is 8,192), at every token count:
  // it reads a row once from global memory and passes over it twice in shared memory, where the
  // one-block kernel passes five times (four radix passes and the collect) and the split
  // selection adds a memset, two more launches and a global round trip of the pairs. Longer rows
  // keep the split selection (from kSplitMinBlocks blocks) or the one-block kernel.
  c.binned_smem = binned_select_smem_bytes(c.cap, p.selected);
  c.binned =
      (want_select == IndexerSelectKernel::kAuto || want_select == IndexerSelectKernel::kBinned ||
       want_select == IndexerSelectKernel::kRowSort) &&
      c.binned_smem <= max_smem;
  c.row_sort = c.binned && want_select != IndexerSelectKernel::kBinned;
  c.split_final_smem =
      split_select_final_smem_bytes(c.cap, std::min<int64_t>(p.selected, kSplitSmemPairs));
  c.select_splits = !c.binned && c.split_final_smem <= max_smem
                        ? split_select_blocks(p.tokens, p.selected, num_sms, want_select)
                        : 0;
  // Tokens per launch, so that the scratch stays within kScoreScratchBytes.
  const int64_t scratch_bytes =
      p.scratch_bytes +
      (c.select_splits > 0 ? static_cast<int64_t>(split_select_scratch_bytes(p.selected)) : 0);
  c.group = std::max<int64_t>(1, std::min<int64_t>(p.tokens, kScoreScratchBytes / scratch_bytes));
  // Splits per token, at most the tiles of the scored slots. The CUDA-core kernel: enough blocks
  // for two waves. The tensor-core kernels (two mma.sync or kWgmmaBlocksPerSm wgmma blocks per
  // SM, __launch_bounds__; the pipelined wgmma kernel's block fills an SM): at most one wave of
  // blocks, each walking its tiles, so that no second, partial wave doubles the time.
  const int64_t tile = c.mma ? kMmaKeys : kScoreKeys;
  const int64_t tiles = (p.scored + tile - 1) / tile;
  const int64_t per_sm = c.wgmma_pipelined ? 1 : c.wgmma ? kWgmmaBlocksPerSm : 2;
  const int64_t blocks = c.mma ? per_sm * static_cast<int64_t>(num_sms) / c.group
                               : (2 * static_cast<int64_t>(num_sms) + c.group - 1) / c.group;
  c.splits = std::max<int64_t>(1, std::min({blocks, tiles, int64_t{65535}}));
  // The persistent kernel: one block per SM at most, each a share of the group's tiles.
  c.persistent_ctas = std::max<int64_t>(1, std::min<int64_t>(num_sms, c.group * tiles));
  return c;
}

// Whether the scores of config `c` read q's e4m3 codes (the persistent kernel), so that the caller
// need not decode them: where it chose that kernel and the records go in runs (key_runs:
// score_mma_key_runs), as launch_indexer_scores launches it.
inline bool indexer_scores_take_codes(const IndexerConfig& c, bool key_runs) {
  return c.wgmma_persistent && key_runs;
}

// The block-max kernel of indexer_candidates: blocks of kBlocksThreads threads, one per entry
// block, enough of them per token for two waves.
inline int64_t block_max_splits(int64_t tokens_in_group, int64_t blocks, int num_sms) {
  const int64_t tiles = (blocks + kBlocksThreads - 1) / kBlocksThreads;
  const int64_t want = (2 * static_cast<int64_t>(num_sms) + tokens_in_group - 1) / tokens_in_group;
  return std::max<int64_t>(1, std::min({want, tiles, int64_t{65535}}));
}

// The candidate-list kernel keeps a token's block bitmap in shared memory when it fits next to
// the kernel's own (a block scan); else in global scratch.
inline bool candidate_bitmap_in_smem(int64_t words, size_t max_smem) {
  return static_cast<size_t>(words) * sizeof(uint32_t) + 1024 <= max_smem;
}

}  // namespace deepinfer::cuda
