// argmax's grid (argmax.cu): the blocks over one row.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxUnroll = 4;  // units per thread of a tile, all loaded before any compare
constexpr int64_t kArgmaxTile = static_cast<int64_t>(kArgmaxThreads) * kArgmaxUnroll;  // units
constexpr int64_t kArgmaxMaxChunks = 1024;

struct ArgmaxConfig {
  bool vec;        // float4 loads: cols % 4 == 0 and a 16-byte aligned base
  int64_t chunks;  // blocks per row; > 1 adds argmax_final_kernel
};

inline ArgmaxConfig choose_argmax(int64_t cols, bool aligned) {
  ArgmaxConfig c{};
  c.vec = cols % 4 == 0 && aligned;
  const int64_t units = c.vec ? cols / 4 : cols;
  // A long row is split over up to kArgmaxMaxChunks blocks, so one row (the greedy token of a
  // decode step) still spreads over the device.
  c.chunks = (units + kArgmaxTile - 1) / kArgmaxTile;
  if (c.chunks > kArgmaxMaxChunks) c.chunks = kArgmaxMaxChunks;
  return c;
}

}  // namespace deepinfer::cuda
