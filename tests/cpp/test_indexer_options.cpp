// The indexer's A/B switch DEEPINFER_INDEXER_FP8_SCORES (cuda/indexer/indexer_options.h), parsed
// on the host as the CUDA backend parses it at its creation: unset or empty is the default
// (wgmma_persistent_fp8), each kernel's name chooses it, anything else is refused (the backend
// then throws naming the variable and the value).
#include <gtest/gtest.h>

#include <optional>

#include "cuda/indexer/indexer_options.h"

namespace deepinfer::cuda {
namespace {

TEST(IndexerOptions, Fp8ScoresSwitchParses) {
  EXPECT_EQ(parse_indexer_fp8_scores(nullptr), IndexerFp8Scores::kWgmmaPersistentFp8);
  EXPECT_EQ(parse_indexer_fp8_scores(""), IndexerFp8Scores::kWgmmaPersistentFp8);
  EXPECT_EQ(parse_indexer_fp8_scores("wgmma_persistent_cvt"),
            IndexerFp8Scores::kWgmmaPersistentCvt);
  EXPECT_EQ(parse_indexer_fp8_scores("wgmma_persistent"), IndexerFp8Scores::kWgmmaPersistent);
  EXPECT_EQ(parse_indexer_fp8_scores("wgmma_persistent_fp8"),
            IndexerFp8Scores::kWgmmaPersistentFp8);
  EXPECT_EQ(parse_indexer_fp8_scores("wgmma"), IndexerFp8Scores::kWgmma);
  EXPECT_EQ(parse_indexer_fp8_scores("mma_sync"), IndexerFp8Scores::kMmaSync);
  EXPECT_EQ(parse_indexer_fp8_scores("wgmma_pipelined"), IndexerFp8Scores::kWgmmaPipelined);
}

TEST(IndexerOptions, Fp8ScoresSwitchRefusesOtherNames) {
  for (const char* bad : {"mma", "WGMMA", "mma_sync ", "legacy", "1", "pipelined"}) {
    EXPECT_EQ(parse_indexer_fp8_scores(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace deepinfer::cuda
