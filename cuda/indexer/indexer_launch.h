// The lightning indexer's kernels (docs/model.md#lightning-indexer): their tile constants,
// arguments, shared-memory sizes and launches. indexer_topk.cu chooses the config
// (indexer_heuristics.h) and calls these.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cache/kv_record.cuh"
#include "cuda/common/layout.cuh"

namespace deepinfer::cuda {

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kScoreKeys = 32;  // entries per tile: one per lane
constexpr int kScoreHeads = 8;  // heads per register group of a thread
constexpr int kSelectThreads = 512;

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
  KvRowFormat key;       // the index cache's rows: f32, bf16 or fp8 index-key records
  float* scores;         // [tokens of the group, bound]
  int64_t bound;         // max entries of a sequence: max_blocks_per_seq * epb
  int64_t cache_rows;
  int token0;  // first token of the group
  int heads;
  int dim;  // a multiple of 4
  int ratio;
  int epb;
  float score_scale;
  float weight_scale;
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

// Shared memory of the tensor-core kernel: per stage the keys' channels (fp8 or bf16), their
// scales and mapped flags; the head groups' partial scores.
inline size_t score_mma_smem_bytes(int64_t heads, KvFormat format) {
  const int64_t elem = format == KvFormat::kFp8 ? 1 : 2;
  const int64_t stage = kMmaKeys * (kMmaDim * elem + sizeof(float) + sizeof(int));
  return static_cast<size_t>(kMmaStages * stage +
                             heads / kMmaHeadsPerWarp * kMmaKeys * sizeof(float));
}

struct SelectArgs {
  const float* scores;  // [tokens of the group, bound]
  int32_t* out;         // [T, top_k]
  int64_t bound;
  int64_t cap;  // pairs buf can hold: min(top_k, bound)
  int token0;
  int top_k;
  int ratio;
  bool scores_in_smem;
};

inline size_t select_smem_bytes(int64_t cap, int64_t bound, bool scores_in_smem) {
  size_t bytes =
      static_cast<size_t>(cap) * sizeof(uint64_t) + 256 * sizeof(uint32_t) + 40 * sizeof(int);
  if (scores_in_smem) bytes += static_cast<size_t>(bound) * sizeof(float);
  return bytes;
}

// indexer_score.cu: grid (n tokens of the group, splits).
void launch_indexer_score(const ScoreArgs& a, const DeviceLayout& l, int64_t n, int64_t splits,
                          size_t smem, cudaStream_t stream);

// indexer_score_mma.cu: the same scores on tensor cores, for bf16 and fp8 keys of kMmaDim
// channels and heads 16, 32 or 64 (score_mma_takes); grid (n, splits) over
// tiles of kMmaKeys. q_one_part: q rounded once, without its lo part (measurement only).
void launch_indexer_score_mma(const ScoreArgs& a, const DeviceLayout& l, int64_t n, int64_t splits,
                              size_t smem, bool q_one_part, cudaStream_t stream);

// indexer_select.cu: one block per token of the group.
void launch_indexer_select(const SelectArgs& a, const DeviceLayout& l, int64_t n, size_t smem,
                           cudaStream_t stream);

}  // namespace deepinfer::cuda
