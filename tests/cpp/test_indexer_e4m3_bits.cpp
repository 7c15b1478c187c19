// The persistent indexer kernel's tile ranges (cuda/indexer/indexer_e4m3_bits.h), checked on the
// host: the block ranges cover the flattened tiles once, in order, evenly. (Its integer e4m3
// conversion is checked in test_e4m3_bits.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "cuda/indexer/indexer_e4m3_bits.h"

namespace deepinfer::cuda::indexer_e4m3 {
namespace {

TEST(IndexerE4m3Bits, TileRangesCoverTheTilesOnceAndEvenly) {
  for (const int64_t total : {0, 1, 5, 128, 131, 132, 133, 8192, 32768 + 7}) {
    for (const int64_t ctas : {1, 7, 132}) {
      int64_t next = 0, least = total, most = 0;
      for (int64_t c = 0; c < ctas; ++c) {
        const TileRange r = persistent_tile_range(total, ctas, c);
        EXPECT_EQ(r.first, next) << total << " over " << ctas;
        EXPECT_GE(r.count, 0);
        next = r.first + r.count;
        least = std::min(least, r.count);
        most = std::max(most, r.count);
      }
      EXPECT_EQ(next, total) << total << " over " << ctas;
      EXPECT_LE(most - least, 1) << total << " over " << ctas;
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda::indexer_e4m3
