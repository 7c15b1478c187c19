// Where the Hopper weight stream's f16 math (sm90/fp8_wgmma_f16.cu, Fp8WgmmaMath::kF16) keeps the
// quantized activations: per 128-column block, a tile of T tokens (the wgmma's N) of f16 values
// (the e4m3 codes' exact values), laid out as the K-major B operand of its m64nTk16 steps.
// Host-includable: tests/cpp checks that it is a permutation of every tile and that each k-step
// meets the weights its A fragments hold.
//
// The k order. A lane (g, q) of a warp reads 32 consecutive weight bytes of its rows g and g + 8
// per 128-column stage, columns 32 q .. 32 q + 31 (two 16-byte loads), and k-step s (0..7) takes
// 32-bit word s of them, columns 32 q + 4 s + 0..3: bytes 0, 1 become its A registers at k 2q,
// 2q + 1 of the step, bytes 2, 3 those at k 2q + 8, 2q + 9 (the m16n8k16 fragment). So column
// c = 32 q + 4 s + 2 h + e of the block is k 8 h + 2 q + e of step s, and the activation tile
// holds it there.
//
// The B layout: K-major without swizzle, core matrices of 8 tokens x 8 k (128 bytes, a token's 8
// k contiguous), core matrix (token / 8, 2 s + k / 8) at byte (16 (token / 8) + 2 s + k / 8) x 128:
// the leading byte offset (next 8 k) is 128, the stride byte offset (next 8 tokens) 2048.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

constexpr int kFp8WgmmaTileLead = 128;     // bytes between core matrices along k
constexpr int kFp8WgmmaTileStride = 2048;  // bytes between core matrices along the tokens

// Bytes of one block's tile of `tokens` tokens (a multiple of 8).
constexpr int64_t fp8_wgmma_tile_bytes(int tokens) {
  return static_cast<int64_t>(tokens) * 128 * 2;
}

// Byte offset in its block's tile of token t's column c (0..127).
constexpr int64_t fp8_wgmma_tile_offset(int t, int c) {
  const int q = c >> 5;
  const int s = (c >> 2) & 7;
  const int h = (c >> 1) & 1;
  const int e = c & 1;
  const int k = 8 * h + 2 * q + e;  // within k-step s
  return static_cast<int64_t>(16 * (t >> 3) + 2 * s + (k >> 3)) * kFp8WgmmaTileLead + (t & 7) * 16 +
         (k & 7) * 2;
}

}  // namespace deepinfer::cuda
