// The bit moves of the MXFP4 decode (sm80/experts_quant_tile.cuh), kept apart from the device
// code so that host tests can check them against the e2m1 table.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace deepinfer::cuda::quant_tile {

// Decoded pair p (0..3) of a 32-bit word r of e2m1 nibbles, before the multiplier: nibbles p and
// p + 4 as bf16s 2^-126 times their values, in the low and high halves (Marlin's trick: a nibble
// s e1 e0 m keeps its sign on bit 15 and its magnitude bits on bits 6..8, the exponent field's
// two lowest bits and the mantissa's top bit, so (e, m) reads as 2^(e - 127) (1 + m / 2) for
// e > 0 and as the subnormal m 2^-127 for e == 0). The nibble alone (masked) times 2^a + 2^b is
// two copies of it in disjoint bits (a - b = 6 >= 4: the sum carries nothing), one with its sign
// on bit 15 and one with its magnitude on bits 6..8, and one more mask keeps those: three
// instructions a pair, plus one shift that pairs 2 and 3 share (they start from the upper byte of
// each half).
DEEPINFER_HOST_DEVICE constexpr uint32_t e2m1_pair_bits(uint32_t r, int p) {
  const uint32_t src = p >= 2 ? r >> 8 : r;
  const bool odd = (p & 1) != 0;
  // The nibble at bits 4 odd (+16): a shift by 12 - 4 odd takes its sign to bit 15, one by
  // 6 - 4 odd its magnitude to bits 6..8.
  const uint32_t nibbles = src & (odd ? 0x00F000F0u : 0x000F000Fu);
  return (nibbles * (odd ? 0x104u : 0x1040u)) & 0x81C081C0u;
}

}  // namespace deepinfer::cuda::quant_tile
