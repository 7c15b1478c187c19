// Tile constants and the shared-memory layout of the tensor-core attention kernel
// (sm80/attention_mma.cu), shared with its heuristics.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepinfer::cuda {

constexpr int kMmaThreads = 256;  // 8 warps: row groups of 16 heads x slices of D
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kMmaRows = 64;               // the most heads of a block (rows of q's region)
constexpr int kMmaKeys = 32;               // keys per tile
constexpr int kMmaSStride = kMmaKeys + 8;  // f32 row stride of ss: conflict-free float2 access
// Tiles one block-wave is assumed to need beyond its key tiles (loading q, the epilogue): the
// split heuristic trades these against more, shorter blocks.
constexpr int64_t kMmaOverheadTiles = 2;
// Block-table entries of a token's sequence the kernel keeps in shared memory (4 KB, next to the
// 217 KB of MmaLayout<512>): 1,024 blocks of 128 tokens reach 128K positions; longer sequences
// look their entries up in global memory.
constexpr int kMmaTableEntries = 1024;

template <int kDim>
struct MmaLayout {
  static constexpr int kStride = kDim + 8;  // bf16 row stride of q and kb
  static constexpr size_t kQBytes = size_t{kMmaRows} * kStride * 2;
  // A staged key row: D floats, which also holds a bf16 row (2D bytes) or an fp8 record (at most
  // 2D + D/64 + 8 bytes).
  static constexpr size_t kStageRowBytes = size_t{kDim} * 4;
  static constexpr size_t kStageBytes = size_t{kMmaKeys} * kStageRowBytes;
  static constexpr size_t kKbBytes = size_t{kMmaKeys} * kStride * 2;  // one buffer
  // Partial logits: every warp's 16 rows x 32 keys, whatever the warp layout.
  static constexpr size_t kSsBytes = size_t{kMmaWarps} * 16 * kMmaSStride * 4;
  // Summed logits of the 8-slice layout (16 rows).
  static constexpr size_t kSumBytes = size_t{16} * kMmaSStride * 4;
  static constexpr size_t kStageOff = kQBytes;
  static constexpr size_t kKbOff = kStageOff + kStageBytes;
  static constexpr size_t kSsOff = kKbOff + 2 * kKbBytes;
  static constexpr size_t kSumOff = kSsOff + kSsBytes;
  static constexpr size_t kValidOff = kSumOff + kSumBytes;
  static constexpr size_t kBytes = kValidOff + 2 * kMmaKeys * sizeof(int);
  // After the key loop, the fused combine's weights [kAttnMaxSplits][kMmaRows] and inverse
  // denominators [kMmaRows] overwrite the stage, kb and ss (16.25 KB; 37 KB at D = 64).
  static constexpr size_t kCombineOff = kStageOff;
  static_assert(kDim % 64 == 0 && kDim <= 512, "D must be a multiple of 64 up to 512");
  static_assert(kStageOff % 16 == 0 && kKbOff % 16 == 0 && kKbBytes % 16 == 0 && kSsOff % 16 == 0 &&
                    kSumOff % 16 == 0 && kValidOff % 16 == 0,
                "16-byte aligned regions (cp.async, ldmatrix)");
};

// Shared memory of a block for head dim `dim`; 0 for a dim the kernel is not instantiated for.
constexpr size_t mma_smem_bytes(int64_t dim) {
  switch (dim) {
    case 64:
      return MmaLayout<64>::kBytes;
    case 128:
      return MmaLayout<128>::kBytes;
    case 256:
      return MmaLayout<256>::kBytes;
    case 512:
      return MmaLayout<512>::kBytes;
    default:
      return 0;
  }
}

}  // namespace deepinfer::cuda
