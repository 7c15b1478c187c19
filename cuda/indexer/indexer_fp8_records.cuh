// fp8 index keys staged in shared memory as the cache stores them: records of kFp8RecordBytes
// (kMmaDim e4m3 codes, then the key's f32 scale), key n of a tile at byte kFp8RecordBytes n.
// The tensor-core scoring kernels (indexer_score_mma.cu, indexer_score_wgmma.cu) copy a tile of
// kMmaKeys keys of a sequence with these, either in runs of a paged block (16-byte copies where
// score_mma_key_runs allows) or key by key (4-byte copies: records are only 4-byte aligned).
#pragma once

#include <cstdint>

#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_sm80.cuh"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda {

constexpr int kFp8RecordBytes = kMmaDim + 4;

// Copies tile keys j0 .. j0 + kMmaKeys - 1 of sequence b as fp8 records into `records` with
// 16-byte cp.async, and sets mapped[n] (whether key n is visible and mapped). The tile is cut
// into runs of min(epb, kMmaKeys) keys, each inside one paged block, so each run's records are
// contiguous in the cache (rows row0, row0 + 1, ...: key n of a run is mapped when row0 is and
// row0 + n is inside the cache); a run and its first record start 16-byte aligned
// (score_mma_key_runs: epb and the cache's rows are multiples of 4). A run copies its visible,
// mapped prefix, rounded up to whole 16-byte pieces: the rounding reads at most into the run's
// next record, inside the cache. Every thread looks up each run's row (one block-table read, the
// same for all), so that the pieces need no index math. Any block size of at least
// min(epb, kMmaKeys) threads.
__device__ __forceinline__ void issue_fp8_record_runs(const ScoreArgs& a, const DeviceLayout& l,
                                                      int b, int64_t j0, int64_t visible,
                                                      uint8_t* records, int* mapped) {
  constexpr int kPieceBytes = 16;
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int run_keys = min(a.epb, kMmaKeys);
  for (int run = 0; run < kMmaKeys / run_keys; ++run) {
    const int64_t j = j0 + static_cast<int64_t>(run) * run_keys;
    const int64_t row0 = j < visible ? entry_row(l, b, j, a.epb, a.cache_rows) : -1;
    // Keys of the run that are visible and inside the cache.
    const int keys = row0 < 0
                         ? 0
                         : static_cast<int>(min(min(visible - j, static_cast<int64_t>(run_keys)),
                                                a.cache_rows - row0));
    if (tid < run_keys) mapped[run * run_keys + tid] = tid < keys;
    if (keys == 0) continue;  // uniform over the block
    const uint8_t* src = a.cache + row0 * kFp8RecordBytes;
    uint8_t* dst = records + run * run_keys * kFp8RecordBytes;
    for (int piece = tid; piece * kPieceBytes < keys * kFp8RecordBytes; piece += threads) {
      cp_async_16(dst + piece * kPieceBytes, src + piece * kPieceBytes);
    }
  }
}

// The same tile key by key, for any paged layout: warp w of `warps` copies keys w, w + warps,
// ... (lane m looks up the row of the warp's m-th key first, so that the block-table reads are in
// flight together), each record as 33 four-byte copies (lane u: bytes 4u .. 4u + 3; lane 0 also
// the scale). Sets mapped[n] as issue_fp8_record_runs does.
__device__ __forceinline__ void issue_fp8_record_keys(const ScoreArgs& a, const DeviceLayout& l,
                                                      int b, int64_t j0, int64_t visible,
                                                      uint8_t* records, int* mapped) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  const int warp_keys = (kMmaKeys + warps - 1 - warp) / warps;  // keys warp, warp + warps, ...
  int64_t my_row = -1;
  if (lane < warp_keys) {
    const int n = warp + lane * warps;
    const int64_t j = j0 + n;
    my_row = j < visible ? entry_row(l, b, j, a.epb, a.cache_rows) : -1;
    mapped[n] = my_row >= 0;
  }
  for (int m = 0; m < warp_keys; ++m) {
    const int64_t row = __shfl_sync(0xffffffffu, my_row, m);
    if (row < 0) continue;
    const uint8_t* src = a.cache + row * kFp8RecordBytes;
    uint8_t* dst = records + (warp + m * warps) * kFp8RecordBytes;
    cp_async_4(dst + 4 * lane, src + 4 * lane);
    if (lane == 0) cp_async_4(dst + kMmaDim, src + kMmaDim);
  }
}

}  // namespace deepinfer::cuda
