// Tile constants, the shared-memory layout and the plan of the Hopper attention kernel
// (sm90/attention_wgmma.cu), shared with the host's dispatch (attention.cu). Plain C++: the plan is
// host arithmetic on shapes, like attention_plan.h's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_plan.h"

namespace deepinfer::cuda {

constexpr int kWgmmaAttnThreads = 256;  // two warpgroups, each owning half of the channels of O
constexpr int kWgmmaAttnRows = 64;      // heads per block: wgmma's M
constexpr int kWgmmaAttnDim = 512;      // the one head dim (V4's MQA width)
constexpr int kWgmmaAttnKeys = 64;      // keys per tile; each warpgroup scores half of them
// fp8 records are staged half a tile (32 keys) at a time, each in a row of at most this many
// bytes: V4's record of 512 channels with 64 RoPE channels is 584 (kv_record.cuh); the bound is
// what the shared memory of two bf16 key buffers leaves.
constexpr int kWgmmaAttnStageKeys = kWgmmaAttnKeys / 2;
constexpr int kWgmmaAttnStageRowBytes = 800;

// Shared memory, in the order of the regions (every bf16 tile in wgmma's no-swizzle core-matrix
// layout: 8 rows x 16 bytes per 128-byte core matrix, core matrices [channel / 8][row / 8]):
//   q       [64 chunks of 8 channels][64 heads][8]  bf16   64 KB
//   kb0/1   [64 chunks][64 keys][8]                 bf16   2 x 64 KB   the key tiles
//   p       [8 chunks of 8 keys][64 heads][8]       bf16    8 KB   the tile's probabilities
//   stage   [32 keys][row bytes]                    fp8 records of half a tile (fp8 KV only)
//   xchg    [2 warpgroups][64] f32                 row maxima, at the end the denominators
//   valid   [2 buffers][64] int                    which keys of a tile are real
struct WgmmaAttnLayout {
  static constexpr size_t kQBytes = size_t{kWgmmaAttnRows} * kWgmmaAttnDim * 2;
  static constexpr size_t kKbBytes = size_t{kWgmmaAttnKeys} * kWgmmaAttnDim * 2;
  static constexpr size_t kPBytes = size_t{kWgmmaAttnRows} * kWgmmaAttnKeys * 2;
  static constexpr size_t kStageBytes = size_t{kWgmmaAttnStageKeys} * kWgmmaAttnStageRowBytes;
  static constexpr size_t kQOff = 0;
  static constexpr size_t kKbOff = kQOff + kQBytes;  // buffer b at kKbOff + b * kKbBytes
  static constexpr size_t kPOff = kKbOff + 2 * kKbBytes;
  static constexpr size_t kStageOff = kPOff + kPBytes;
  static constexpr size_t kXchgOff = kStageOff + kStageBytes;
  static constexpr size_t kValidOff = kXchgOff + 2 * kWgmmaAttnRows * sizeof(float);
  static constexpr size_t kBytes = kValidOff + 2 * kWgmmaAttnKeys * sizeof(int);
  static_assert(kKbOff % 128 == 0 && kPOff % 128 == 0 && kStageOff % 16 == 0 &&
                    kXchgOff % 16 == 0 && kValidOff % 16 == 0,
                "aligned regions (wgmma core matrices, cp.async)");
  static_assert(kBytes <= 227 * 1024, "fits Hopper's opt-in shared memory per block");
};

// Tiles a block is assumed to spend beyond its key tiles (q, the first copy, the epilogue).
constexpr int64_t kWgmmaAttnOverheadTiles = 1;

// Whether the kernel takes the shape: 64 heads or a multiple, D = 512, bf16 rows or (fp8) records
// of at most kWgmmaAttnStageRowBytes bytes, a multiple of 8 (the 8-byte copies).
constexpr bool wgmma_attention_shape(int64_t heads, int64_t dim, bool fp8, int64_t row_bytes) {
  return heads > 0 && heads % kWgmmaAttnRows == 0 && dim == kWgmmaAttnDim &&
         (!fp8 || (row_bytes <= kWgmmaAttnStageRowBytes && row_bytes % 8 == 0));
}

// The prefetching variant (attention_wgmma_prefetch_kernel, DEEPINFER_ATTENTION_KERNEL=
// wgmma_prefetch) holds fp8 records in registers, cut for V4's main record only: 448 e4m3
// channels, 64 bf16 RoPE channels, 7 scales and a pad byte (kv_record.h). bf16 rows: any.
constexpr int kWgmmaPrefetchNope = 448;
constexpr int kWgmmaPrefetchRope = 64;
constexpr int kWgmmaPrefetchRecordBytes = 584;

constexpr bool wgmma_prefetch_takes(bool fp8, int64_t dim, int64_t rope_dim, int64_t row_bytes) {
  return !fp8 || (dim - rope_dim == kWgmmaPrefetchNope && rope_dim == kWgmmaPrefetchRope &&
                  row_bytes == kWgmmaPrefetchRecordBytes);
}

// 64 heads per block and the split count that minimises waves x (tiles per split + overhead),
// ties to fewer splits (separate_mma_plan's rule over 64-key tiles); `forced_splits` > 0 (the
// DEEPINFER_ATTENTION_SPLITS choice) is taken as it is, capped by the tiles. The splits are
// always merged by attention_combine.cu (no fused combine here).
inline AttentionMmaPlan wgmma_attention_plan(int64_t tokens, int64_t heads, int64_t max_keys,
                                             int64_t sms, int64_t max_splits,
                                             int64_t forced_splits) {
  AttentionMmaPlan p;
  p.rows = kWgmmaAttnRows;
  p.slices = 0;  // no mma.sync warp layout
  p.head_groups = (heads + kWgmmaAttnRows - 1) / kWgmmaAttnRows;
  const int64_t tiles = std::max<int64_t>(1, (max_keys + kWgmmaAttnKeys - 1) / kWgmmaAttnKeys);
  const int64_t cap = std::max<int64_t>(1, std::min(tiles, max_splits));
  if (forced_splits > 0) {
    p.splits = std::min(forced_splits, cap);
    return p;
  }
  const int64_t blocks = tokens * p.head_groups;
  sms = std::max<int64_t>(1, sms);
  int64_t best = -1;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t waves = (blocks * s + sms - 1) / sms;
    const int64_t cost = waves * ((tiles + s - 1) / s + kWgmmaAttnOverheadTiles);
    if (best < 0 || cost < best) {
      best = cost;
      p.splits = s;
    }
  }
  return p;
}

// The warp-specialised variant's in-kernel merge (AttentionMmaPlan::cluster_merge): a token's
// splits are one cluster, at most the portable cluster size (8 blocks, each an SM of its own).
constexpr int64_t kWgmmaClusterMergeMaxSplits = 8;

// The overlap kernel's pair mode (DEEPINFER_ATTENTION_KERNEL=wgmma_overlap_pair, opt-in): two
// blocks of 64 heads per cluster, so a multiple of 128 heads; the plan is wgmma_attention_plan's.
constexpr bool wgmma_pair_takes(int64_t heads) {
  return heads > 0 && heads % (2 * kWgmmaAttnRows) == 0;
}

}  // namespace deepinfer::cuda
