// How indexer_topk is cut into launches: whether a token's scores fit in the select kernel's
// shared memory, how many tokens share one scratch allocation, and how many blocks score one
// token. Host code on shapes only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

// Scratch scores of one group of tokens at most: the tokens of a call are scored and selected
// in groups that fit.
constexpr int64_t kScoreScratchBytes = int64_t{256} << 20;

struct IndexerProblem {
  int64_t tokens;
  int64_t heads;
  int64_t dim;
  int64_t top_k;
  int64_t bound;  // max entries of a sequence: max_blocks_per_seq * epb (> 0)
};

struct IndexerConfig {
  int64_t cap;             // pairs the select kernel collects: min(top_k, bound)
  size_t score_smem;       // the score kernel's shared memory
  size_t select_min_smem;  // the select kernel's with the scores left in global memory
  bool fits;               // both kernels fit the device's shared memory
  bool scores_in_smem;     // the select kernel copies a token's scores into shared memory
  size_t select_smem;
  int64_t group;   // tokens per launch pair
  int64_t splits;  // score blocks per token
};

inline IndexerConfig choose_indexer(const IndexerProblem& p, int num_sms, size_t max_smem) {
  IndexerConfig c{};
  c.score_smem = score_smem_bytes(p.heads, p.dim);
  c.cap = std::min<int64_t>(p.top_k, p.bound);
  c.select_min_smem = select_smem_bytes(c.cap, p.bound, false);
  c.fits = c.score_smem <= max_smem && c.select_min_smem <= max_smem;
  c.scores_in_smem = select_smem_bytes(c.cap, p.bound, true) <= max_smem;
  c.select_smem = select_smem_bytes(c.cap, p.bound, c.scores_in_smem);
  // Tokens per launch, so that the scratch scores stay within kScoreScratchBytes.
  c.group = std::max<int64_t>(1, std::min<int64_t>(p.tokens, kScoreScratchBytes / (p.bound * 4)));
  // Splits per token: enough blocks for two waves, no more than the tiles of the bound.
  const int64_t tiles = (p.bound + kScoreKeys - 1) / kScoreKeys;
  const int64_t want = (2 * static_cast<int64_t>(num_sms) + c.group - 1) / c.group;
  c.splits = std::max<int64_t>(1, std::min({want, tiles, int64_t{65535}}));
  return c;
}

}  // namespace deepinfer::cuda
