// StatePool: per-sequence state slots (sliding-window rings and compressor rings live in the
// slot's rows of the cache tensors). Slot 0 is never handed out (placeholder rows write there).
// Slots [first_id, first_id + count) are managed, so one cache tensor can hold the live slots of
// one pool and the prefix-cache snapshot slots of another.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deepinfer::kv {

class StatePool {
 public:
  // Manages ids [first_id, first_id + count); first_id >= 1.
  StatePool(int first_id, int count);

  int capacity() const { return count_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return count_ - num_free(); }

  std::optional<int32_t> allocate();  // lowest free id first (deterministic)
  void release(int32_t slot);         // throws on a slot that is not allocated
  bool is_allocated(int32_t slot) const;
  void check_invariants() const;

 private:
  int first_id_;
  int count_;
  std::vector<int32_t> free_;  // kept sorted descending: back() is the lowest free id
  std::vector<uint8_t> allocated_;
};

}  // namespace deepinfer::kv
