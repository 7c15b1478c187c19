// e4m3 codes to f16 by integer operations, and the persistent indexer kernel's split of the
// flattened tiles over its blocks: plain C++ (with the device's byte permute beside its host
// model), so that a host test (tests/cpp/test_indexer_e4m3_bits.cpp) checks the bit tricks and
// the index math the device cannot show here.
//
// Why. Hopper converts e4m3x2 -> f16x2 (cvt, F2FP) at a quarter of the integer pipe's rate, and
// the fp8 scoring kernels convert every key code once: 32 conversions per thread and 64-key tile.
// The integer form below takes three integer operations per f16x2 (a byte permute, a shift, a
// mask) on the pipes that are otherwise idle, so a kernel can split its conversions between the
// two (indexer_score_wgmma_persistent.cu).
//
// The integer form gives the code's value times 2^-8, exactly, for every code but the two NaNs
// (0x7f, 0xff; a finite value there): an e4m3 code s.eeee.mmm placed at bits 14..7 of an f16
// (sign moved to bit 15) reads as s.0eeee.mmm0000000, i.e. exponent bias 15 instead of 7, and
// e4m3's subnormals (eeee = 0) land on f16 subnormals with the same factor.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace deepinfer::cuda::indexer_e4m3 {

// prmt.b32 selectors (generic mode: per destination byte a nibble, its low 3 bits pick a source
// byte, its bit 3 replicates that byte's sign over the destination byte) that put codes b0, b1
// (kLoPair) or b2, b3 (kHiPair) of a word at bytes 0 and 2, each with its replicated sign above.
constexpr uint32_t kLoPairSelector = 0x9180u;  // [sign(b1), b1, sign(b0), b0]
constexpr uint32_t kHiPairSelector = 0xB3A2u;  // [sign(b3), b3, sign(b2), b2]
// After a shift by 7: keeps each half's sign (bit 15: the replicated sign's lowest bit) and its
// exponent and mantissa (bits 13..7), and clears the code's own sign bit (bit 14) and the lower
// half's replicated sign that the shift carried into bits 16..22.
constexpr uint32_t kF16x2Mask = 0xBF80BF80u;

// The host model of prmt.b32 in its generic mode (b's bytes are 4..7).
constexpr uint32_t prmt_model(uint32_t a, uint32_t b, uint32_t selector) {
  const uint64_t bytes = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t nibble = (selector >> (4 * i)) & 0xfu;
    uint32_t byte = static_cast<uint32_t>(bytes >> (8 * (nibble & 7u))) & 0xffu;
    if ((nibble & 8u) != 0) byte = (byte & 0x80u) != 0 ? 0xffu : 0u;
    out |= byte << (8 * i);
  }
  return out;
}

#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(out) : "r"(a), "r"(0u), "r"(selector));
  return out;
}
#endif

// The f16x2 of a permuted pair (kLoPairSelector / kHiPairSelector): each half the code's value
// times 2^-8 (the lower half from the lower code).
DEEPINFER_HOST_DEVICE constexpr uint32_t f16x2_from_permuted(uint32_t permuted) {
  return (permuted << 7) & kF16x2Mask;
}

// Codes b0, b1 (kHigh false) or b2, b3 (kHigh true) of `word` as f16x2, times 2^-8: the halves
// cvt e4m3x2 -> f16x2 gives for the same 16 bits, scaled (NaN codes aside).
template <bool kHigh>
DEEPINFER_HOST_DEVICE inline uint32_t e4m3x2_to_f16x2_times_2m8(uint32_t word) {
  constexpr uint32_t selector = kHigh ? kHiPairSelector : kLoPairSelector;
#if defined(__CUDA_ARCH__)
  return f16x2_from_permuted(prmt(word, selector));
#else
  return f16x2_from_permuted(prmt_model(word, 0, selector));
#endif
}

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
