// The lightning indexer's kernels (docs/model.md#lightning-indexer): their tile constants,
// arguments, shared-memory sizes and launches. indexer_topk.cu and indexer_candidates.cu choose
// the config (indexer_heuristics.h) and call these.
//
// The score and select kernels rank "slots" of a token: its visible entries (indexer_topk), the
// blocks of its visible entries (indexer_candidates' selection) or the entries of its candidate
// list (indexer_topk_in_candidates, CandidateList below).
//
// A launch function's `pdl`: its kernels go as programmatic dependent launches (each waits for the
// previous kernel at its start, cuda/common/pdl.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cache/kv_record.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kScoreKeys = 32;  // entries per tile: one per lane
constexpr int kScoreHeads = 8;  // heads per register group of a thread
constexpr int kSelectThreads = 512;
constexpr int kBlocksThreads = 256;

// A token's candidate entries, in ascending entry order: slot i is entry
// blocks[g][i / block_entries] * block_entries + i % block_entries for i < counts[g] (g: the
// token's index in its group). Every listed block but the last is wholly visible, so the slots
// are exactly the visible entries of the listed blocks. Null `blocks`: slot j is entry j.
struct CandidateList {
  const int32_t* blocks;  // [tokens of the group, stride]: distinct visible blocks, ascending
  const int32_t* counts;  // [tokens of the group]: candidate entries
  int64_t stride;
  int block_entries;
};

// Slot i's entry under list `c` for token g of the group.
__device__ __forceinline__ int64_t slot_entry(const CandidateList& c, int g, int64_t i) {
  if (c.blocks == nullptr) return i;
  const int64_t block = c.blocks[static_cast<int64_t>(g) * c.stride + i / c.block_entries];
  return block * c.block_entries + i % c.block_entries;
}

// The tensor-core scoring kernel (indexer_score_mma.cu): 16 heads per warp, tiles of 64 keys
// scored by kMmaKeyGroups warps per head group, kMmaStages tiles in flight.
constexpr int kMmaDim = 128;  // the index head dim it takes (V4, V4.1)
constexpr int kMmaHeadsPerWarp = 16;
constexpr int kMmaMaxHeads = 64;
constexpr int kMmaKeys = 64;
constexpr int kMmaKeyGroups = 2;
constexpr int kMmaStages = 4;

struct ScoreArgs {
  const float* q;        // [T, heads, dim]
  const float* weights;  // [T, heads]
  const uint8_t* cache;  // [cache_rows] rows of key.row_bytes bytes
  KvRowFormat key;       // the index cache's rows: f32, bf16, V4 fp8 or V4.1 FP4 index keys
  float* scores;         // [tokens of the group, row]: the score of each slot
  int64_t row;           // floats per scores row
  int64_t bound;         // max entries of a sequence: max_blocks_per_seq * epb
  CandidateList list;    // the slots: all visible entries, or a candidate list
  int64_t cache_rows;
  int token0;  // first token of the group
  int heads;
  int dim;  // a multiple of 4
  int ratio;
  int epb;
  float score_scale;
  float weight_scale;
  // q holds the values of e4m3 codes (quantize_indexer_q): one f16 part holds each head exactly,
  // so the pipelined wgmma kernel multiplies it alone (one MMA per tile instead of hi and lo).
  bool q_fp8;
  // The e4m3 codes themselves ([T, heads, dim] bytes), for the persistent wgmma kernel, which
  // reads them instead of `q` (then null: the caller skips decoding them); null elsewhere.
  const uint8_t* q_codes;
};

inline size_t score_smem_bytes(int64_t heads, int64_t dim) {
  const int64_t floats =
      heads * dim + kScoreKeys * (dim + 4) + (heads + 3) / 4 * 4 + kScoreWarps * kScoreKeys;
  return static_cast<size_t>(floats) * sizeof(float) + kScoreKeys * sizeof(int64_t);
}

// Threads of the tensor-core kernel for `heads` (a multiple of kMmaHeadsPerWarp).
inline int score_mma_threads(int64_t heads) {
  return static_cast<int>(heads / kMmaHeadsPerWarp) * kMmaKeyGroups * 32;
}

// Bytes of one key staged by the tensor-core kernel: kMmaDim fp8 or bf16 channels, or a V4.1 FP4
// index record (kMmaDim / 2 bytes of e2m1 pairs, then 4 UE8M0 scales: 68 bytes) padded to 80,
// whose 20-word stride puts the 8 keys of an n-tile on distinct banks (indexer_score_mma.cu).
__host__ __device__ constexpr int score_mma_key_bytes(KvFormat format) {
  return format == KvFormat::kFp8 ? kMmaDim : format == KvFormat::kV41Fp4Index ? 80 : 2 * kMmaDim;
}

// Shared memory of the tensor-core kernel: per stage the keys (score_mma_key_bytes), their f32
// scales and mapped flags; the head groups' partial scores.
inline size_t score_mma_smem_bytes(int64_t heads, KvFormat format) {
  const int64_t stage = kMmaKeys * (score_mma_key_bytes(format) + sizeof(float) + sizeof(int));
  return static_cast<size_t>(kMmaStages * stage +
                             heads / kMmaHeadsPerWarp * kMmaKeys * sizeof(float));
}

// The wgmma scoring kernel over fp8 index keys (indexer_score_wgmma.cu, sm_90a): one warpgroup
// per block scores tiles of kMmaKeys keys against all kWgmmaHeads heads, kWgmmaStages tiles in
// flight, kWgmmaBlocksPerSm blocks per SM.
constexpr int kWgmmaThreads = 128;
constexpr int kWgmmaHeads = 64;
constexpr int kWgmmaStages = 4;
constexpr int kWgmmaBlocksPerSm = 3;
constexpr int kWgmmaQBytes = 2 * kWgmmaHeads * kMmaDim * 2;  // q's hi and lo parts in f16

// Its shared memory: q's tile, the head weights, per stage kMmaKeys records of kMmaDim + 4 bytes
// and their mapped flags.
inline size_t score_wgmma_smem_bytes() {
  return static_cast<size_t>(kWgmmaQBytes) + kWgmmaHeads * sizeof(float) +
         static_cast<size_t>(kWgmmaStages) * kMmaKeys * (kMmaDim + 4 + sizeof(int));
}

// The pipelined wgmma kernel (indexer_score_wgmma_pipelined.cu, sm_90a): one block per SM of
// kWgmmaPipeConsumers warpgroups that score tiles of kMmaKeys keys in turn (the scores of the
// kernel above, bit for bit) and one producer warp that keeps kWgmmaPipeStages tiles of records in
// flight with bulk copies, one per run of a paged block (score_mma_key_runs).
constexpr int kWgmmaPipeConsumers = 3;
constexpr int kWgmmaPipeThreads = kWgmmaPipeConsumers * kWgmmaThreads + 32;
// A multiple of kWgmmaPipeConsumers, so that each stage always goes to the same warpgroup: one
// that waits on a stage's full barrier has consumed the stage's previous tile, so it never waits
// two phases ahead (where the barrier's parity would answer for the wrong phase).
constexpr int kWgmmaPipeStages = 15;
static_assert(kWgmmaPipeStages % kWgmmaPipeConsumers == 0);

// Its shared memory: q's tile, the head weights, per stage kMmaKeys records of kMmaDim + 4 bytes,
// then per stage the mapped keys' mask and the full and empty barriers (8 bytes each).
inline size_t score_wgmma_pipelined_smem_bytes() {
  return static_cast<size_t>(kWgmmaQBytes) + kWgmmaHeads * sizeof(float) +
         static_cast<size_t>(kWgmmaPipeStages) * (kMmaKeys * (kMmaDim + 4) + 3 * sizeof(uint64_t));
}

// The persistent wgmma kernel (indexer_score_wgmma_persistent.cu, sm_90a, q as e4m3 codes): one
// block per SM walks its share of the group's tiles, flattened over the tokens. Its loader
// warpgroup holds one warp that bulk-copies the records (the pipelined kernel's copies) into a
// ring of kPersistStages stages and kPersistQWarps warps that turn each token's q codes into the
// f16 B tile of a ring of kPersistQSlots; kPersistConsumers warpgroups score the tiles in turn.
constexpr int kPersistConsumers = 3;
constexpr int kPersistQWarps = 3;
constexpr int kPersistThreads = (kPersistConsumers + 1) * kWgmmaThreads;
constexpr int kPersistStages = 15;  // a multiple of kPersistConsumers (as kWgmmaPipeStages)
static_assert(kPersistStages % kPersistConsumers == 0);
constexpr int kPersistQSlots = 2;
constexpr int kPersistQTileBytes = kWgmmaHeads * kMmaDim * 2;  // q's f16 B tile: one part
// A q slot's token: the scaled head weights, then where its tiles sit (16-byte multiple).
constexpr int kPersistQMetaBytes = kWgmmaHeads * 4 + 32;

// The fp8-MMA variant (launch_indexer_score_wgmma_persistent's fp8_mma) needs fewer registers
// per consumer thread (90 against 128), so its block runs four consumer warpgroups and 16 stages.
// On the H200 (session 17, B = 64) four beat three (28.96 vs 30.35 us at 32K, 92.7 vs 100.7 at
// 128K), five (15 stages, the weights read from shared memory to fit 85 registers) were slower
// (32.0, 106.9), and so were 20 stages (30.6, 101.4).
constexpr int kPersistFp8Consumers = 4;
constexpr int kPersistFp8Stages = 16;
static_assert(kPersistFp8Stages % kPersistFp8Consumers == 0);
struct PersistentShape {
  int consumers;
  int stages;
  constexpr int threads() const { return (consumers + 1) * kWgmmaThreads; }
};
constexpr PersistentShape persistent_shape(bool fp8_mma) {
  return fp8_mma ? PersistentShape{kPersistFp8Consumers, kPersistFp8Stages}
                 : PersistentShape{kPersistConsumers, kPersistStages};
}

// Its shared memory: the q slots (tiles, then their metadata), the record stages, then per stage
// the copied keys' mask and two barriers, per q slot two barriers, the prologue's scan, and its
// tables: one int per thread for the tokens' visible entries, one more (and one) for q_start.
inline size_t score_wgmma_persistent_smem_bytes(bool fp8_mma = false) {
  const PersistentShape s = persistent_shape(fp8_mma);
  const size_t threads = static_cast<size_t>(s.threads());
  return static_cast<size_t>(kPersistQSlots) * (kPersistQTileBytes + kPersistQMetaBytes) +
         static_cast<size_t>(s.stages) * (kMmaKeys * (kMmaDim + 4) + 3 * sizeof(uint64_t)) +
         2 * kPersistQSlots * sizeof(uint64_t) + (threads / 32 + 4) * sizeof(int64_t) +
         (2 * threads + 1) * sizeof(int32_t);
}

// The select kernel ranks a token's slots: with a candidate list its counts[g] slots, else its
// visible entries grouped by `per_slot` (1: entries; block_entries: the blocks of
// indexer_candidates, scored by their max). Outputs are the slots' entries (slot_entry).
struct SelectArgs {
  const float* scores;  // [tokens of the group, row]
  int32_t* out;         // [T, top_k]
  int64_t row;          // floats per scores row: the most slots of a token
  int64_t bound;
  int64_t cap;  // pairs buf can hold: min(top_k, row)
  CandidateList list;
  int per_slot;
  int token0;
  int top_k;
  int ratio;
  bool scores_in_smem;
};

// The number of slots the select kernels rank for token g of the group.
__device__ __forceinline__ int64_t select_slots(const SelectArgs& a, const DeviceLayout& l, int g) {
  if (a.list.blocks != nullptr) return a.list.counts[g];
  const int64_t visible = visible_entries(l.positions[a.token0 + g], a.ratio, a.bound);
  return (visible + a.per_slot - 1) / a.per_slot;
}

inline size_t select_smem_bytes(int64_t cap, int64_t row, bool scores_in_smem) {
  size_t bytes =
      static_cast<size_t>(cap) * sizeof(uint64_t) + 256 * sizeof(uint32_t) + 40 * sizeof(int);
  if (scores_in_smem) bytes += static_cast<size_t>(row) * sizeof(float);
  return bytes;
}

// The split selection (indexer_select_split.cu) spreads one token's selection over `splits`
// blocks, so that a few tokens still fill the GPU:
//  1. histogram: every block counts its share of the token's keys by their top kSplitBinBits
//     bits into the token's global histogram;
//  2. collect: every block finds the bin holding the k-th largest key from that histogram and
//     appends its keys in that bin or above, as (key, slot) pairs, to the token's pair list;
//  3. final (one block per token): an exact radix select of the top k pairs (pairs are
//     distinct, and their order is score descending, slot ascending: the tie rule), then the
//     one-block kernel's rank sort.
// Typical rows leave a few times k pairs for step 3; a row of many equal keys leaves up to all.
constexpr int kSplitThreads = 256;
constexpr int kSplitBinBits = 12;
constexpr int kSplitBins = 1 << kSplitBinBits;
constexpr int64_t kSplitSmemPairs = 8192;  // pairs step 3 copies into shared memory

struct SplitSelectArgs {
  SelectArgs s;        // the slots, outputs and k, as the one-block kernel takes them
  uint32_t* hist;      // [tokens of the group, kSplitBins + 1], zeroed by the launch; the last
                       // word of a token is its pair count
  uint64_t* pairs;     // [tokens of the group, s.row]
  int64_t smem_pairs;  // step 3 keeps a token's pairs in shared memory when they fit
};

inline size_t split_select_scratch_bytes(int64_t row) {
  return (kSplitBins + 1) * sizeof(uint32_t) + static_cast<size_t>(row) * sizeof(uint64_t);
}

inline size_t split_select_final_smem_bytes(int64_t cap, int64_t smem_pairs) {
  return static_cast<size_t>(cap + smem_pairs) * sizeof(uint64_t) + 256 * sizeof(uint32_t) +
         40 * sizeof(int);
}

// The binned selection (indexer_select_binned.cu): one block of kBinnedThreads per token keeps
// the token's keys (4 bytes a slot) and the pairs of its threshold bin (8 bytes a slot, at most
// the row) in shared memory, next to the winners (cap rounded up to 32), the histogram of the
// widest pass (kBinnedBits bits) and kBinnedMiscWords words of scan and counters.
constexpr int kBinnedThreads = 1024;
constexpr int kBinnedBits = 11;
constexpr int kBinnedMiscWords = 40;
// The binned kernel's whole-row sort (IndexerSelectKernel::kRowSort): one slot per thread.
constexpr int kRowSortMaxSlots = kBinnedThreads;

inline size_t binned_select_smem_bytes(int64_t cap, int64_t row) {
  const int64_t cap32 = (cap + 31) / 32 * 32;
  return static_cast<size_t>(cap32) * sizeof(uint64_t) +
         static_cast<size_t>(row) * (sizeof(uint64_t) + sizeof(uint32_t)) +
         (size_t{1} << kBinnedBits) * sizeof(uint32_t) + kBinnedMiscWords * sizeof(int);
}

// indexer_candidates' block scores: block c of a token is the max of its visible entries' scores.
struct BlockMaxArgs {
  const float* scores;  // [tokens of the group, entry_row]
  float* block_scores;  // [tokens of the group, block_row]
  int64_t entry_row;
  int64_t block_row;
  int64_t bound;
  int token0;
  int ratio;
  int block_entries;
};

// indexer_topk_in_candidates' lists: the distinct visible blocks of each token's candidates,
// ascending, through a bitmap of the token's blocks (in shared memory, or `bitmap` in global
// scratch when it does not fit there).
struct CandidateListArgs {
  const int32_t* candidates;  // [T, kb] block ids, -1 = none
  int32_t* blocks;            // [tokens of the group, kb]
  int32_t* counts;            // [tokens of the group]
  uint32_t* bitmap;           // [tokens of the group, words] or null: shared memory
  int64_t kb;
  int64_t words;  // bitmap words of a token: ceil(ceil(bound / block_entries) / 32)
  int64_t bound;
  int token0;
  int ratio;
  int block_entries;
};

// indexer_score.cu: grid (n tokens of the group, splits).
void launch_indexer_score(const ScoreArgs& a, const DeviceLayout& l, int64_t n, int64_t splits,
                          size_t smem, KernelSmemLimits& smem_limits, cudaStream_t stream);

// indexer_score_mma.cu: the same scores on tensor cores, for bf16, fp8 and FP4 keys of kMmaDim
// channels and heads 16, 32 or 64, over all visible entries (no candidate list: score_mma_takes);
// grid (n, splits) over tiles of kMmaKeys. q_one_part: q rounded once, without its lo part
// (measurement only). key_runs: fp8 keys copied in runs of a paged block (where
// score_mma_key_runs allows), else key by key.
void launch_indexer_score_mma(const ScoreArgs& a, const DeviceLayout& l, int64_t n, int64_t splits,
                              size_t smem, bool q_one_part, bool key_runs,
                              KernelSmemLimits& smem_limits, cudaStream_t stream);

// indexer_score_wgmma.cu: the same scores for fp8 keys at 64 heads of kMmaDim channels on sm_90a
// (score_wgmma_takes), grid (n, splits) over tiles of kMmaKeys; key_runs: records copied in runs
// of a paged block (where score_mma_key_runs allows), else key by key; lo_e4m3: q's lo parts in
// e4m3 (measurement only, IndexerScoreKernel::kTensorCoreWgmmaLoE4m3).
void launch_indexer_score_wgmma(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                int64_t splits, bool key_runs, bool lo_e4m3,
                                KernelSmemLimits& smem_limits, cudaStream_t stream);

// indexer_score_wgmma_pipelined.cu: launch_indexer_score_wgmma's scores (bit-identical, without
// lo_e4m3) where fp8 records may be copied in runs of a paged block (score_mma_key_runs: the
// caller checks), grid (n, splits) of one block per SM.
void launch_indexer_score_wgmma_pipelined(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                          int64_t splits, KernelSmemLimits& smem_limits,
                                          cudaStream_t stream);

// indexer_score_wgmma_persistent.cu: launch_indexer_score_wgmma_pipelined's scores (the same
// bytes for q in fp8) from a.q_codes, where fp8 records may be copied in runs of a paged block
// (score_mma_key_runs: the caller checks), over `ctas` blocks (one per SM at most) that share the
// group's n tokens' tiles. cvt_steps: the k-steps (of 8) whose key codes go through cvt, the
// rest through integer operations (common/e4m3_bits.h); 8 or kPersistMixedCvtSteps. fp8_mma:
// instead no conversion, the codes multiplied on e4m3 MMAs (IndexerScoreKernel::
// kTensorCoreWgmmaPersistentFp8: not the pipelined kernel's bytes; cvt_steps is then unused).
constexpr int kPersistMixedCvtSteps = 3;
void launch_indexer_score_wgmma_persistent(const ScoreArgs& a, const DeviceLayout& l, int64_t n,
                                           int64_t ctas, int cvt_steps, bool fp8_mma,
                                           KernelSmemLimits& smem_limits, bool pdl,
                                           cudaStream_t stream);

// indexer_select.cu: one block per token of the group.
void launch_indexer_select(const SelectArgs& a, const DeviceLayout& l, int64_t n, size_t smem,
                           KernelSmemLimits& smem_limits, bool pdl, cudaStream_t stream);

// indexer_select_binned.cu: one block per token of the group; smem is binned_select_smem_bytes.
// row_sort: tokens of at most kRowSortMaxSlots slots sort their whole row.
void launch_indexer_select_binned(const SelectArgs& a, const DeviceLayout& l, int64_t n,
                                  size_t smem, bool row_sort, KernelSmemLimits& smem_limits,
                                  bool pdl, cudaStream_t stream);

// indexer_select_split.cu: the three steps above for the group's n tokens, `splits` blocks per
// token in steps 1 and 2; final_smem is step 3's (split_select_final_smem_bytes).
void launch_indexer_select_split(const SplitSelectArgs& a, const DeviceLayout& l, int64_t n,
                                 int64_t splits, size_t final_smem, KernelSmemLimits& smem_limits,
                                 bool pdl, cudaStream_t stream);

// indexer_blocks.cu: grid (n tokens of the group, splits).
void launch_indexer_block_max(const BlockMaxArgs& a, const DeviceLayout& l, int64_t n,
                              int64_t splits, bool pdl, cudaStream_t stream);

// indexer_blocks.cu: one block per token of the group; smem is the bitmap's (0 when global).
void launch_indexer_candidate_list(const CandidateListArgs& a, const DeviceLayout& l, int64_t n,
                                   size_t smem, KernelSmemLimits& smem_limits, bool pdl,
                                   cudaStream_t stream);

}  // namespace deepinfer::cuda
