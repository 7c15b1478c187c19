// The warp-specialised variant of the Hopper attention kernel (sm90/attention_wgmma_overlap.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_plan.h"
#include "cuda/attention/sm90/attention_wgmma_trace.h"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

// launch_attention_wgmma's p.overlap path, after its checks (wgmma_prefetch_takes: bf16 rows or
// V4's fp8 record): 384 threads per block (producer, scorer and value warpgroups), the tiles in
// wgmma's 128-byte swizzle; p.pdl: a programmatic dependent launch of the grid before it (the kv
// rows' encoding); p.cluster_merge: a token's splits one cluster that merges them into the output
// (at most kWgmmaClusterMergeMaxSplits; no combine kernel after it); p.pair (a multiple of 128
// heads, else it throws): the cluster-pair mode, clusters of (2, 1, 1), always with p.ilp, and
// with p.persistent over fp8 records with bf16 q and output of one split as many clusters as fit at
// once (KernelSmemLimits::max_active_clusters) walking the units where there are more; p.ilp: the
// wgmma_overlap_ilp variant (unmerged, no pdl, else it throws). trace.stamps: the traced
// instantiation records the first trace.ctas blocks' timing (attention_wgmma_trace.h; fp8 records,
// the plain or ilp launch, else it throws).
void launch_attention_wgmma_overlap(const AttentionArgs& a, const DeviceLayout& l,
                                    const AttentionMmaPlan& p, int64_t tokens,
                                    KernelSmemLimits& smem_limits, cudaStream_t stream,
                                    const OverlapTraceBuffer& trace = {});

}  // namespace deepinfer::cuda
