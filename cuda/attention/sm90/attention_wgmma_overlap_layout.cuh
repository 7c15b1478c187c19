// The warp-specialised Hopper attention kernel's block (sm90/attention_wgmma_overlap.cu, whose
// head comment describes the roles and their synchronisation): its warpgroups and their register
// shares, the named barriers each fixed pair of roles uses, and its shared-memory layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"

namespace deepinfer::cuda::attention_wgmma {

constexpr int kOverlapThreads = 384;
constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1
constexpr int kProducerThreads = 128;  // warpgroup 2
constexpr int kScorerRegs = 216;
constexpr int kValueRegs = 168;  // __launch_bounds__(384, 1)'s share: warpgroup 1 keeps it
constexpr int kProducerRegs = 120;
static_assert(kScorerRegs + kValueRegs + kProducerRegs == 3 * 168,
              "setmaxnreg moves registers between the warpgroups, the total stays the block's");

// Pair mode: a full[b] phase takes one arrival per producer thread of its own block (and the
// peer's bytes as transactions), an empty[b] phase one per consumer warp of both blocks.
constexpr int kPairBlocks = 2;
constexpr uint32_t kPairFullArrivals = kProducerThreads;
constexpr uint32_t kPairEmptyArrivals = kPairBlocks * kConsumerThreads / 32;

enum OverlapBarrier : int {
  kTileFull = 1,    // + buffer
  kTileEmpty = 3,   // + buffer
  kProbsReady = 5,  // + buffer
  kProbsFree = 7,   // + buffer
  kRowsReady = 9,
  kStartBarrier = 10,
  kMergeBarrier = 11,  // the consumers, in merge_cluster_splits
  // kIlp: both consumer warpgroups past their last products (the key buffers free for the
  // output), then each warpgroup's own barrier (+ warpgroup) once its rows are staged.
  kOutputBarrier = 12,
  kStageBarrier = 13,  // + warpgroup 0 or 1: 13, 14
  // Persistent pairs: warpgroup 1 arrives once its half of the next unit's q is stored, the
  // scorer syncs before that unit's first scores.
  kQueryReady = 15,
};

// The launch's units of work (pair mode): a token's two 64-head groups and one key split each,
// unit u = t + tokens (head pair + head_pairs split); cluster c walks units c, c + clusters, ...
// (persistent when clusters < units). Unpaired launches ignore it (a block's unit is its
// blockIdx).
struct OverlapWork {
  int tokens = 0;
  int head_pairs = 0;
  int splits = 1;
  int units = 0;     // tokens x head_pairs x splits
  int clusters = 0;  // the launch's clusters, at most units
};

// A block's current unit: its token, first head and key split.
struct OverlapUnit {
  int t;
  int h_first;
  int split;
};

// Shared memory: q, two key tiles, two probability tiles (all 1 KB aligned for the swizzle),
// the keys' valid flags and the rescale alphas per buffer, the final max and denominator per row.
struct OverlapLayout {
  static constexpr size_t kQBytes = size_t{kRows} * kDim * 2;
  static constexpr size_t kKbBytes = size_t{kKeys} * kDim * 2;
  static constexpr size_t kPBytes = size_t{kRows} * kKeys * 2;
  static constexpr size_t kQOff = 0;
  static constexpr size_t kKbOff = kQOff + kQBytes;  // buffer b at kKbOff + b * kKbBytes
  static constexpr size_t kPOff = kKbOff + 2 * kKbBytes;
  static constexpr size_t kValidOff = kPOff + 2 * kPBytes;
  static constexpr size_t kAlphaOff = kValidOff + 2 * kKeys * sizeof(int);
  static constexpr size_t kRowsOff = kAlphaOff + 2 * kRows * sizeof(float);  // max, then denom
  static constexpr size_t kBytes = kRowsOff + 2 * kRows * sizeof(float);
  // The pair mode's mbarriers after the rest: full[2], then empty[2].
  static constexpr size_t kBarOff = kBytes;
  static constexpr size_t kPairBytes = kBarOff + 4 * sizeof(uint64_t);
  static_assert(kBarOff % 8 == 0, "aligned mbarriers");
  static_assert(kValidOff % 8 == 0, "the softmax reads a key pair's flags in one 8-byte load");
  static_assert(kPairBytes <= 227 * 1024, "fits Hopper's opt-in shared memory per block");
  static_assert(kKbOff % 1024 == 0 && kKbBytes % 1024 == 0 && kPOff % 1024 == 0 &&
                    kPBytes % 1024 == 0,
                "1 KB aligned tiles");
  static_assert(kBytes <= 227 * 1024, "fits Hopper's opt-in shared memory per block");
};

static_assert(kProducerThreads == 2 * kKeys, "two producer threads per key (unpaired)");

}  // namespace deepinfer::cuda::attention_wgmma
