#include "kv/host_block_cache.h"

#include <cstring>
#include <new>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::kv {

AlignedHostAllocator::AlignedHostAllocator(size_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "AlignedHostAllocator: alignment must be a power of two, got " + std::to_string(alignment));
  }
}

void* AlignedHostAllocator::allocate(size_t bytes) noexcept {
  return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(alignment_), std::nothrow);
}

void AlignedHostAllocator::deallocate(void* ptr, size_t /*bytes*/) noexcept {
  ::operator delete(ptr, std::align_val_t(alignment_));
}

HostBlock::HostBlock(std::shared_ptr<HostAllocator> allocator, void* data, size_t bytes,
                     BlockHash hash, BlockHash parent, std::vector<int32_t> tokens)
    : allocator_(std::move(allocator)),
      data_(static_cast<uint8_t*>(data)),
      size_(bytes),
      hash_(hash),
      parent_(parent),
      tokens_(std::move(tokens)) {}

HostBlock::~HostBlock() {
  allocator_->deallocate(data_, size_);
}

HostBlockCache::HostBlockCache(uint64_t capacity_bytes, std::shared_ptr<HostAllocator> allocator)
    : capacity_(capacity_bytes),
      allocator_(allocator ? std::move(allocator) : std::make_shared<AlignedHostAllocator>()) {}

HostInsertResult HostBlockCache::insert(const BlockKey& key, std::span<const uint8_t> bytes) {
  std::vector<std::shared_ptr<const HostBlock>> evicted;  // released after the lock
  EvictionListener listener;
  HostInsertResult result = HostInsertResult::kInserted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = by_hash_.find(key.hash); it != by_hash_.end()) {
      lru_.splice(lru_.end(), lru_, it->second);
      ++stats_.inserts_existing;
      return HostInsertResult::kAlreadyPresent;
    }
    if (bytes.size() > capacity_) {
      ++stats_.rejected;
      return HostInsertResult::kRejected;
    }
    // Evict first so that an allocator with a fixed arena (pinned memory) can reuse the room.
    while (!lru_.empty() && stats_.size_bytes + bytes.size() > capacity_) {
      std::shared_ptr<HostBlock> victim = std::move(lru_.front());
      lru_.pop_front();
      by_hash_.erase(victim->hash());
      stats_.size_bytes -= victim->bytes().size();
      --stats_.blocks;
      ++stats_.evictions;
      stats_.evicted_bytes += victim->bytes().size();
      evicted.push_back(std::move(victim));
    }
    listener = on_evict_;
    void* data = allocator_->allocate(bytes.size());
    if (data == nullptr) {
      ++stats_.rejected;
      result = HostInsertResult::kRejected;
    } else {
      if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
      std::shared_ptr<HostBlock> block;
      try {
        block =
            std::make_shared<HostBlock>(allocator_, data, bytes.size(), key.hash, key.parent,
                                        std::vector<int32_t>(key.tokens.begin(), key.tokens.end()));
      } catch (...) {
        allocator_->deallocate(data, bytes.size());
        throw;
      }
      lru_.push_back(std::move(block));
      by_hash_.emplace(key.hash, std::prev(lru_.end()));
      stats_.size_bytes += bytes.size();
      ++stats_.blocks;
      ++stats_.inserts;
    }
  }
  if (listener) {
    for (auto& block : evicted) listener(std::move(block));
  }
  return result;
}

std::shared_ptr<const HostBlock> HostBlockCache::lookup(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_hash_.find(key.hash);
  if (it == by_hash_.end() || !key.same_block((*it->second)->parent(), (*it->second)->tokens())) {
    ++stats_.misses;
    return nullptr;
  }
  lru_.splice(lru_.end(), lru_, it->second);
  ++stats_.hits;
  return *it->second;
}

int HostBlockCache::match_prefix(std::span<const BlockHash> hashes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int n = 0;
  for (const BlockHash h : hashes) {
    if (!by_hash_.contains(h)) break;
    ++n;
  }
  return n;
}

std::vector<uint64_t> HostBlockCache::match_prefix_sizes(std::span<const BlockHash> hashes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> sizes;
  for (const BlockHash h : hashes) {
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    sizes.push_back((*it->second)->bytes().size());
  }
  return sizes;
}

bool HostBlockCache::erase(BlockHash hash) {
  std::shared_ptr<HostBlock> gone;  // freed after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return false;
  gone = std::move(*it->second);
  lru_.erase(it->second);
  by_hash_.erase(it);
  stats_.size_bytes -= gone->bytes().size();
  --stats_.blocks;
  return true;
}

void HostBlockCache::set_eviction_listener(EvictionListener listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_evict_ = std::move(listener);
}

HostBlockCacheStats HostBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace deepinfer::kv
