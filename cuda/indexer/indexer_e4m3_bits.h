// The persistent indexer kernel's split of the flattened tiles over its blocks
// (indexer_score_wgmma_persistent.cu; its integer e4m3 -> f16 conversion is
// cuda/common/e4m3_bits.h): plain C++, so that a host test (tests/cpp/test_indexer_e4m3_bits.cpp)
// checks the index math the device cannot show here.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace deepinfer::cuda::indexer_e4m3 {

// The flattened tiles of the persistent kernel: the group's tokens' tiles in token order, cut into
// `ctas` contiguous ranges whose sizes differ by at most one. Block c scores [first, first +
// count).
struct TileRange {
  int64_t first;
  int64_t count;
};

DEEPINFER_HOST_DEVICE constexpr TileRange persistent_tile_range(int64_t total, int64_t ctas,
                                                                int64_t c) {
  const int64_t first = total * c / ctas;
  return {first, total * (c + 1) / ctas - first};
}

}  // namespace deepinfer::cuda::indexer_e4m3
