// Tile shapes of the quantized expert GEMMs (sm80/experts_quant.cu), shared with the MoE
// heuristics, which choose between them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepinfer::cuda {

// The two weight formats the quantized expert kernels decode in registers.
enum class QuantFormat {
  kMxfp4,  // e2m1 pairs [N, K / 2] + e8m0 scales [N, K / 32]
  kFp8,    // e4m3 [N, K] + f32 scales per block_rows x block_cols block
};

// k per shared-memory slice of the activations and per weight step of a warp.
constexpr int kQuantSliceK = 128;
// 32-bit words (bf16 pairs) per staged activation row of one slice: 64, padded by 8 so that the
// rows of 8 tokens start 8 banks apart (the B-fragment reads are then conflict-free, see
// experts_quant.cu).
constexpr int kQuantRowWords = kQuantSliceK / 2 + 8;

// A CTA: kWarps warps of kMTiles m16 weight tiles (16 weight rows each) times the kTok token
// rows of one tile of the tile list, 256 weight rows in all (gate/up: 128 columns of w1 and the
// same of w3; down: 256 rows of w2).
template <int kWarpsT, int kMTilesT, int kTokT>
struct ExpertQuantTile {
  static constexpr int kWarps = kWarpsT;
  static constexpr int kMTiles = kMTilesT;
  static constexpr int kTok = kTokT;  // the tile list's tile_rows
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWeightRows = 16 * kMTiles * kWarps;
  static_assert(kWeightRows == 256 && kMTiles % 2 == 0 && kTok % 8 == 0, "256 rows per CTA");
  // Two slices of kPlanes x kTok rows in shared memory (double buffer).
  static constexpr size_t smem_bytes(int planes) {
    return size_t{2} * planes * kTok * kQuantRowWords * sizeof(uint32_t);
  }
};

// Decode: 16-token tiles (an expert with <= 16 pairs is one tile, its weights read once), four
// warps of 64 weight rows (more 16-byte loads in flight per thread, each B fragment used 4 times).
using ExpertQuantDecode = ExpertQuantTile<4, 4, 16>;
// FP8 decode: twice the bytes per weight row, so eight warps of 32 rows keep the registers of two
// slices of loads in bounds.
using ExpertQuantDecodeFp8 = ExpertQuantTile<8, 2, 16>;
// Prefill: 64-token tiles, eight warps of 32 weight rows (64 accumulators per thread).
using ExpertQuantPrefill = ExpertQuantTile<8, 2, 64>;

// Pairs per expert on average up to which a pass takes the decode shape.
constexpr int64_t kExpertQuantDecodeMaxPairs = 16;

}  // namespace deepinfer::cuda
