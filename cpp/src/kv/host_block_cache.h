// HostBlockCache: the host-memory tier between GPU blocks and the persistent store.
//
// Holds copies of full blocks' KV bytes, keyed by chain hash, within a byte capacity; inserting
// past it evicts least recently used blocks (lookup() counts as a use, match_prefix() does not:
// it is the metadata-only probe at add_request, and the fetch that follows is the use).
// Memory comes from a HostAllocator, so the CUDA backend can supply pinned memory (cudaHostAlloc)
// for fast device copies; the default is page-aligned ordinary memory.
//
// Blocks are handed out as shared_ptr<const HostBlock>: a block evicted while a copy from it is in
// flight stays alive until that copy drops its handle. Capacity counts the blocks the cache
// holds, so memory in use may briefly exceed it by blocks still held outside.
//
// Thread-safe (one mutex). The eviction listener runs after the lock is released, so it may call
// back into the cache or hand the block to a KvStoreWriter (write-back on eviction).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_key.h"

namespace deepinfer::kv {

class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // nullptr when the memory cannot be had; never throws.
  virtual void* allocate(size_t bytes) noexcept = 0;
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
};

// Ordinary host memory aligned to `alignment` (a power of two; a page by default, what DMA
// engines and O_DIRECT prefer).
class AlignedHostAllocator final : public HostAllocator {
 public:
  explicit AlignedHostAllocator(size_t alignment = 4096);
  void* allocate(size_t bytes) noexcept override;
  void deallocate(void* ptr, size_t bytes) noexcept override;

 private:
  size_t alignment_;
};

// One block's bytes in allocator memory, with the key it was stored under.
class HostBlock {
 public:
  HostBlock(std::shared_ptr<HostAllocator> allocator, void* data, size_t bytes, BlockHash hash,
            BlockHash parent, std::vector<int32_t> tokens);
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  ~HostBlock();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  BlockHash hash() const { return hash_; }
  BlockHash parent() const { return parent_; }
  std::span<const int32_t> tokens() const { return tokens_; }

 private:
  std::shared_ptr<HostAllocator> allocator_;  // outlives the memory it handed out
  uint8_t* data_;
  size_t size_;
  BlockHash hash_;
  BlockHash parent_;
  std::vector<int32_t> tokens_;
};

struct HostBlockCacheStats {
  uint64_t inserts = 0;
  uint64_t inserts_existing = 0;  // key already held (refreshed, not copied)
  uint64_t rejected = 0;          // larger than the capacity, or the allocator said no
  uint64_t hits = 0;
  uint64_t misses = 0;  // lookups of absent keys or of another (parent, tokens)
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t size_bytes = 0;
  uint64_t blocks = 0;
};

enum class HostInsertResult { kInserted, kAlreadyPresent, kRejected };

class HostBlockCache {
 public:
  using EvictionListener = std::function<void(std::shared_ptr<const HostBlock>)>;

  explicit HostBlockCache(uint64_t capacity_bytes,
                          std::shared_ptr<HostAllocator> allocator = nullptr);
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  // Copies `bytes` in as the block `key`, evicting LRU blocks to make room. A key already held
  // is only marked used.
  HostInsertResult insert(const BlockKey& key, std::span<const uint8_t> bytes);
  // The block, verified against key's parent and tokens, marked used; nullptr on a miss.
  std::shared_ptr<const HostBlock> lookup(const BlockKey& key);
  // How many leading blocks of `hashes` are held. Does not change LRU order.
  int match_prefix(std::span<const BlockHash> hashes) const;
  // Like match_prefix, with the payload bytes of each leading block held (callers tell a block
  // that carries a state snapshot by its size). Does not change LRU order.
  std::vector<uint64_t> match_prefix_sizes(std::span<const BlockHash> hashes) const;
  bool erase(BlockHash hash);

  // Called with each evicted block (outside the cache's lock).
  void set_eviction_listener(EvictionListener listener);

  uint64_t capacity_bytes() const { return capacity_; }
  HostBlockCacheStats stats() const;

 private:
  using Lru = std::list<std::shared_ptr<HostBlock>>;  // front: least recently used

  uint64_t capacity_;
  std::shared_ptr<HostAllocator> allocator_;

  mutable std::mutex mutex_;
  Lru lru_;                                               // guarded by mutex_
  std::unordered_map<BlockHash, Lru::iterator> by_hash_;  // guarded by mutex_
  HostBlockCacheStats stats_;                             // guarded by mutex_
  EvictionListener on_evict_;                             // guarded by mutex_
};

}  // namespace deepinfer::kv
