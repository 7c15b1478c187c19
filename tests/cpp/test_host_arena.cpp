// The host tier's arena: the first-fit allocator over one HostBuffer (reuse after free, merging,
// alignment), the cache on it (a full arena evicts LRU blocks, a held payload keeps its memory,
// blocks filled in place and adopted without a copy), concurrent use by several threads (the
// engine thread, the fetch pool, the store writer), and the CPU backend's allocate_pinned_host and
// upload_pinned_into_on_copy_stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "cpu_test_util.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "kv/host_block_cache.h"
#include "kv/prefix_index.h"

namespace deepinfer::kv {
namespace {

struct Chain {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<BlockHash> hashes, parents;
  explicit Chain(int n) {
    BlockHash parent = kRootHash;
    for (int b = 0; b < n; ++b) {
      std::vector<int32_t> t(16);
      std::iota(t.begin(), t.end(), b * 16);
      hashes.push_back(chain_hash(parent, t));
      parents.push_back(parent);
      tokens.push_back(std::move(t));
      parent = hashes.back();
    }
  }
  BlockKey key(int b) const {
    const auto i = static_cast<size_t>(b);
    return {hashes[i], parents[i], tokens[i]};
  }
};

std::vector<uint8_t> pattern(int b, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(b * 37 + static_cast<int>(i * 7));
  return v;
}

std::vector<uint8_t> copy_of(const HostBlock& b) {
  return {b.bytes().begin(), b.bytes().end()};
}

std::shared_ptr<ArenaHostAllocator> arena(size_t bytes, size_t alignment = 256) {
  return std::make_shared<ArenaHostAllocator>(HostBuffer::ordinary(bytes), alignment);
}

TEST(HostArena, ReusesFreedMemoryAndAligns) {
  auto a = arena(4096);
  EXPECT_FALSE(a->pinned());
  EXPECT_EQ(a->capacity(), 4096u);
  auto* p0 = static_cast<uint8_t*>(a->allocate(1000));
  auto* p1 = static_cast<uint8_t*>(a->allocate(1000));
  ASSERT_NE(p0, nullptr);
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(p1 - p0, 1024);  // rounded up to the alignment
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p1) % 256, 0u);
  EXPECT_EQ(a->used_bytes(), 2048u);
  a->deallocate(p0, 1000);
  EXPECT_EQ(a->allocate(1000), p0);  // first fit: the freed run comes back
  EXPECT_NE(a->allocate(2048), nullptr);
  EXPECT_EQ(a->used_bytes(), 4096u);
  EXPECT_EQ(a->allocate(1), nullptr);  // full
  EXPECT_EQ(a->allocate(8192), nullptr);
  EXPECT_THROW(ArenaHostAllocator(HostBuffer::ordinary(64), 3), Error);
}

TEST(HostArena, MergesFreedNeighboursSoALargerPayloadFits) {
  auto a = arena(4096);
  std::vector<void*> p;
  for (int i = 0; i < 4; ++i) p.push_back(a->allocate(1024));
  EXPECT_EQ(a->allocate(2048), nullptr);
  a->deallocate(p[2], 1024);
  a->deallocate(p[1], 1024);  // merges with the run after it
  EXPECT_EQ(a->allocate(2048), p[1]);
  a->deallocate(p[1], 2048);
  a->deallocate(p[3], 1024);
  a->deallocate(p[0], 1024);  // merges on both sides: the whole arena again
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(a->allocate(4096), p[0]);
}

TEST(HostArena, FullArenaEvictsLruBlocksAndReusesTheirMemory) {
  // Room for three 1000-byte blocks in the arena; the byte capacity alone would allow ten, so
  // the arena is what runs out.
  auto a = arena(3 * 1024);
  HostBlockCache cache(10000, a);
  const Chain chain(5);
  for (int b = 0; b < 3; ++b)
    ASSERT_EQ(cache.insert(chain.key(b), pattern(b, 1000)), HostInsertResult::kInserted);
  const uint8_t* slot0 = cache.lookup(chain.key(0))->bytes().data();
  ASSERT_NE(cache.lookup(chain.key(1)), nullptr);
  ASSERT_NE(cache.lookup(chain.key(0)), nullptr);  // LRU order now: 2, 1, 0
  EXPECT_EQ(cache.insert(chain.key(3), pattern(3, 1000)), HostInsertResult::kInserted);
  EXPECT_EQ(cache.lookup(chain.key(2)), nullptr);  // the LRU block made room
  auto b3 = cache.lookup(chain.key(3));
  ASSERT_NE(b3, nullptr);
  EXPECT_EQ(copy_of(*b3), pattern(3, 1000));
  auto b0 = cache.lookup(chain.key(0));
  ASSERT_NE(b0, nullptr);
  EXPECT_EQ(b0->bytes().data(), slot0);
  EXPECT_EQ(copy_of(*b0), pattern(0, 1000));
  const HostBlockCacheStats s = cache.stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_EQ(s.arena_bytes, 3u * 1024u);
  EXPECT_FALSE(s.arena_pinned);
  EXPECT_EQ(a->used_bytes(), 3u * 1024u);
}

TEST(HostArena, HeldPayloadKeepsItsMemoryUntilReleased) {
  auto a = arena(2 * 1024);
  HostBlockCache cache(2 * 1024, a);
  const Chain chain(5);
  ASSERT_EQ(cache.insert(chain.key(0), pattern(0, 1000)), HostInsertResult::kInserted);
  ASSERT_EQ(cache.insert(chain.key(1), pattern(1, 1000)), HostInsertResult::kInserted);
  // A copy in flight holds block 0 (as a fetch's owner does); then block 1 is used, so 0 is LRU.
  std::shared_ptr<const HostBlock> in_flight = cache.lookup(chain.key(0));
  ASSERT_NE(in_flight, nullptr);
  ASSERT_NE(cache.lookup(chain.key(1)), nullptr);
  // Evicting 0 frees nothing while it is held, so 1 goes too and block 2 takes 1's memory.
  EXPECT_EQ(cache.insert(chain.key(2), pattern(2, 1000)), HostInsertResult::kInserted);
  EXPECT_EQ(cache.lookup(chain.key(0)), nullptr);
  EXPECT_EQ(cache.lookup(chain.key(1)), nullptr);
  EXPECT_EQ(copy_of(*in_flight), pattern(0, 1000));  // never overwritten
  EXPECT_EQ(cache.stats().evictions, 2u);
  // Released: its memory takes the next block without evicting anything.
  const uint8_t* freed = in_flight->bytes().data();
  in_flight.reset();
  EXPECT_EQ(cache.insert(chain.key(3), pattern(3, 1000)), HostInsertResult::kInserted);
  EXPECT_EQ(cache.stats().evictions, 2u);
  EXPECT_EQ(cache.lookup(chain.key(3))->bytes().data(), freed);
  EXPECT_EQ(copy_of(*cache.lookup(chain.key(2))), pattern(2, 1000));
}

TEST(HostArena, EverythingHeldRejectsTheInsert) {
  auto a = arena(1024);
  HostBlockCache cache(1024, a);
  const Chain chain(2);
  ASSERT_EQ(cache.insert(chain.key(0), pattern(0, 1000)), HostInsertResult::kInserted);
  std::shared_ptr<const HostBlock> held = cache.lookup(chain.key(0));
  EXPECT_EQ(cache.insert(chain.key(1), pattern(1, 1000)), HostInsertResult::kRejected);
  EXPECT_EQ(cache.stats().rejected, 1u);
  EXPECT_EQ(copy_of(*held), pattern(0, 1000));
}

TEST(HostArena, BlocksFilledInPlaceAreAdoptedWithoutACopy) {
  auto a = arena(4 * 1024);
  HostBlockCache cache(4 * 1024, a);
  const Chain chain(3);
  std::shared_ptr<HostBlock> made = cache.make_block(chain.key(0), 1000);
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(cache.stats().blocks, 0u);  // not in the cache until adopted
  EXPECT_EQ(cache.lookup(chain.key(0)), nullptr);
  const std::vector<uint8_t> want = pattern(7, 1000);
  std::memcpy(made->mutable_bytes().data(), want.data(), want.size());
  EXPECT_EQ(cache.insert_block(made), HostInsertResult::kInserted);
  auto got = cache.lookup(chain.key(0));
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->bytes().data(), made->bytes().data());  // the same memory, not a copy
  EXPECT_EQ(copy_of(*got), want);
  EXPECT_EQ(cache.stats().size_bytes, 1000u);
  // A key already held keeps the block it has.
  std::shared_ptr<HostBlock> again = cache.make_block(chain.key(0), 1000);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(cache.insert_block(again), HostInsertResult::kAlreadyPresent);
  EXPECT_EQ(cache.lookup(chain.key(0))->bytes().data(), made->bytes().data());
  again.reset();
  made.reset();
  got.reset();
  // Larger than the capacity: no block.
  EXPECT_EQ(cache.make_block(chain.key(1), 5000), nullptr);
  EXPECT_TRUE(cache.erase(chain.hashes[0]));
  EXPECT_EQ(a->used_bytes(), 0u);
}

TEST(HostArena, ConcurrentInsertsLookupsAndHoldsNeverOverlap) {
  // The engine thread, the fetch pool and the store writer all allocate or free arena memory; a
  // small arena under many threads makes evictions, held blocks and reuse constant.
  constexpr int kBlocks = 48;
  constexpr size_t kPlain = 700, kSnap = 1500;  // two payload sizes, as the tiers use
  auto a = arena(16 * 1024);
  HostBlockCache cache(16 * 1024, a);
  const Chain chain(kBlocks);
  std::atomic<int> bad{0};
  auto size_of = [](int b) { return b % 3 == 0 ? kSnap : kPlain; };
  auto want_of = [&](const HostBlock& h) {
    const auto b = static_cast<int>(std::find(chain.hashes.begin(), chain.hashes.end(), h.hash()) -
                                    chain.hashes.begin());
    return pattern(b, size_of(b));
  };
  auto worker = [&](int seed) {
    uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
    std::vector<std::shared_ptr<const HostBlock>> held;
    for (int op = 0; op < 3000; ++op) {
      x = x * 1664525u + 1013904223u;
      const int b = static_cast<int>((x >> 8) % kBlocks);
      switch ((x >> 24) % 4) {
        case 0:
          cache.insert(chain.key(b), pattern(b, size_of(b)));
          break;
        case 1: {
          std::shared_ptr<HostBlock> m = cache.make_block(chain.key(b), size_of(b));
          if (!m) break;
          const std::vector<uint8_t> want = pattern(b, size_of(b));
          std::memcpy(m->mutable_bytes().data(), want.data(), want.size());
          cache.insert_block(std::move(m));
          break;
        }
        case 2:
          if (auto got = cache.lookup(chain.key(b))) {
            if (copy_of(*got) != pattern(b, size_of(b))) ++bad;
            held.push_back(std::move(got));  // a copy in flight
          }
          break;
        default:
          // A copy finishes (its handle is dropped) and a block leaves the cache.
          if (!held.empty()) {
            if (copy_of(*held.front()) != want_of(*held.front())) ++bad;
            held.erase(held.begin());
          }
          cache.erase(chain.hashes[static_cast<size_t>(b)]);
          break;
      }
      if (held.size() > 3) held.erase(held.begin());
    }
    for (const auto& h : held)
      if (copy_of(*h) != want_of(*h)) ++bad;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  // What the arena still hands out is exactly the cache's blocks (nothing leaked or doubled).
  const HostBlockCacheStats s = cache.stats();
  EXPECT_LE(s.size_bytes, 16u * 1024u);
  uint64_t want_used = 0;
  for (int b = 0; b < kBlocks; ++b) {
    if (auto got = cache.lookup(chain.key(b))) {
      EXPECT_EQ(copy_of(*got), pattern(b, size_of(b)));
      want_used += (got->bytes().size() + 255) / 256 * 256;
    }
  }
  EXPECT_EQ(a->used_bytes(), want_used);
  for (int b = 0; b < kBlocks; ++b) cache.erase(chain.hashes[static_cast<size_t>(b)]);
  EXPECT_EQ(a->used_bytes(), 0u);
}

}  // namespace
}  // namespace deepinfer::kv

namespace deepinfer {
namespace {

class CpuPinnedHostTest : public testing::BackendTest {};

TEST_F(CpuPinnedHostTest, AllocatePinnedHostIsOrdinaryAlignedMemoryOnTheCpu) {
  HostBuffer buf = be->allocate_pinned_host(10000);
  ASSERT_NE(buf.data(), nullptr);
  EXPECT_EQ(buf.size(), 10000u);
  EXPECT_FALSE(buf.pinned());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 4096, 0u);
  std::memset(buf.data(), 0x5a, buf.size());
  uint8_t* data = buf.data();
  HostBuffer moved = std::move(buf);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(buf.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved.data()[9999], 0x5a);
}

TEST_F(CpuPinnedHostTest, UploadPinnedIntoCopyStreamCopiesTheBytes) {
  HostBuffer buf = be->allocate_pinned_host(6 * sizeof(float));
  const std::vector<float> want = {1, -2, 3.5f, 4, 5, 6};
  std::memcpy(buf.data(), want.data(), buf.size());
  auto owner = std::make_shared<HostBuffer>(std::move(buf));
  Tensor host(Storage::borrow(owner->data(), owner->size(), Device{DeviceKind::kCpu, 0}, owner),
              DType::kF32, {2, 3});
  Tensor dst = be->zeros({2, 3}, DType::kF32);
  be->begin_copies();
  be->upload_pinned_into_on_copy_stream(dst, host);
  std::unique_ptr<Event> done = be->record_copy_event();
  be->wait_event(*done);
  EXPECT_EQ(testing::fetch_f32(*be, dst), want);
  // A shape mismatch names the argument.
  EXPECT_THROW(be->upload_pinned_into_on_copy_stream(be->zeros({3, 2}, DType::kF32), host), Error);
}

TEST_F(CpuPinnedHostTest, BatchedUploadCopiesEveryPairAndNamesABadOne) {
  HostBuffer buf = be->allocate_pinned_host(10 * sizeof(float));
  const std::vector<float> want = {1, -2, 3.5f, 4, 5, 6, 7, 8, 9, 10};
  std::memcpy(buf.data(), want.data(), buf.size());
  auto owner = std::make_shared<HostBuffer>(std::move(buf));
  auto host_at = [&](int64_t first, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return Tensor(Storage::borrow(owner->data() + first * 4, static_cast<size_t>(n) * 4,
                                  Device{DeviceKind::kCpu, 0}, owner),
                  DType::kF32, std::move(shape));
  };
  Tensor a = be->zeros({2, 3}, DType::kF32), b = be->zeros({4}, DType::kF32);
  const std::vector<Tensor> dsts = {a, b}, hosts = {host_at(0, {2, 3}), host_at(6, {4})};
  be->begin_copies();
  be->upload_pinned_batch_on_copy_stream(dsts, hosts);
  be->wait_event(*be->record_copy_event());
  EXPECT_EQ(testing::fetch_f32(*be, a), std::vector<float>(want.begin(), want.begin() + 6));
  EXPECT_EQ(testing::fetch_f32(*be, b), std::vector<float>(want.begin() + 6, want.end()));
  // Lengths that differ, and a pair whose shapes differ: each error names what is wrong.
  try {
    be->upload_pinned_batch_on_copy_stream(dsts, std::vector<Tensor>{hosts[0]});
    ADD_FAILURE() << "no error for lists of different lengths";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same length"), std::string::npos) << e.what();
  }
  try {
    be->upload_pinned_batch_on_copy_stream(dsts, std::vector<Tensor>{hosts[0], host_at(6, {2, 2})});
    ADD_FAILURE() << "no error for a pair of different shapes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hosts[1]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
