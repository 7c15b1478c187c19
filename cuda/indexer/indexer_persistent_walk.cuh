// The tokens of a persistent indexer block's range (indexer_score_wgmma_persistent.cu): the
// block's share of the group's tiles of kMmaKeys keys, flattened in token order (the prologue
// that finds it), and a warp's walk over the tokens that hold them, so that the producer warp and
// the q warps see the same tokens with the same tiles.
#pragma once

#include <cstdint>

#include "cuda/common/layout.cuh"
#include "cuda/indexer/indexer_e4m3_bits.h"
#include "cuda/indexer/indexer_launch.h"

namespace deepinfer::cuda::indexer_persistent {

__device__ __forceinline__ int64_t tiles_of(int64_t visible) {
  return (visible + kMmaKeys - 1) / kMmaKeys;
}

// The block's range: `count` tiles from tile `first_tile` of token `first_token` (of the group;
// that token has more than first_tile tiles).
struct BlockRange {
  int first_token;
  int64_t first_tile;
  int64_t count;
};

// The block's range of the flattened tiles, and whether the prologue's tables are in shared
// memory (every thread of the block gets the same).
struct BlockSchedule {
  BlockRange range;
  bool tables;
};

// Each thread sums the tile counts of a contiguous share of the group's n tokens, a block scan
// places the shares, and the thread whose share holds the range's first tile names its token.
// With at most one token per thread and fewer sequences than threads (decode batches up to the
// block's threads), the prologue's loads of positions and q_start go out together and their
// values stay in shared memory as tables: the producer's and q warps' token walks and the
// producer's sequence searches then read no global memory before the block-table entry of the
// first copy. (Before, that copy waited on the positions again, then two dependent q_start reads
// after the scan's; on the H200 the tables cut B = 64 at 32K from 26.2 to 25.1 us and at 4K
// from 9.1 to 8.6, session 35.)
// `scan`: kThreads / 32 + 2 int64; `tok_visible`: kThreads ints; `q_start`: kThreads + 1 ints
// (shared memory).
template <int kThreads>
__device__ BlockSchedule locate_block_range(const ScoreArgs& a, const DeviceLayout& l, int n,
                                            int64_t* scan, int32_t* tok_visible, int32_t* q_start) {
  constexpr int kWarps = kThreads / 32;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const bool tables = n <= kThreads && l.num_seqs < kThreads;
  const int per = (n + kThreads - 1) / kThreads;
  const int lo = min(n, tid * per);
  const int hi = min(n, lo + per);
  auto tiles_of = [&](int g) {
    return indexer_persistent::tiles_of(
        visible_entries(l.positions[a.token0 + g], a.ratio, a.bound));
  };
  int64_t mine = 0;
  if (tables) {
    // One token per thread at most: both loads in flight at once.
    const int32_t seq_start = tid <= l.num_seqs ? l.q_start[tid] : 0;
    const int64_t visible =
        lo < hi ? visible_entries(l.positions[a.token0 + lo], a.ratio, a.bound) : 0;
    if (tid <= l.num_seqs) q_start[tid] = seq_start;
    if (lo < hi) tok_visible[lo] = static_cast<int32_t>(visible);  // <= bound < 2^31
    mine = indexer_persistent::tiles_of(visible);
  } else {
    for (int g = lo; g < hi; ++g) mine += tiles_of(g);
  }
  int64_t inclusive = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t v = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += v;
  }
  if (lane == 31) scan[warp] = inclusive;
  __syncthreads();
  int64_t before = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    const int64_t s = scan[w];
    if (w < warp) before += s;
    total += s;
  }
  const indexer_e4m3::TileRange r =
      indexer_e4m3::persistent_tile_range(total, gridDim.x, blockIdx.x);
  int64_t at = before + inclusive - mine;  // the block's first tile of token lo
  if (r.count > 0 && at <= r.first && r.first < at + mine) {
    for (int g = lo; g < hi; ++g) {
      const int64_t t = tables ? mine : tiles_of(g);  // tables: lo is the share's one token
      if (r.first < at + t) {
        scan[kWarps] = g;
        scan[kWarps + 1] = r.first - at;
        break;
      }
      at += t;
    }
  }
  __syncthreads();
  if (r.count == 0) return {{0, 0, 0}, tables};
  return {{static_cast<int>(scan[kWarps]), scan[kWarps + 1], r.count}, tables};
}

// A token of the range: its group index, visible entries, and its tiles first_tile ..
// first_tile + tiles - 1 inside the range (tiles > 0).
struct SpanToken {
  int g;
  int64_t visible;
  int64_t first_tile;
  int64_t tiles;
};

// The range's tokens in order for one converged warp: lane m holds the visible entries of token
// base + m, so that runs of short tokens cost one load per 32 tokens.
// `visible`: the tokens' visible entries in shared memory (the prologue's), or null: from the
// positions.
class SpanWalker {
 public:
  __device__ SpanWalker(const ScoreArgs& a, const DeviceLayout& l, int n, const BlockRange& r,
                        const int32_t* visible)
      : positions_(l.positions),
        visible_(visible),
        token0_(a.token0),
        ratio_(a.ratio),
        bound_(a.bound),
        n_(n),
        g_(r.first_token),
        first_tile_(r.first_tile),
        left_(r.count) {
    load(g_);
  }

  // The next token with tiles in the range; false once the range is done.
  __device__ bool next(SpanToken& tok) {
    if (left_ <= 0) return false;
    const int lane = static_cast<int>(threadIdx.x) & 31;
    int g = g_;
    for (;;) {
      if (g >= n_) {  // the range runs past the group: cannot happen with the same positions
        left_ = 0;
        return false;
      }
      if (g >= base_ + 32) load(g);
      const unsigned ahead =
          __ballot_sync(0xffffffffu, lane >= g - base_ && tiles_of(lane_visible_) > 0);
      if (ahead != 0) {
        g = base_ + __ffs(static_cast<int>(ahead)) - 1;
        break;
      }
      g = base_ + 32;
    }
    const int64_t visible = __shfl_sync(0xffffffffu, lane_visible_, g - base_);
    tok.g = g;
    tok.visible = visible;
    tok.first_tile = first_tile_;
    tok.tiles = min(tiles_of(visible) - first_tile_, left_);
    left_ -= tok.tiles;
    g_ = g + 1;
    first_tile_ = 0;
    return true;
  }

 private:
  __device__ void load(int base) {
    base_ = base;
    const int g = base + (static_cast<int>(threadIdx.x) & 31);
    lane_visible_ = g >= n_ ? 0
                    : visible_ != nullptr
                        ? visible_[g]
                        : visible_entries(positions_[token0_ + g], ratio_, bound_);
  }

  const int32_t* positions_;
  const int32_t* visible_;
  int token0_;
  int ratio_;
  int64_t bound_;
  int n_;
  int g_;               // the next token to look at
  int64_t first_tile_;  // its first tile in the range (the range's first token: its first_tile)
  int64_t left_;        // tiles of the range not yet walked
  int base_ = 0;
  int64_t lane_visible_ = 0;
};

}  // namespace deepinfer::cuda::indexer_persistent
