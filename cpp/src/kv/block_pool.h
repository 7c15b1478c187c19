// BlockPool: the paged KV blocks (kBlockSize tokens each) with reference counts.
//
// Free blocks sit on an intrusive doubly-linked list kept in eviction order: `allocate` takes the
// head, a block whose count drops to 0 goes to the tail. A freed block may still hold a cached
// prefix (see PrefixIndex): it stays on the free list, indexed, until `allocate` hands it out
// again, at which point the eviction listener is told so the index forgets it. Re-using a cached
// free block (`acquire` on a block with count 0) takes it off the list.
//
// Block 0 is never handed out: placeholder rows (padding, dummy steps) write there.
//
// Invariants (check_invariants): every usable block is either on the free list with count 0, or
// off it with count > 0; the list is consistent both ways; free + used == usable.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace deepinfer::kv {

using BlockId = int32_t;

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);  // num_blocks >= 2 (block 0 is reserved)

  int num_blocks() const { return static_cast<int>(refs_.size()); }
  int num_usable() const { return num_blocks() - 1; }
  int num_free() const { return num_free_; }
  int num_used() const { return num_usable() - num_free_; }
  double usage() const { return static_cast<double>(num_used()) / num_usable(); }

  // Takes the head of the free list (count becomes 1); nullopt when none is free. Calls the
  // eviction listener first if that block was cached.
  std::optional<BlockId> allocate();
  // count += 1; a block at count 0 (cached, on the free list) is taken off the list.
  void acquire(BlockId block);
  // count -= 1; at 0 the block goes to the tail of the free list. Releasing a free block throws.
  void release(BlockId block);
  int ref_count(BlockId block) const;
  bool is_free(BlockId block) const;

  // Called with a block's id when `allocate` is about to reuse it (its old contents are lost).
  void set_eviction_listener(std::function<void(BlockId)> listener);

  // Throws Error(kInternal) describing the first broken invariant.
  void check_invariants() const;

 private:
  void unlink(BlockId block);
  void push_tail(BlockId block);
  void check_id(BlockId block, const char* op) const;

  std::vector<int32_t> refs_;
  std::vector<BlockId> prev_, next_;  // free-list links; 0 = none
  BlockId head_ = 0, tail_ = 0;
  int num_free_ = 0;
  std::function<void(BlockId)> on_evict_;
};

}  // namespace deepinfer::kv
