#include "kv/state_pool.h"

#include <algorithm>
#include <functional>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::kv {

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw Error(ErrorCode::kInternal, "StatePool invariant broken: " + msg);
}

}  // namespace

StatePool::StatePool(int first_id, int count) : first_id_(first_id), count_(count) {
  if (first_id < 1 || count < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "StatePool needs first_id >= 1 (slot 0 is reserved) and count >= 0, got first_id " +
                    std::to_string(first_id) + ", count " + std::to_string(count));
  }
  // Reserved to full capacity once, so release never reallocates.
  free_.reserve(static_cast<size_t>(count));
  for (int i = count - 1; i >= 0; --i) free_.push_back(first_id + i);
  allocated_.assign(static_cast<size_t>(count), 0);
}

std::optional<int32_t> StatePool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t slot = free_.back();
  free_.pop_back();
  allocated_[static_cast<size_t>(slot - first_id_)] = 1;
  return slot;
}

void StatePool::release(int32_t slot) {
  if (slot < first_id_ || slot - first_id_ >= count_) {
    throw Error(ErrorCode::kInvalidArgument,
                "StatePool::release: slot " + std::to_string(slot) + " is outside this pool [" +
                    std::to_string(first_id_) + ", " + std::to_string(first_id_ + count_) + ")");
  }
  uint8_t& flag = allocated_[static_cast<size_t>(slot - first_id_)];
  if (flag == 0) {
    throw Error(ErrorCode::kInternal, "StatePool::release: slot " + std::to_string(slot) +
                                          " is not allocated; it was released twice");
  }
  flag = 0;
  // Keep descending order so allocate() stays "lowest id first". O(free) shifting is fine: a pool
  // holds about 1.2 x max_num_seqs slots and this runs once per finished sequence.
  free_.insert(std::upper_bound(free_.begin(), free_.end(), slot, std::greater<int32_t>()), slot);
}

bool StatePool::is_allocated(int32_t slot) const {
  // Ids of another pool (e.g. snapshot slots sharing the cache tensor) are simply not ours.
  if (slot < first_id_ || slot - first_id_ >= count_) return false;
  return allocated_[static_cast<size_t>(slot - first_id_)] != 0;
}

void StatePool::check_invariants() const {
  if (free_.size() > static_cast<size_t>(count_)) {
    fail(std::to_string(free_.size()) + " free slots exceed capacity " + std::to_string(count_));
  }
  for (size_t i = 0; i < free_.size(); ++i) {
    const int32_t slot = free_[i];
    if (slot < first_id_ || slot - first_id_ >= count_) {
      fail("free list holds slot " + std::to_string(slot) + " outside [" +
           std::to_string(first_id_) + ", " + std::to_string(first_id_ + count_) + ")");
    }
    if (i > 0 && free_[i - 1] <= slot) {
      fail("free list is not strictly descending at slot " + std::to_string(slot) + " (after " +
           std::to_string(free_[i - 1]) + ")");
    }
    if (allocated_[static_cast<size_t>(slot - first_id_)] != 0) {
      fail("slot " + std::to_string(slot) + " is both free and allocated");
    }
  }
  // Free slots are distinct and unallocated, so the counts match exactly when every slot is in
  // one of the two states.
  const auto used =
      std::count_if(allocated_.begin(), allocated_.end(), [](uint8_t f) { return f != 0; });
  if (static_cast<size_t>(used) + free_.size() != static_cast<size_t>(count_)) {
    fail(std::to_string(used) + " allocated + " + std::to_string(free_.size()) +
         " free slots != capacity " + std::to_string(count_));
  }
}

}  // namespace deepinfer::kv
