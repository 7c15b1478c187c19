// Ring and slot arithmetic of the KV layout.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kv/cache_geometry.h"

namespace deepinfer::kv {
namespace {

TEST(CacheGeometry, RingLengths) {
  EXPECT_EQ(swa_ring_len(128, 6), 134);
  EXPECT_EQ(compressor_ring_len(128, false, 6), 133);  // HCA
  EXPECT_EQ(compressor_ring_len(4, true, 6), 13);      // CSA: 2m + backtrack - 1
  EXPECT_EQ(ring_index(0, 134), 0);
  EXPECT_EQ(ring_index(133, 134), 133);
  EXPECT_EQ(ring_index(134, 134), 0);
  EXPECT_EQ(ring_index(1000, 134), 1000 % 134);
}

TEST(CacheGeometry, SlidingRingKeepsTheWindowAndTheBacktrack) {
  // After writing positions 0..p, every position in the window (p - W, p] plus `backtrack`
  // older ones still sits in its own ring slot: no two of them share a slot.
  const int w = 128, backtrack = 6, len = swa_ring_len(w, backtrack);
  for (int64_t p : {127, 128, 500, 1023}) {
    std::set<int> slots;
    for (int64_t q = p - w - backtrack + 1; q <= p; ++q) {
      if (q < 0) continue;
      EXPECT_TRUE(slots.insert(ring_index(q, len)).second) << p << " " << q;
    }
  }
}

TEST(CacheGeometry, CompressorRingSurvivesRollback) {
  // Writing drafts at [ctx, ctx + backtrack) and rolling back to any new_ctx in (ctx, ctx +
  // backtrack] must leave the rows of the 2m - 1 positions before new_ctx intact.
  for (int m : {4, 8, 128}) {
    for (bool overlap : {false, true}) {
      const int backtrack = 6, len = compressor_ring_len(m, overlap, backtrack);
      const int need = (overlap ? 2 * m : m) - 1;
      for (int64_t ctx = 0; ctx < 3 * m; ++ctx) {
        for (int64_t new_ctx = ctx + 1; new_ctx <= ctx + backtrack; ++new_ctx) {
          for (int64_t q = std::max<int64_t>(0, new_ctx - need); q < ctx; ++q) {
            for (int64_t d = ctx; d < ctx + backtrack; ++d) {
              EXPECT_NE(ring_index(q, len), ring_index(d, len))
                  << m << " " << ctx << " " << q << " " << d;
            }
          }
        }
      }
    }
  }
}

TEST(CacheGeometry, EntriesAndBlocks) {
  EXPECT_EQ(entries_per_block(4), 32);
  EXPECT_EQ(entries_per_block(128), 1);
  EXPECT_EQ(entries_per_block(8), 16);
  EXPECT_THROW(entries_per_block(3), Error);
  EXPECT_THROW(entries_per_block(256), Error);
  EXPECT_EQ(num_entries(7, 4), 1);
  EXPECT_EQ(num_entries(8, 4), 2);
  EXPECT_EQ(visible_entries(6, 4), 1);  // window 1 = tokens 4..7 is not complete at p = 6
  EXPECT_EQ(visible_entries(7, 4), 2);
  EXPECT_EQ(blocks_for_tokens(0), 0);
  EXPECT_EQ(blocks_for_tokens(1), 1);
  EXPECT_EQ(blocks_for_tokens(128), 1);
  EXPECT_EQ(blocks_for_tokens(129), 2);
}

TEST(CacheGeometry, EntryRowFollowsTheBlockTable) {
  const std::vector<int32_t> table = {7, 3, 9};
  const int epb = entries_per_block(4);  // 32 entries per block
  EXPECT_EQ(entry_row(table, 0, epb), 7 * 32);
  EXPECT_EQ(entry_row(table, 31, epb), 7 * 32 + 31);
  EXPECT_EQ(entry_row(table, 32, epb), 3 * 32);
  EXPECT_EQ(entry_row(table, 95, epb), 9 * 32 + 31);
  EXPECT_THROW(entry_row(table, 96, epb), Error);
}

}  // namespace
}  // namespace deepinfer::kv
