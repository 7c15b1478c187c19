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

ArenaHostAllocator::ArenaHostAllocator(HostBuffer arena, size_t alignment)
    : arena_(std::move(arena)), alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "ArenaHostAllocator: alignment must be a power of two, got " + std::to_string(alignment));
  }
  if (arena_.size() > 0) free_.emplace(0, arena_.size());
}

size_t ArenaHostAllocator::rounded(size_t bytes) const {
  return bytes == 0 ? alignment_ : (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

void* ArenaHostAllocator::allocate(size_t bytes) noexcept {
  if (bytes > arena_.size()) return nullptr;  // also keeps rounded() from overflowing
  const size_t n = rounded(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const size_t offset = it->first;
    const size_t rest = it->second - n;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + n, rest);
    used_ += n;
    return arena_.data() + offset;
  }
  return nullptr;
}

void ArenaHostAllocator::deallocate(void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  size_t offset = static_cast<size_t>(static_cast<uint8_t*>(ptr) - arena_.data());
  size_t n = rounded(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= n;
  // Merged with the free neighbours on both sides, so that a block with a snapshot fits again
  // where two plain ones were.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + n == next->first) {
    n += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += n;
      return;
    }
  }
  free_.emplace_hint(next, offset, n);
}

size_t ArenaHostAllocator::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
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

bool HostBlockCache::evict_one_locked(std::vector<std::shared_ptr<const HostBlock>>& evicted) {
  if (lru_.empty()) return false;
  std::shared_ptr<HostBlock> victim = std::move(lru_.front());
  lru_.pop_front();
  by_hash_.erase(victim->hash());
  stats_.size_bytes -= victim->bytes().size();
  --stats_.blocks;
  ++stats_.evictions;
  stats_.evicted_bytes += victim->bytes().size();
  // Without a listener the block is released here: its memory goes back to the allocator at once
  // (unless a copy still holds it), where a fixed arena can reuse it for the block coming in.
  if (on_evict_) evicted.push_back(std::move(victim));
  return true;
}

void* HostBlockCache::allocate_locked(size_t bytes,
                                      std::vector<std::shared_ptr<const HostBlock>>& evicted) {
  while (stats_.size_bytes + bytes > capacity_ && evict_one_locked(evicted)) {
  }
  void* data = allocator_->allocate(bytes);
  // A fixed arena may lack a free run of this size while the capacity allows it (fragmentation,
  // evicted blocks still in use by a copy): evict on until it has one.
  while (data == nullptr && evict_one_locked(evicted)) data = allocator_->allocate(bytes);
  return data;
}

HostInsertResult HostBlockCache::adopt_locked(
    std::shared_ptr<HostBlock> block, std::vector<std::shared_ptr<const HostBlock>>& evicted) {
  const uint64_t n = block->bytes().size();
  const BlockHash hash = block->hash();
  while (stats_.size_bytes + n > capacity_ && evict_one_locked(evicted)) {
  }
  by_hash_.emplace(hash, lru_.insert(lru_.end(), std::move(block)));
  stats_.size_bytes += n;
  ++stats_.blocks;
  ++stats_.inserts;
  return HostInsertResult::kInserted;
}

HostInsertResult HostBlockCache::insert(const BlockKey& key, std::span<const uint8_t> bytes) {
  std::vector<std::shared_ptr<const HostBlock>> evicted;  // handed to the listener after the lock
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
    listener = on_evict_;
    void* data = allocate_locked(bytes.size(), evicted);
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
      result = adopt_locked(std::move(block), evicted);
    }
  }
  if (listener) {
    for (auto& block : evicted) listener(std::move(block));
  }
  return result;
}

std::shared_ptr<HostBlock> HostBlockCache::make_block(const BlockKey& key, size_t bytes) {
  std::vector<std::shared_ptr<const HostBlock>> evicted;
  EvictionListener listener;
  std::shared_ptr<HostBlock> block;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > capacity_) return nullptr;
    listener = on_evict_;
    void* data = allocate_locked(bytes, evicted);
    if (data != nullptr) {
      try {
        block =
            std::make_shared<HostBlock>(allocator_, data, bytes, key.hash, key.parent,
                                        std::vector<int32_t>(key.tokens.begin(), key.tokens.end()));
      } catch (...) {
        allocator_->deallocate(data, bytes);
        throw;
      }
    }
  }
  if (listener) {
    for (auto& b : evicted) listener(std::move(b));
  }
  return block;
}

HostInsertResult HostBlockCache::insert_block(std::shared_ptr<HostBlock> block) {
  std::vector<std::shared_ptr<const HostBlock>> evicted;
  EvictionListener listener;
  HostInsertResult result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = by_hash_.find(block->hash()); it != by_hash_.end()) {
      lru_.splice(lru_.end(), lru_, it->second);
      ++stats_.inserts_existing;
      return HostInsertResult::kAlreadyPresent;
    }
    if (block->bytes().size() > capacity_) {
      ++stats_.rejected;
      return HostInsertResult::kRejected;
    }
    listener = on_evict_;
    result = adopt_locked(std::move(block), evicted);
  }
  if (listener) {
    for (auto& b : evicted) listener(std::move(b));
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
  HostBlockCacheStats s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = stats_;
  }
  if (const auto* arena = dynamic_cast<const ArenaHostAllocator*>(allocator_.get())) {
    s.arena_bytes = arena->capacity();
    s.arena_pinned = arena->pinned();
  }
  return s;
}

}  // namespace deepinfer::kv
