// The launch shapes of the mHC ops (hc.cu): the collapse's blocks per token and the blocks of
// hc_pre's weight role.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// The per-token kernels keep the stream weights (and hc_pre's n x n matrix) in shared memory;
// this bounds hc_mult so that fits in the default 48 KB with room to spare.
constexpr int kMaxHcMult = 64;

// Launch shape of the collapse y[t, h] = sum_s pre[t, s] * X[t, s, h]: `splits` blocks per token,
// each over `chunk` consecutive channels (a multiple of kHcThreads; the last may be partial).
constexpr int kHcThreads = 128;
static_assert(kMaxHcMult <= kHcThreads, "thread s computes pre[s]; thread i owns row i");

// Streams of one channel whose loads the collapse issues together.
constexpr int kStreamBatch = 8;

struct CollapseGrid {
  int64_t splits = 0;
  int64_t chunk = 0;
};

// At small T (decode) the channels are split so that about one channel per thread is in flight
// over many SMs (the collapse is then one memory round trip); at large T the tokens alone fill
// the GPU and each block takes a whole token.
inline CollapseGrid collapse_grid(int num_sms, int64_t tokens, int64_t hidden) {
  CollapseGrid g;
  if (tokens == 0 || hidden == 0) return g;
  const int64_t fill = static_cast<int64_t>(num_sms) * (2048 / kHcThreads);
  const int64_t max_splits = (hidden + kHcThreads - 1) / kHcThreads;
  int64_t splits = (fill + tokens - 1) / tokens;
  splits = splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
  const int64_t per_split = (hidden + splits - 1) / splits;
  g.chunk = (per_split + kHcThreads - 1) / kHcThreads * kHcThreads;
  g.splits = (hidden + g.chunk - 1) / g.chunk;
  return g;
}

// Blocks of hc_pre's weight role: one warp per token when n * n <= 32, else a block per token.
inline int64_t hc_weight_blocks(int n, int64_t tokens) {
  return n * n <= 32 ? (tokens + kHcThreads / 32 - 1) / (kHcThreads / 32) : tokens;
}

}  // namespace deepinfer::cuda
