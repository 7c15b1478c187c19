// The tokens of a persistent indexer block's range (indexer_score_wgmma_persistent.cu): the
// block's share of the group's tiles of kMmaKeys keys, flattened in token order, and a warp's
// walk over the tokens that hold them, so that the producer warp and the q warps see the same
// tokens with the same tiles.
#pragma once

#include <cstdint>

#include "cuda/common/layout.cuh"
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
