// Where the tensor-core scoring kernel (indexer_score_mma.cu) keeps each channel of a key and of
// q: plain C++ so that a host test (tests/cpp/test_indexer_mma_layout.cpp) can check the index
// math that the device cannot show here.
//
// A dot product may sum its channels in any order, so the kernel permutes them: a key row of
// 16-byte chunks (16 fp8 or 8 bf16 channels each) is read by the 4 lanes of a quad with one
// 16-byte shared-memory load per chunk, lane c taking chunks c, 4 + c, 8 + c, ... . Each 32-bit
// word of a chunk is the B register of one mma.sync m16n8k16 step (fp8: two words after the
// e4m3x2 -> f16x2 conversion), and q's A fragments take the same channels. In a step, lane c of
// the B fragment holds logical k = 2c + e (register 0) and 2c + 8 + e (register 1), e in {0, 1};
// mma_channel names the stored channel that plays that k.
//
// Rows are stored whole in shared memory, chunk q of key n at chunk position q ^ ((n & 1) << 2):
// the 8 lanes of one phase of a 16-byte load (keys n, n + 1, 4 lanes each) then cover 32
// distinct banks, in rows of 128 (fp8) or 256 (bf16) bytes without padding.
#pragma once

#include "common/host_device.h"

namespace deepinfer::cuda::indexer_mma {

constexpr int kQuad = 4;         // lanes sharing one key (the quad of a fragment row)
constexpr int kChunkBytes = 16;  // one shared-memory load per lane

// Channels of one 16-byte chunk for elements of `elem_bytes` (1: fp8, 2: bf16).
DEEPINFER_HOST_DEVICE constexpr int chunk_channels(int elem_bytes) {
  return kChunkBytes / elem_bytes;
}

// mma steps (16 channels of k each) that one chunk feeds: a step takes 4 channels of a lane.
DEEPINFER_HOST_DEVICE constexpr int chunk_steps(int elem_bytes) {
  return chunk_channels(elem_bytes) / 4;
}

// The chunk (of the row, in channel order) that lane c of a quad reads for mma step `step`.
DEEPINFER_HOST_DEVICE constexpr int lane_chunk(int step, int c, int elem_bytes) {
  return kQuad * (step / chunk_steps(elem_bytes)) + c;
}

// The stored channel that plays logical k = 2c + 8 reg + e of mma step `step`.
DEEPINFER_HOST_DEVICE constexpr int mma_channel(int step, int c, int reg, int e, int elem_bytes) {
  return lane_chunk(step, c, elem_bytes) * chunk_channels(elem_bytes) +
         4 * (step % chunk_steps(elem_bytes)) + 2 * reg + e;
}

// The position of chunk `chunk` of key `key` in the key's shared-memory row.
DEEPINFER_HOST_DEVICE constexpr int smem_chunk(int key, int chunk) {
  return chunk ^ ((key & 1) << 2);
}

}  // namespace deepinfer::cuda::indexer_mma
