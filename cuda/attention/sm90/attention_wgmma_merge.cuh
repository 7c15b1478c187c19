// The in-kernel merge of a token's key splits (AttentionMmaPlan::cluster_merge, the
// warp-specialised kernel under DEEPINFER_ATTENTION_KERNEL=wgmma_overlap_fused). The splits of a
// (token, head group) are one thread-block cluster (dims (1, 1, splits)), so they run at the same
// time: after each block has written its split output (store_output's format), a cluster barrier
// (release / acquire) makes every split visible to every block, and block z merges heads
// 64 z / splits .. 64 (z + 1) / splits of the group with the sinks into the output. At B = 1 this
// saves the combine kernel's launch and its wait for the split grid to end. The arithmetic is
// attention_combine.cu's, in the same order (max from the sink over the splits, the weights, the
// denominator from the sink's term, the weighted sums from split 0, one multiply by the inverse),
// so the output has the combine kernel's bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/sm90/attention_wgmma_config.h"
#include "cuda/attention/sm90/attention_wgmma_tiles.cuh"
#include "cuda/common/layout.cuh"
#include "cuda/common/ptx_cluster.cuh"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda::attention_wgmma {

constexpr int kMergeMaxSplits = static_cast<int>(kWgmmaClusterMergeMaxSplits);

// Shared memory the merge takes (free once the tiles are done): a weight per (head, split) and an
// inverse denominator per head.
constexpr size_t kMergeSmemBytes = size_t{kRows} * (kMergeMaxSplits + 1) * sizeof(float);

// Called by the kThreads threads (whole warps) that wrote the block's split output, right after
// they wrote it; the block's other threads have exited or do not call it (an exited thread counts
// as arrived at the cluster barrier). `scratch`: kMergeSmemBytes of the block's shared memory no
// one else uses any more; kBarrier: a named barrier of these threads. With one split nothing to
// do (store_output wrote the output).
template <int kMergeThreads, int kBarrier>
__device__ __forceinline__ void merge_cluster_splits(const AttentionArgs& a, const DeviceLayout& l,
                                                     int t, int h_first, int ctid, float* scratch) {
  const int splits = static_cast<int>(gridDim.z);
  if (splits == 1) return;
  __syncwarp();
  cluster_arrive_release();  // this thread's part of the split output
  cluster_wait_acquire();    // every split of the cluster written
  const int split = static_cast<int>(blockIdx.z);
  const int lo = kRows * split / splits;
  const int hi = kRows * (split + 1) / splits;
  const int64_t stride = static_cast<int64_t>(l.num_tokens) * a.heads;  // between splits
  float* w_s = scratch;                                                 // [kRows][kMergeMaxSplits]
  float* inv_s = scratch + kRows * kMergeMaxSplits;                     // [kRows]
  // Weights and denominators of the slice's heads, one thread per head. The split outputs were
  // written by other blocks in this grid: loads through L2 (coherent after the acquire).
  for (int h = lo + ctid; h < hi; h += kMergeThreads) {
    const int64_t idx = static_cast<int64_t>(t) * a.heads + h_first + h;
    const float sink = a.sinks[h_first + h];
    float m[kMergeMaxSplits];
    float d[kMergeMaxSplits];
    float mx = sink;
#pragma unroll
    for (int s = 0; s < kMergeMaxSplits; ++s) {
      if (s < splits) {
        m[s] = __ldcg(a.part_md + 2 * (s * stride + idx));
        d[s] = __ldcg(a.part_md + 2 * (s * stride + idx) + 1);
        mx = fmaxf(mx, m[s]);
      }
    }
    float den = expf(sink - mx);
#pragma unroll
    for (int s = 0; s < kMergeMaxSplits; ++s) {
      if (s < splits) {
        const float w = m[s] == -INFINITY ? 0.0f : expf(m[s] - mx);  // an empty split weighs 0
        den += d[s] * w;
        w_s[h * kMergeMaxSplits + s] = w;
      }
    }
    inv_s[h] = 1.0f / den;
  }
  named_barrier<kMergeThreads>(kBarrier);
  constexpr int kVecs = kDim / 4;  // float4 per head
  for (int v = ctid; v < (hi - lo) * kVecs; v += kMergeThreads) {
    const int h = lo + v / kVecs;
    const int c4 = v % kVecs;
    const int64_t idx = static_cast<int64_t>(t) * a.heads + h_first + h;
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kMergeMaxSplits; ++s) {
      if (s < splits) {
        const float4 x =
            __ldcg(reinterpret_cast<const float4*>(a.part_acc + (s * stride + idx) * kDim) + c4);
        r = fma4(w_s[h * kMergeMaxSplits + s], x, r);
      }
    }
    const float inv = inv_s[h];
    r.x *= inv;
    r.y *= inv;
    r.z *= inv;
    r.w *= inv;
    reinterpret_cast<float4*>(a.out + idx * kDim)[c4] = r;
  }
}

}  // namespace deepinfer::cuda::attention_wgmma
