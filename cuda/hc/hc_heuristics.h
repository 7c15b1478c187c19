// The launch shapes of the mHC ops (hc_pre.cu, hc_fused.cu): the collapse's blocks per token and
// the blocks of hc_pre's weight role.
#pragma once

#include <cstdint>

#include "common/host_device.h"

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

// The fused decode path of hc_pre, hc_post_pre and hc_head (hc_fused_kernel): one launch
// computes the mix GEMV, the norm, the weights and the collapse (and hc_post_pre's trunk update).
// Token group g (tokens_per_cta consecutive tokens) is split over `splits` CTAs, CTA s taking
// channels [s * chunk, (s + 1) * chunk) of every stream; the CTAs of a group are one thread-block
// cluster and meet at its barrier (the hardware schedules a cluster's CTAs together). Larger T
// keeps the unfused path (rms_norm, cuBLAS, finish kernel), where the GEMM's tile reuse pays.
constexpr int kHcFusedThreads = 256;
// The fused kernel's threads hold sums of up to 24 fn rows in registers: (2 + n) * n <= 24, n <= 4.
constexpr int kHcFusedMaxN = 4;
constexpr int kHcFusedMaxRows = (2 + kHcFusedMaxN) * kHcFusedMaxN;
constexpr int64_t kHcFusedMaxTokens = 256;
// A CTA's slice is at least this many channels (the last one may be shorter), so the partial
// sums stay few against the work.
constexpr int64_t kHcFusedMinChunk = 32;
// CTAs of a token group: one cluster, of the portable cluster size or, where the device
// schedules it (hc_fused_max_cluster), the non-portable 16: at one token the 1.5 MB of fn is
// then read by twice the SMs (H100: hc_pre 10.1 us instead of 12.2, session 37).
constexpr int64_t kHcFusedPortableCluster = 8;
constexpr int64_t kHcFusedWideCluster = 16;

// DEEPINFER_HC_PRE: which path hc_pre, hc_head and hc_post_pre take. The unfused path computes
// the mix by hc_mix_split_kernel where hc_mix_split_grid applies (except kLegacy), else by
// rms_norm and cuBLAS's GEMM, then a finish kernel.
enum class HcPreChoice {
  kAuto,    // the fused kernel up to kHcFusedAutoMaxTokens tokens, the unfused path above
  kFused,   // the fused kernel wherever hc_fused_grid applies (T <= kHcFusedMaxTokens)
  kSplit,   // always the unfused path, its mix split over K where it applies
  kLegacy,  // always the unfused path, its mix by rms_norm and cuBLAS
};
// The default's bound: on an H100 the fused kernel made the decode step 2.0% faster at B = 1
// and 4.1% at B = 8, but 1.2% slower at B = 64 (session 37, 16-CTA clusters).
constexpr int64_t kHcFusedAutoMaxTokens = 8;

struct HcFusedGrid {
  bool fused = false;  // false: the unfused path
  int tokens_per_cta = 0;
  int64_t groups = 0;
  int64_t splits = 0;
  int64_t chunk = 0;  // channels per CTA, a multiple of 4 (float4 loads)
};

// Decode sizes (T <= kHcFusedMaxTokens, hc_mult <= kHcFusedMaxN, hidden a multiple of 4) take
// the fused kernel when the device has clusters (max_cluster, the largest cluster it schedules:
// 0 without clusters); up to 8 tokens one token per CTA group, else 4 (the fn slice each CTA
// reads is then shared by 4 tokens). The groups get num_sms / groups splits each (one CTA per
// SM), at most max_cluster and at least kHcFusedMinChunk channels per split.
inline HcFusedGrid hc_fused_grid(int num_sms, int64_t tokens, int n, int64_t hidden,
                                 int64_t max_cluster) {
  HcFusedGrid g;
  if (tokens < 1 || tokens > kHcFusedMaxTokens || n < 1 || n > kHcFusedMaxN || hidden < 4 ||
      hidden % 4 != 0 || max_cluster < 1) {
    return g;
  }
  g.tokens_per_cta = tokens <= 8 ? 1 : 4;
  g.groups = (tokens + g.tokens_per_cta - 1) / g.tokens_per_cta;
  if (g.groups > num_sms) return g;
  int64_t max_splits = hidden >= 2 * kHcFusedMinChunk ? hidden / kHcFusedMinChunk : 1;
  max_splits = max_splits < max_cluster ? max_splits : max_cluster;
  int64_t splits = num_sms / g.groups;
  splits = splits > max_splits ? max_splits : splits;
  const int64_t per_split = (hidden + splits - 1) / splits;
  g.chunk = (per_split + 3) / 4 * 4;
  g.splits = (hidden + g.chunk - 1) / g.chunk;
  g.fused = true;
  return g;
}

// The fused kernel's clusters on a device (hc_launch.h: hc_fused_max_cluster): the largest size
// it schedules (0: no clusters) and how many of that size it keeps active at once.
struct HcFusedClusters {
  int max_cluster = 0;
  int at_once = 0;
};

// DEEPINFER_HC_CLUSTER: the fused kernel's cluster size.
enum class HcClusterChoice {
  kAuto,      // "auto": the widest the device schedules while every token group's cluster of that
              // size is active at once, else kHcFusedPortableCluster (hc_fused_cluster_for)
  kWidest,    // "widest": the widest the device schedules, however many groups
  kPortable,  // "portable": kHcFusedPortableCluster
};

// The cluster size the fused kernel takes at T tokens. max_cluster: the widest the device
// schedules (hc_fused_max_cluster); wide_at_once: how many clusters of that size it keeps active at
// once. Where the token groups (one per token up to 8, else per 4) outnumber those, a group's
// cluster would wait for another's to finish, doubling the kernel's time, so auto takes the
// portable size (more of its clusters fit: each GPC holds two).
inline int64_t hc_fused_cluster_for(HcClusterChoice choice, int64_t tokens, int64_t max_cluster,
                                    int64_t wide_at_once) {
  if (max_cluster <= kHcFusedPortableCluster || choice == HcClusterChoice::kWidest) {
    return max_cluster;
  }
  if (choice == HcClusterChoice::kPortable) return kHcFusedPortableCluster;
  const int64_t groups = tokens <= 8 ? tokens : (tokens + 3) / 4;
  return groups <= wide_at_once ? max_cluster : kHcFusedPortableCluster;
}

// Whether `choice` takes the fused kernel for T tokens where hc_fused_grid gave `g`.
inline bool hc_fused_chosen(HcPreChoice choice, const HcFusedGrid& g, int64_t tokens) {
  switch (choice) {
    case HcPreChoice::kFused:
      return g.fused;
    case HcPreChoice::kAuto:
      return g.fused && tokens <= kHcFusedAutoMaxTokens;
    case HcPreChoice::kSplit:
    case HcPreChoice::kLegacy:
      return false;
  }
  return false;
}

// The unfused path's mix at decode and small prefill sizes (hc_mix_split_kernel, hc_mix.cu):
// mix = linear(rms_norm(flatten(X)), fn) as K-split partial sums. CTA (tile, split) takes
// kHcMixTokens tokens and `chunk` consecutive columns of their flattened rows [n * hidden]; it
// writes each token's fn-row dot products and sum of squares over its columns, and the finish
// kernel sums the splits in order and scales by the inverse RMS (the fused kernel's arithmetic).
// cuBLAS's f32 GEMM after a separate rms_norm took ~21 us per call at 64 tokens on an H100 (the
// norm 6.7, a SIMT sgemm 8.6, its split-K reduce 5.9; session 57's trace) for ~6 MB of bytes.
// Past kHcMixSplitMaxTokens the GEMM's tile reuse pays (each token tile re-reads fn).
// The kernel issues ~25 M FMAs at 64 tokens: with one 256-thread CTA per SM (169 registers) it
// took 15.5 us under ncu, issue-bound (session 57); 512 threads hold 16 warps per SM.
constexpr int kHcMixThreads = 512;
constexpr int kHcMixTokens = 16;      // a tile: 4 token groups of 4 per warp's lanes
constexpr int kHcMixSubChunk = 256;   // columns staged in shared memory at a time
constexpr int kHcMixColumnStep = 64;  // 16 warps x 4 columns: the chunk's granularity
// On an H100 (session 57, 256-thread CTAs) hc_pre at 64 tokens took 21.6 us split against 23.6
// by cuBLAS, at 256 tokens 66.0 against 43.1.
constexpr int64_t kHcMixSplitMaxTokens = 64;

struct HcMixSplitGrid {
  bool split = false;  // false: rms_norm and cuBLAS
  int64_t tiles = 0;   // token tiles of kHcMixTokens
  int64_t splits = 0;  // CTAs over the columns of a tile
  int64_t chunk = 0;   // columns per split, a multiple of kHcMixColumnStep (the last may be short)
};

// T <= kHcMixSplitMaxTokens, n <= kHcFusedMaxN (fn rows within a warp's lanes), n * hidden a
// multiple of 4 (float4 loads). The splits give about one CTA per SM over all tiles, each at
// least kHcMixColumnStep columns.
inline HcMixSplitGrid hc_mix_split_grid(int num_sms, int64_t tokens, int n, int64_t hidden) {
  HcMixSplitGrid g;
  const int64_t width = n * hidden;
  if (tokens < 1 || tokens > kHcMixSplitMaxTokens || n < 1 || n > kHcFusedMaxN || width < 4 ||
      width % 4 != 0 || num_sms < 1) {
    return g;
  }
  g.tiles = (tokens + kHcMixTokens - 1) / kHcMixTokens;
  const int64_t steps = (width + kHcMixColumnStep - 1) / kHcMixColumnStep;
  int64_t splits = (num_sms + g.tiles - 1) / g.tiles;
  splits = splits < 1 ? 1 : (splits > steps ? steps : splits);
  g.chunk = (steps + splits - 1) / splits * kHcMixColumnStep;
  g.splits = (width + g.chunk - 1) / g.chunk;
  g.split = true;
  return g;
}

// Whether `choice` computes the unfused mix by hc_mix_split_kernel where the grid is `g`.
inline bool hc_mix_split_chosen(HcPreChoice choice, const HcMixSplitGrid& g) {
  return g.split && choice != HcPreChoice::kLegacy;
}

// The column of a token's flattened row [n * hidden] that unit u of a fused CTA reads (4 from
// there): the CTA's slice starts at channel h_begin and holds `quads` float4 columns of each
// stream; unit u is stream u / quads, float4 column u % quads.
// 32-bit unit and quad counts (a CTA's units are n * quads <= 4 * hidden / 4): the kernel divides
// once per unit, and a 64-bit division by a runtime value is a ~70-instruction call.
DEEPINFER_HOST_DEVICE inline int64_t hc_fused_column(int u, int quads, int64_t hidden,
                                                     int64_t h_begin) {
  const int s = u / quads;
  return s * hidden + h_begin + static_cast<int64_t>(u - s * quads) * 4;
}

}  // namespace deepinfer::cuda
