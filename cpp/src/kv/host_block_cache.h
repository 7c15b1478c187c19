// HostBlockCache: the host-memory tier between GPU blocks and the persistent store.
//
// Holds copies of full blocks' KV bytes, keyed by chain hash, within a byte capacity; inserting
// past it evicts least recently used blocks (lookup() counts as a use, match_prefix() does not:
// it is the metadata-only probe at add_request, and the fetch that follows is the use).
// Memory comes from a HostAllocator: the engine gives it an ArenaHostAllocator over one buffer of
// the configured size from Backend::allocate_pinned_host (pinned on CUDA, so device copies read
// and write block payloads directly); the default is page-aligned ordinary memory. A fixed arena
// can run out before the byte capacity does (fragmentation, or evicted blocks still held by a
// copy): insert then evicts further LRU blocks until the allocation succeeds or none is left.
//
// Blocks are handed out as shared_ptr<const HostBlock>: a block evicted while a copy from it is in
// flight stays alive until that copy drops its handle. Capacity counts the blocks the cache
// holds, so with a growing allocator memory in use may briefly exceed it by blocks still held
// outside; with an arena it cannot, and those blocks' memory is what insert evicts around.
//
// Thread-safe (one mutex). The eviction listener runs after the lock is released, so it may call
// back into the cache or hand the block to a KvStoreWriter (write-back on eviction); with a fixed
// arena, the memory of blocks handed to it is free only once the listener lets go of them.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "deepinfer/backend.h"
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

// Carves allocations out of one HostBuffer (the host tier's arena, allocated once): first fit
// over a free list ordered by offset, neighbours merged on free. Payload sizes are few (a plain
// block, a block with its state snapshot), so first fit keeps fragmentation low. Thread-safe: the
// engine thread, the fetch pool (store blocks it reads go into the host tier) and the store
// writer (dropping its payload handles) allocate and free concurrently.
class ArenaHostAllocator final : public HostAllocator {
 public:
  // Allocations are aligned to `alignment` (a power of two) within the arena.
  explicit ArenaHostAllocator(HostBuffer arena, size_t alignment = 256);
  ArenaHostAllocator(const ArenaHostAllocator&) = delete;
  ArenaHostAllocator& operator=(const ArenaHostAllocator&) = delete;
  void* allocate(size_t bytes) noexcept override;
  void deallocate(void* ptr, size_t bytes) noexcept override;

  size_t capacity() const { return arena_.size(); }
  bool pinned() const { return arena_.pinned(); }
  size_t used_bytes() const;  // aligned bytes handed out and not yet freed

 private:
  size_t rounded(size_t bytes) const;
  HostBuffer arena_;
  size_t alignment_;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> length, disjoint and never adjacent (guarded)
  size_t used_ = 0;                // guarded by mutex_
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
  // For the one filling a block made by HostBlockCache::make_block, before it is inserted.
  std::span<uint8_t> mutable_bytes() { return {data_, size_}; }
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
  // The allocator's memory when it is an arena: its size and whether it is pinned.
  uint64_t arena_bytes = 0;
  bool arena_pinned = false;
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
  // An uninserted block of `bytes` for `key` in the cache's memory, for a device copy to fill
  // directly (write-through), evicting LRU blocks when the memory is short; nullptr when it
  // cannot be had. Its memory counts towards the capacity only once insert_block adopts it.
  std::shared_ptr<HostBlock> make_block(const BlockKey& key, size_t bytes);
  // Adopts a filled block from make_block without copying it (insert otherwise). The block may
  // still be shared (the store writer reads it); it stays immutable from here on.
  HostInsertResult insert_block(std::shared_ptr<HostBlock> block);
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

  // Evicts the LRU block into `evicted` (mutex_ held); false when there is none.
  bool evict_one_locked(std::vector<std::shared_ptr<const HostBlock>>& evicted);
  // Allocates `bytes`, evicting LRU blocks while the allocator has no room (mutex_ held). Without
  // an eviction listener the evicted blocks are released at once, so a fixed arena can reuse
  // their memory (unless a copy still holds them).
  void* allocate_locked(size_t bytes, std::vector<std::shared_ptr<const HostBlock>>& evicted);
  HostInsertResult adopt_locked(std::shared_ptr<HostBlock> block,
                                std::vector<std::shared_ptr<const HostBlock>>& evicted);

  uint64_t capacity_;
  std::shared_ptr<HostAllocator> allocator_;

  mutable std::mutex mutex_;
  Lru lru_;                                               // guarded by mutex_
  std::unordered_map<BlockHash, Lru::iterator> by_hash_;  // guarded by mutex_
  HostBlockCacheStats stats_;                             // guarded by mutex_
  EvictionListener on_evict_;                             // guarded by mutex_
};

}  // namespace deepinfer::kv
