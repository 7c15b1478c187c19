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

#include "cuda_test.h"
#include "deepinfer/backend.h"
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

using PinnedHostTier = CudaTest;

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

// A KV import's shape: many small views of one device buffer, read from pinned host memory in
// one batch (plus a pageable source and an empty view, which take the staged path or none).
// Every byte lands where its view says, and the owners live until the copies ran. Prints the
// host time of the batch against one upload per view (no threshold: for the log).
TEST_F(PinnedHostTier, BatchedUploadsLandLikeSingleOnes) {
  constexpr int kViews = 700;
  std::vector<int64_t> offsets, sizes;
  int64_t total = 0;
  for (int i = 0; i < kViews; ++i) {
    const int64_t n = i == 5 ? 0 : 16 * (1 + (i * 37) % 300) + (i % 3);  // some odd sizes
    offsets.push_back(total);
    sizes.push_back(n);
    total += n;
  }
  auto arena = std::make_shared<HostBuffer>(gpu().allocate_pinned_host(static_cast<size_t>(total)));
  ASSERT_TRUE(arena->pinned());
  for (int64_t i = 0; i < total; ++i) arena->data()[i] = static_cast<uint8_t>((i * 131) >> 3);
  std::vector<uint8_t> pageable(4096);
  for (size_t i = 0; i < pageable.size(); ++i) pageable[i] = static_cast<uint8_t>(255 - i % 251);
  Tensor dev = gpu().zeros({total + 4096}, DType::kU8);
  std::vector<Tensor> dsts, srcs;
  for (int i = 0; i < kViews; ++i) {
    dsts.push_back(dev.narrow(0, offsets[static_cast<size_t>(i)], sizes[static_cast<size_t>(i)]));
    srcs.push_back(view(arena, static_cast<size_t>(offsets[static_cast<size_t>(i)]),
                        sizes[static_cast<size_t>(i)]));
  }
  dsts.push_back(dev.narrow(0, total, 4096));
  srcs.push_back(Tensor(
      Storage::borrow(pageable.data(), pageable.size(), Device{DeviceKind::kCpu, 0}, nullptr),
      DType::kU8, {4096}));

  std::weak_ptr<HostBuffer> watch = arena;
  const std::vector<uint8_t> expect(arena->data(), arena->data() + total);
  gpu().begin_copies();
  const auto t0 = std::chrono::steady_clock::now();
  gpu().upload_pinned_batch_on_copy_stream(dsts, srcs);
  const double batch_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::unique_ptr<Event> copied = gpu().record_copy_event();
  srcs.clear();
  arena.reset();
  EXPECT_FALSE(watch.expired());
  gpu().wait_event(*copied);
  Tensor got = gpu().to_host(dev);
  const auto* bytes = static_cast<const uint8_t*>(got.raw_data());
  EXPECT_EQ(std::memcmp(bytes, expect.data(), expect.size()), 0);
  EXPECT_EQ(std::memcmp(bytes + total, pageable.data(), pageable.size()), 0);
  gpu().begin_copies();
  EXPECT_TRUE(watch.expired());

  // The same views one call each, for the log.
  auto again = std::make_shared<HostBuffer>(gpu().allocate_pinned_host(static_cast<size_t>(total)));
  gpu().synchronize();
  gpu().begin_copies();
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kViews; ++i) {
    gpu().upload_pinned_into_on_copy_stream(
        dsts[static_cast<size_t>(i)],
        view(again, static_cast<size_t>(offsets[static_cast<size_t>(i)]),
             sizes[static_cast<size_t>(i)]));
  }
  const double single_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  gpu().record_copy_event()->wait();
  std::printf("%d views (%.1f MB) host time: batched %.3f ms, one call per view %.3f ms\n", kViews,
              static_cast<double>(total) / 1e6, batch_s * 1e3, single_s * 1e3);
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
