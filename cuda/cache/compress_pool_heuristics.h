// compress_pool's block shape (compress_pool.cu): slot groups and channel lanes per block.
#pragma once

#include <algorithm>
#include <cstdint>

namespace deepinfer::cuda {

// Launch geometry of compress_pool. A thread handles one channel and a strided share of the
// slots; within a share it loads kPoolBatch slots back to back before using any of them, so
// their loads are in flight together (a serial slot loop is one memory latency per slot).
constexpr int kPoolBatch = 8;
constexpr int kPoolMaxGroups = 16;
constexpr int kPoolMaxThreads = 512;  // 32 lanes x kPoolMaxGroups at most, see compress_pool

struct PoolGeometry {
  int groups;     // blockDim.y: slot groups
  int64_t lanes;  // blockDim.x: channels per block
};

// Slot groups: enough that a thread's share of the largest window (2m slots with overlap) is
// about one load batch, so a decode step with a single entry still has all its loads in flight
// at once; lanes: 32 (one 128-byte line of a row per warp) up to 128 channels per block.
inline PoolGeometry choose_pool_geometry(int64_t ratio, int64_t dim, bool overlap) {
  const int64_t max_slots = overlap ? 2 * ratio : ratio;
  int groups = 1;
  while (groups < kPoolMaxGroups && groups * kPoolBatch < max_slots) groups *= 2;
  const int64_t lanes = std::min<int64_t>(std::max(32, 128 / groups), (dim + 31) / 32 * 32);
  return {groups, lanes};
}

}  // namespace deepinfer::cuda
