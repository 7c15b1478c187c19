// The KV host tier's pinned arena on CUDA: Backend::allocate_pinned_host returns page-locked
// memory (cudaPointerGetAttributes says so, for the arena and the blocks carved from it), device
// copies to and from it run directly and round-trip bit for bit, and the backend holds a direct
// copy's owner until the copy ran. Prints the host -> device bandwidth of direct and staged
// copies (no threshold: the number is for the log). Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "device_backends.h"
#include "kv/cache_geometry.h"
#include "kv/host_block_cache.h"
#include "kv/prefix_index.h"

namespace deepinfer::backend_ops {
namespace {

bool page_locked(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

class PinnedHostTier : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cuda_ = shared_backend("cuda", &why);
    if (cuda_ == nullptr && device_required()) FAIL() << why;
    if (cuda_ == nullptr) GTEST_SKIP() << why;
  }
  Backend& gpu() { return *cuda_; }
  Backend* cuda_ = nullptr;
};

// A host tensor of `n` bytes (as u8) over `owner`'s memory at `offset`, holding `owner`.
Tensor view(const std::shared_ptr<HostBuffer>& owner, size_t offset, int64_t n) {
  return Tensor(Storage::borrow(owner->data() + offset, static_cast<size_t>(n),
                                Device{DeviceKind::kCpu, 0}, owner),
                DType::kU8, {n});
}

TEST_F(PinnedHostTier, ArenaAndItsBlocksArePageLocked) {
  HostBuffer buf = gpu().allocate_pinned_host(64u << 20);
  ASSERT_NE(buf.data(), nullptr);
  EXPECT_TRUE(buf.pinned());
  EXPECT_TRUE(page_locked(buf.data()));
  EXPECT_TRUE(page_locked(buf.data() + buf.size() - 1));
  std::vector<uint8_t> pageable(4096);
  EXPECT_FALSE(page_locked(pageable.data()));

  auto arena = std::make_shared<kv::ArenaHostAllocator>(std::move(buf));
  kv::HostBlockCache cache(64u << 20, arena);
  std::vector<int32_t> tokens(kv::kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 0);
  const kv::BlockKey key{kv::chain_hash(kv::kRootHash, tokens), kv::kRootHash, tokens};
  const std::vector<uint8_t> payload(3u << 20, 0x3c);
  ASSERT_EQ(cache.insert(key, payload), kv::HostInsertResult::kInserted);
  auto block = cache.lookup(key);
  ASSERT_NE(block, nullptr);
  EXPECT_TRUE(page_locked(block->bytes().data()));
  const kv::HostBlockCacheStats s = cache.stats();
  EXPECT_TRUE(s.arena_pinned);
  EXPECT_EQ(s.arena_bytes, 64u << 20);
}

TEST_F(PinnedHostTier, DirectCopiesRoundTripAndHoldTheirOwner) {
  constexpr int64_t kBytes = 8 << 20;
  std::vector<uint8_t> src(static_cast<size_t>(kBytes));
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  Tensor host_src(Storage::borrow(src.data(), src.size(), Device{DeviceKind::kCpu, 0}, nullptr),
                  DType::kU8, {kBytes});
  Tensor dev = gpu().upload(host_src, DType::kU8);

  // Device -> pinned: lands in the arena directly.
  auto arena = std::make_shared<HostBuffer>(gpu().allocate_pinned_host(2 * kBytes));
  ASSERT_TRUE(arena->pinned());
  gpu().copy_to_host(dev, view(arena, 0, kBytes));
  gpu().record_event()->wait();
  EXPECT_EQ(std::memcmp(arena->data(), src.data(), src.size()), 0);

  // Pinned -> device on the copy stream, read in place: the backend holds the owner until the
  // copy has run, even when the caller drops its own handle at once.
  std::weak_ptr<HostBuffer> watch = arena;
  Tensor back = gpu().zeros({kBytes}, DType::kU8);
  gpu().begin_copies();
  gpu().upload_pinned_into_on_copy_stream(back, view(arena, 0, kBytes));
  std::unique_ptr<Event> copied = gpu().record_copy_event();
  arena.reset();
  EXPECT_FALSE(watch.expired());
  gpu().wait_event(*copied);
  Tensor got = gpu().to_host(back);
  EXPECT_EQ(std::memcmp(got.raw_data(), src.data(), src.size()), 0);
  gpu().begin_copies();  // reclaims what completed copies held
  EXPECT_TRUE(watch.expired());
}

TEST_F(PinnedHostTier, HostToDeviceBandwidthDirectVersusStaged) {
  constexpr int64_t kBytes = 256 << 20;
  auto pinned = std::make_shared<HostBuffer>(gpu().allocate_pinned_host(kBytes));
  std::memset(pinned->data(), 1, kBytes);
  std::vector<uint8_t> pageable(static_cast<size_t>(kBytes), 1);
  Tensor dst = gpu().empty({kBytes}, DType::kU8);
  Tensor pageable_view(
      Storage::borrow(pageable.data(), pageable.size(), Device{DeviceKind::kCpu, 0}, nullptr),
      DType::kU8, {kBytes});
  auto time = [&](bool direct) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      gpu().synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      gpu().begin_copies();
      if (direct)
        gpu().upload_pinned_into_on_copy_stream(dst, view(pinned, 0, kBytes));
      else
        gpu().upload_into_on_copy_stream(dst, pageable_view);
      gpu().record_copy_event()->wait();
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return static_cast<double>(kBytes) / best / 1e9;
  };
  const double direct = time(true), staged = time(false);
  std::printf("host -> device, 256 MiB: pinned arena %.1f GB/s, staged from pageable %.1f GB/s\n",
              direct, staged);
  EXPECT_GT(direct, 0.0);
}

}  // namespace
}  // namespace deepinfer::backend_ops
