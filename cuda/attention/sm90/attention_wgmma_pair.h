// The paired variant of the prefetching Hopper attention kernel (sm90/attention_wgmma_pair.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_plan.h"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

// launch_attention_wgmma's p.pair path, after its checks: a multiple of 128 heads (p.head_groups
// even), bf16 rows or V4's fp8 record (wgmma_prefetch_takes); the two blocks of a token's 128
// heads are one cluster sharing the key tiles, swizzled; no programmatic dependent launch.
void launch_attention_wgmma_pair(const AttentionArgs& a, const DeviceLayout& l,
                                 const AttentionMmaPlan& p, int64_t tokens,
                                 KernelSmemLimits& smem_limits, cudaStream_t stream);

}  // namespace deepinfer::cuda
