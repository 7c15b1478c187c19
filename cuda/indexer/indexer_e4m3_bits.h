// The persistent indexer kernel's split of the flattened tiles over its blocks, and the integer
// e4m3 -> f16 conversion (cuda/common/e4m3_bits.h) under the names its kernel
// (indexer_score_wgmma_persistent.cu) and host test (tests/cpp/test_indexer_e4m3_bits.cpp) use:
// plain C++, so that the host checks the index math the device cannot show here.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "cuda/common/e4m3_bits.h"

namespace deepinfer::cuda::indexer_e4m3 {

using e4m3_bits::e4m3x2_to_f16x2_times_2m8;
using e4m3_bits::f16x2_from_permuted;
using e4m3_bits::kF16x2Mask;
using e4m3_bits::kHiPairSelector;
using e4m3_bits::kLoPairSelector;
using e4m3_bits::prmt_model;
#if defined(__CUDACC__)
using e4m3_bits::prmt;
#endif

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
