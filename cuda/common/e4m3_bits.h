// e4m3 codes to f16 or bf16 by integer operations: plain C++ (with the device's byte permute
// beside its host model), so that a host test (tests/cpp/test_e4m3_bits.cpp) checks the bit
// tricks the device cannot show here.
//
// Why. Hopper converts e4m3x2 -> f16x2 (cvt, F2FP), f16 -> f32 and f32 -> bf16 at a quarter of
// the integer pipe's rate, and the fp8 kernels convert every code they read: the indexer's
// scores, and the attention producer's decode of each key into bf16 (three conversions per pair
// of codes, the whole of its decode time). The integer forms below take three integer
// operations per pair (a byte permute, a shift, a mask) on pipes that are otherwise idle.
//
// Each gives the code's value times a power of two, exactly, for every code but the two NaNs
// (0x7f, 0xff; a finite value there): an e4m3 code s.eeee.mmm placed with its exponent in the
// low bits of a wider exponent field reads with that format's bias instead of 7, and e4m3's
// subnormals (eeee = 0) land on the format's subnormals with the same factor:
//   f16:  s.eeee.mmm at bits 14..7   -> s.0eeee.mmm0000000   the value times 2^-8   (bias 15)
//   bf16: s.eeee.mmm at bits 10..4   -> s.0000eeee.mmm0000   the value times 2^-120 (bias 127)
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace deepinfer::cuda::e4m3_bits {

// prmt.b32 selectors (generic mode: per destination byte a nibble, its low 3 bits pick a source
// byte, its bit 3 replicates that byte's sign over the destination byte) that put codes b0, b1
// (kLoPair) or b2, b3 (kHiPair) of a word at bytes 0 and 2, each with its replicated sign above.
constexpr uint32_t kLoPairSelector = 0x9180u;  // [sign(b1), b1, sign(b0), b0]
constexpr uint32_t kHiPairSelector = 0xB3A2u;  // [sign(b3), b3, sign(b2), b2]
// f16 (after a shift by 7): keeps each half's sign (bit 15: the replicated sign's lowest bit) and
// its exponent and mantissa (bits 13..7), and clears the code's own sign bit (bit 14) and the lower
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

// Codes b0, b1 (kHigh false) or b2, b3 (kHigh true) of `word` permuted (kLoPairSelector /
// kHiPairSelector), on the device or through the host model.
template <bool kHigh>
DEEPINFER_HOST_DEVICE inline uint32_t permuted_pair(uint32_t word) {
  constexpr uint32_t selector = kHigh ? kHiPairSelector : kLoPairSelector;
#if defined(__CUDA_ARCH__)
  return prmt(word, selector);
#else
  return prmt_model(word, 0, selector);
#endif
}

// Codes b0, b1 (kHigh false) or b2, b3 (kHigh true) of `word` as f16x2, times 2^-8: the halves
// cvt e4m3x2 -> f16x2 gives for the same 16 bits, scaled (NaN codes aside).
template <bool kHigh>
DEEPINFER_HOST_DEVICE inline uint32_t e4m3x2_to_f16x2_times_2m8(uint32_t word) {
  return f16x2_from_permuted(permuted_pair<kHigh>(word));
}

// bf16 (after a shift by 4): keeps each half's sign (bit 15: the replicated sign's lowest bit)
// and its exponent and mantissa (bits 10..4), and clears the code's own sign bit (bit 11), the
// rest of the replicated sign (bits 12..14) and what the shift carried into bits 16..19.
constexpr uint32_t kBf16x2Mask = 0x87F087F0u;

// The bf16x2 of a permuted pair: each half the code's value times 2^-120 (the lower half from the
// lower code). One exact multiply by 2^120 (kBf16TwoPow120) gives the value.
DEEPINFER_HOST_DEVICE constexpr uint32_t bf16x2_from_permuted(uint32_t permuted) {
  return (permuted << 4) & kBf16x2Mask;
}
constexpr uint32_t kBf16TwoPow120 = 0x7B80u;  // 2^120: exponent field 247

// Codes b0, b1 (kHigh false) or b2, b3 (kHigh true) of `word` as bf16x2, times 2^-120.
template <bool kHigh>
DEEPINFER_HOST_DEVICE inline uint32_t e4m3x2_to_bf16x2_times_2m120(uint32_t word) {
  return bf16x2_from_permuted(permuted_pair<kHigh>(word));
}

}  // namespace deepinfer::cuda::e4m3_bits
