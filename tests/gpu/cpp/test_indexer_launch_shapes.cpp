// The indexer ops' launch shapes (cuda/indexer/indexer_heuristics.h) at cuda_op_bench's shapes,
// checked on the host: every grid within CUDA's limits (x and y at least 1, y at most 65535) and
// every kernel's shared memory within an H200's opt-in limit. A bad shape is a launch error
// that only the GPU reports. Runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/indexer/indexer_heuristics.h"

namespace deepinfer::cuda {
namespace {

constexpr int kH200Sms = 132;
constexpr size_t kH200MaxSmem = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
constexpr int64_t kHeads = 32;           // V4.1's index heads of 128 channels
constexpr int64_t kDim = 128;
constexpr int64_t kBlockEntries = 8;
constexpr int64_t kTopBlocks = 2048;
constexpr int64_t kTopK = 512;

void expect_launchable(const IndexerProblem& p, const std::string& what) {
  const IndexerConfig c = choose_indexer(p, kH200Sms, kH200MaxSmem);
  ASSERT_TRUE(c.fits) << what;
  EXPECT_GE(c.group, 1) << what;
  EXPECT_LE(c.group, std::max<int64_t>(p.tokens, 1)) << what;
  EXPECT_GE(c.splits, 1) << what;
  EXPECT_LE(c.splits, 65535) << what;
  EXPECT_LE(c.group * c.splits, int64_t{1} << 31) << what;
  EXPECT_LE(c.score_smem, kH200MaxSmem) << what;
  EXPECT_LE(c.select_smem, kH200MaxSmem) << what;
  EXPECT_GE(c.cap, 1) << what;
  EXPECT_EQ(c.mma, score_mma_takes(p)) << what;
}

TEST(IndexerLaunchShapes, BenchShapesAreLaunchable) {
  for (const int64_t ctx : {32768, 131072}) {
    for (const int64_t batch : {1, 64, 1024}) {
      for (const KvFormat keys : {KvFormat::kF32, KvFormat::kBf16, KvFormat::kFp8}) {
        const std::string what = "ctx " + std::to_string(ctx) + " batch " + std::to_string(batch) +
                                 " keys " + std::to_string(static_cast<int>(keys));
        const int64_t block_row = (ctx + kBlockEntries - 1) / kBlockEntries;
        // indexer_candidates (indexer_candidates.cu): entries scored, blocks selected.
        const IndexerProblem blocks{
            batch, kHeads, kDim, kTopBlocks, ctx, block_row, (ctx + block_row) * 4, keys, false};
        expect_launchable(blocks, "indexer_candidates " + what);
        const IndexerConfig c = choose_indexer(blocks, kH200Sms, kH200MaxSmem);
        const int64_t bm = block_max_splits(c.group, block_row, kH200Sms);
        EXPECT_GE(bm, 1);
        EXPECT_LE(bm, 65535);
        // indexer_topk_in_candidates: the candidate entries of kTopBlocks blocks.
        const int64_t row = std::min(ctx, kTopBlocks * kBlockEntries);
        const int64_t words = (block_row + 31) / 32;
        EXPECT_TRUE(candidate_bitmap_in_smem(words, kH200MaxSmem)) << what;
        const IndexerProblem listed{
            batch, kHeads, kDim, kTopK, row, row, (row + kTopBlocks + 1) * 4, keys, true};
        expect_launchable(listed, "indexer_topk_in_candidates " + what);
        EXPECT_FALSE(choose_indexer(listed, kH200Sms, kH200MaxSmem).mma) << what;
        // indexer_topk.
        expect_launchable(topk_problem(batch, kHeads, kDim, kTopK, ctx, keys),
                          "indexer_topk " + what);
      }
    }
  }
}

TEST(IndexerLaunchShapes, TensorCoresScoreVisibleEntriesOfBf16AndFp8Keys) {
  for (const int64_t heads : {16, 32, 64}) {
    EXPECT_TRUE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kBf16)));
    EXPECT_TRUE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kFp8)));
    EXPECT_FALSE(score_mma_takes(topk_problem(1, heads, kDim, kTopK, 4096, KvFormat::kF32)));
  }
  EXPECT_FALSE(score_mma_takes(topk_problem(1, 48, kDim, kTopK, 4096, KvFormat::kBf16)));
  EXPECT_FALSE(score_mma_takes(topk_problem(1, 32, 64, kTopK, 4096, KvFormat::kBf16)));
  // Forcing the CUDA cores always wins.
  EXPECT_FALSE(choose_indexer(topk_problem(1, 32, kDim, kTopK, 4096, KvFormat::kBf16), kH200Sms,
                              kH200MaxSmem, IndexerScoreKernel::kCudaCore)
                   .mma);
}

}  // namespace
}  // namespace deepinfer::cuda
