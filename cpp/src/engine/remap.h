// Remap between consecutive batches: for each row of step N+1, the index of the same sequence's
// sampling row in step N (or -1). Sequences are matched by (id, epoch) so a preempted and
// re-admitted sequence never takes a stale token.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::engine {

using RowKey = std::pair<RequestId, uint32_t>;

class BatchRemapper {
 public:
  // remap[i] for `current`. Fast path: when `current` equals `previous` position by position the
  // result is the identity without hashing. Returns whether the fast path was taken.
  bool remap(std::span<const RowKey> previous, std::span<const RowKey> current,
             std::vector<int32_t>& out);

 private:
  std::unordered_map<RequestId, std::pair<uint32_t, int32_t>> index_;  // reused across calls
};

}  // namespace deepinfer::engine
