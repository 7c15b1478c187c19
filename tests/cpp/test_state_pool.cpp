// StatePool: lowest-id-first slot allocation over an id range, and release checks.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "deepinfer/error.h"
#include "error_message.h"
#include "kv/state_pool.h"

namespace deepinfer::kv {
namespace {

using testing::error_code_of;

TEST(StatePool, RejectsSlotZeroAndNegativeCounts) {
  EXPECT_EQ(error_code_of([] { StatePool p(0, 4); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([] { StatePool p(1, -1); }), ErrorCode::kInvalidArgument);
  StatePool empty(1, 0);  // e.g. prefix-cache snapshots disabled
  EXPECT_EQ(empty.capacity(), 0);
  EXPECT_EQ(empty.allocate(), std::nullopt);
  empty.check_invariants();
}

TEST(StatePool, AllocatesLowestFreeIdFirst) {
  StatePool pool(1, 4);
  EXPECT_EQ(pool.capacity(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  for (int32_t want = 1; want <= 4; ++want) EXPECT_EQ(pool.allocate(), want);
  EXPECT_EQ(pool.allocate(), std::nullopt);
  EXPECT_EQ(pool.num_used(), 4);
  pool.release(3);
  pool.release(1);
  pool.check_invariants();
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 3);
  pool.check_invariants();
}

TEST(StatePool, ManagesOnlyItsOwnRange) {
  // Two pools sharing one cache tensor: live slots [1, 4), snapshot slots [4, 7).
  StatePool live(1, 3);
  StatePool snapshots(4, 3);
  EXPECT_EQ(snapshots.allocate(), 4);
  EXPECT_TRUE(snapshots.is_allocated(4));
  EXPECT_FALSE(live.is_allocated(4));
  EXPECT_FALSE(snapshots.is_allocated(1));
  EXPECT_FALSE(snapshots.is_allocated(0));
  EXPECT_EQ(error_code_of([&] { live.release(4); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { snapshots.release(7); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { snapshots.release(0); }), ErrorCode::kInvalidArgument);
  snapshots.release(4);
  live.check_invariants();
  snapshots.check_invariants();
}

TEST(StatePool, ReleaseOfAFreeSlotThrows) {
  StatePool pool(1, 3);
  const int32_t s = *pool.allocate();
  pool.release(s);
  EXPECT_EQ(error_code_of([&] { pool.release(s); }), ErrorCode::kInternal);
  EXPECT_EQ(error_code_of([&] { pool.release(2); }), ErrorCode::kInternal);
  EXPECT_EQ(pool.num_free(), 3);
  pool.check_invariants();
}

TEST(StatePool, RandomOperationsMatchASortedSet) {
  constexpr int kFirst = 5, kCount = 17;
  StatePool pool(kFirst, kCount);
  std::set<int32_t> free_ref;
  for (int32_t s = kFirst; s < kFirst + kCount; ++s) free_ref.insert(s);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> slot_dist(kFirst - 1, kFirst + kCount);
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2 == 0) {
      const std::optional<int32_t> got = pool.allocate();
      if (free_ref.empty()) {
        ASSERT_EQ(got, std::nullopt);
      } else {
        ASSERT_EQ(got, *free_ref.begin()) << "step " << step;
        free_ref.erase(free_ref.begin());
      }
    } else {
      const int32_t s = slot_dist(rng);
      const bool in_range = s >= kFirst && s < kFirst + kCount;
      ASSERT_EQ(pool.is_allocated(s), in_range && !free_ref.contains(s)) << "step " << step;
      if (pool.is_allocated(s)) {
        pool.release(s);
        free_ref.insert(s);
      } else {
        EXPECT_THROW(pool.release(s), Error);
      }
    }
    ASSERT_NO_THROW(pool.check_invariants()) << "step " << step;
    ASSERT_EQ(pool.num_free(), static_cast<int>(free_ref.size()));
  }
}

}  // namespace
}  // namespace deepinfer::kv
