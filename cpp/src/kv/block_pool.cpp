#include "kv/block_pool.h"

#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::kv {

namespace {

std::string block_str(BlockId block) {
  return "block " + std::to_string(block);
}

[[noreturn]] void fail(const std::string& msg) {
  throw Error(ErrorCode::kInternal, "BlockPool invariant broken: " + msg);
}

}  // namespace

BlockPool::BlockPool(int num_blocks) {
  if (num_blocks < 2) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "BlockPool needs num_blocks >= 2 (block 0 is reserved), got " + std::to_string(num_blocks));
  }
  const auto n = static_cast<size_t>(num_blocks);
  refs_.assign(n, 0);
  prev_.assign(n, 0);
  next_.assign(n, 0);
  // Ascending initial order, so a fresh pool hands out 1, 2, 3, ... (deterministic tests, and
  // low block ids first keeps early traffic in one region of the cache tensors).
  for (BlockId b = 1; b < num_blocks; ++b) push_tail(b);
  num_free_ = num_blocks - 1;
}

std::optional<BlockId> BlockPool::allocate() {
  if (head_ == 0) return std::nullopt;
  const BlockId block = head_;
  // The listener runs before the block leaves the list: if it throws, the pool is unchanged and
  // the block is still cached and free.
  if (on_evict_) {
    on_evict_(block);
    DEEPINFER_CHECK(head_ == block && refs_[static_cast<size_t>(block)] == 0,
                    "the eviction listener for " + block_str(block) +
                        " changed the free list; it must not call back into the pool");
  }
  unlink(block);
  --num_free_;
  refs_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockPool::acquire(BlockId block) {
  check_id(block, "acquire");
  int32_t& ref = refs_[static_cast<size_t>(block)];
  if (ref == 0) {
    // A prefix-cache hit on a freed block: its contents are still valid, so it is revived in
    // place rather than reallocated (no eviction).
    unlink(block);
    --num_free_;
  }
  ++ref;
}

void BlockPool::release(BlockId block) {
  check_id(block, "release");
  int32_t& ref = refs_[static_cast<size_t>(block)];
  if (ref == 0) {
    throw Error(ErrorCode::kInternal,
                "BlockPool::release: " + block_str(block) +
                    " is already free (ref count 0); a reference was released twice");
  }
  if (--ref == 0) {
    // The tail is evicted last, so recently used (likely hot) prefixes survive longest.
    push_tail(block);
    ++num_free_;
  }
}

int BlockPool::ref_count(BlockId block) const {
  check_id(block, "ref_count");
  return refs_[static_cast<size_t>(block)];
}

bool BlockPool::is_free(BlockId block) const {
  check_id(block, "is_free");
  return refs_[static_cast<size_t>(block)] == 0;
}

void BlockPool::set_eviction_listener(std::function<void(BlockId)> listener) {
  on_evict_ = std::move(listener);
}

void BlockPool::unlink(BlockId block) {
  const auto b = static_cast<size_t>(block);
  const BlockId p = prev_[b];
  const BlockId n = next_[b];
  if (p != 0) {
    next_[static_cast<size_t>(p)] = n;
  } else {
    head_ = n;
  }
  if (n != 0) {
    prev_[static_cast<size_t>(n)] = p;
  } else {
    tail_ = p;
  }
  // Off-list blocks keep null links; check_invariants relies on it.
  prev_[b] = 0;
  next_[b] = 0;
}

void BlockPool::push_tail(BlockId block) {
  const auto b = static_cast<size_t>(block);
  prev_[b] = tail_;
  next_[b] = 0;
  if (tail_ != 0) {
    next_[static_cast<size_t>(tail_)] = block;
  } else {
    head_ = block;
  }
  tail_ = block;
}

void BlockPool::check_id(BlockId block, const char* op) const {
  if (block < 1 || block >= num_blocks()) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("BlockPool::") + op + ": " + block_str(block) +
                    (block == 0 ? " is the reserved placeholder block"
                                : " is out of range [1, " + std::to_string(num_blocks()) + ")"));
  }
}

void BlockPool::check_invariants() const {
  const int n = num_blocks();
  if (refs_[0] != 0 || prev_[0] != 0 || next_[0] != 0) {
    fail("reserved block 0 has ref count " + std::to_string(refs_[0]) + " or non-null links");
  }
  if (num_free_ < 0 || num_free_ > num_usable()) {
    fail("num_free " + std::to_string(num_free_) + " outside [0, " + std::to_string(num_usable()) +
         "]");
  }
  if ((head_ == 0) != (tail_ == 0) || (head_ == 0) != (num_free_ == 0)) {
    fail("head " + std::to_string(head_) + ", tail " + std::to_string(tail_) +
         " disagree with num_free " + std::to_string(num_free_));
  }

  // Forward walk. Each node's prev must be the node we came from; since the head's prev is null,
  // the first node visited twice would fail that check, so a passing walk visits distinct nodes.
  // The length bound stops a cycle that skips the head.
  int forward = 0;
  BlockId last = 0;
  for (BlockId b = head_; b != 0; b = next_[static_cast<size_t>(b)]) {
    if (b < 1 || b >= n) fail("free list holds out-of-range " + block_str(b));
    if (prev_[static_cast<size_t>(b)] != last) {
      fail(block_str(b) + " has prev " + std::to_string(prev_[static_cast<size_t>(b)]) +
           " but follows " + std::to_string(last) + " in the forward walk");
    }
    if (refs_[static_cast<size_t>(b)] != 0) {
      fail(block_str(b) + " is on the free list with ref count " +
           std::to_string(refs_[static_cast<size_t>(b)]));
    }
    if (++forward > num_usable()) fail("free list longer than the usable blocks (a cycle)");
    last = b;
  }
  if (last != tail_) {
    fail("forward walk ends at " + std::to_string(last) + " but tail is " + std::to_string(tail_));
  }

  int backward = 0;
  BlockId after = 0;
  for (BlockId b = tail_; b != 0; b = prev_[static_cast<size_t>(b)]) {
    if (b < 1 || b >= n) fail("free list holds out-of-range " + block_str(b));
    if (next_[static_cast<size_t>(b)] != after) {
      fail(block_str(b) + " has next " + std::to_string(next_[static_cast<size_t>(b)]) +
           " but precedes " + std::to_string(after) + " in the backward walk");
    }
    if (++backward > num_usable()) fail("free list longer than the usable blocks (a cycle)");
    after = b;
  }
  if (after != head_) {
    fail("backward walk ends at " + std::to_string(after) + " but head is " +
         std::to_string(head_));
  }

  // The list holds `forward` distinct blocks at count 0; if exactly that many blocks have count 0,
  // every free block is on the list. Off-list blocks must have positive counts and null links.
  int zero = 0;
  for (BlockId b = 1; b < n; ++b) {
    const auto i = static_cast<size_t>(b);
    if (refs_[i] < 0) fail(block_str(b) + " has negative ref count " + std::to_string(refs_[i]));
    if (refs_[i] == 0) {
      ++zero;
    } else if (prev_[i] != 0 || next_[i] != 0) {
      fail(block_str(b) + " is in use (ref count " + std::to_string(refs_[i]) +
           ") but has free-list links");
    }
  }
  if (forward != num_free_ || backward != num_free_ || zero != num_free_) {
    fail("num_free " + std::to_string(num_free_) + ", forward walk " + std::to_string(forward) +
         ", backward walk " + std::to_string(backward) + ", blocks at ref count 0 " +
         std::to_string(zero));
  }
}

}  // namespace deepinfer::kv
