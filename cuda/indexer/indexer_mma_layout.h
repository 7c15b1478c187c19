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

// The wgmma kernel over fp8 keys (indexer_score_wgmma.cu): thread (g, c) of a warp holds, for
// k-step s of wgmma.m64nNk16, the 4-byte word 8c + s of each of its keys' codes, i.e. stored
// channels 32c + 4s + 2r + e (byte 2r + e of the word); its A registers take them as k =
// 2c + 8r + e of the step (the low two codes, r = 0, in registers 0 / 1; the high two in 2 / 3).
// Word 8c + s keeps the 32 lanes' loads on distinct banks for records of 33 words.
DEEPINFER_HOST_DEVICE constexpr int wgmma_k_of_channel(int ch) {
  return 16 * ((ch % 32) / 4) + 8 * ((ch % 4) / 2) + 2 * (ch / 32) + ch % 2;
}

// The same words as the A registers of wgmma.m64nNk32 on e4m3 codes (the kernel's lo-part
// variant): for k-step t (32 channels) thread (g, c) hands over words 8c + 2t (registers 0 / 1,
// k = 4c .. 4c + 3) and 8c + 2t + 1 (registers 2 / 3, k = 16 + 4c ..), so stored channel
// ch = 32c + 4s + b (s = 2t + u) plays k = 16u + 4c + b of step t.
DEEPINFER_HOST_DEVICE constexpr int wgmma_k8_of_channel(int ch) {
  return 32 * ((ch % 32) / 8) + 16 * ((ch % 8) / 4) + 4 * (ch / 32) + ch % 4;
}

constexpr int kWgmmaCoreBytes = 128;  // a core matrix: 8 rows of 16 bytes
constexpr int kWgmmaKChunks = 16;     // core matrices along k (128 channels of 8)

// q's B tile for wgmma (f16, K-major, no swizzle): element (k, column) in core matrix
// (column / 8, k / 8), laid out [column / 8][k / 8], row column % 8 of 16 bytes, element k % 8.
// A k-step's descriptor then starts at core matrix 2s with a leading byte offset of one core
// matrix (along k) and a stride byte offset of kWgmmaKChunks core matrices (along the columns).
DEEPINFER_HOST_DEVICE constexpr int wgmma_q_offset(int k, int column) {
  return ((column / 8) * kWgmmaKChunks + k / 8) * kWgmmaCoreBytes + (column % 8) * 16 + (k % 8) * 2;
}

// q's lo parts in e4m3 for the k32 steps: element (k, column) in core matrix (column / 8, k / 16)
// of 8 columns x 16 k, laid out [column / 8][k / 16]: leading byte offset one core matrix, stride
// byte offset kWgmmaKChunks / 2 of them.
DEEPINFER_HOST_DEVICE constexpr int wgmma_q8_offset(int k, int column) {
  return ((column / 8) * (kWgmmaKChunks / 2) + k / 16) * kWgmmaCoreBytes + (column % 8) * 16 +
         k % 16;
}

}  // namespace deepinfer::cuda::indexer_mma
