// The key-split variant of the Hopper attention kernel (sm90/attention_wgmma_keysplit.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_plan.h"
#include "cuda/common/layout.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

// launch_attention_wgmma's p.keysplit path, after its shape checks: bf16 rows only (else it
// throws), q in f32 or bf16, p.splits key splits (whole 128-key steps each; with more than one
// the split outputs for the combine), the output in bf16 where a.out_bf16 is set and there is one
// split (with several the combine writes it). 384 threads per block: a producer warpgroup and two
// consumer warpgroups that each score their own 64 keys of every 128
// (sm90/attention_wgmma_keysplit.cu's head comment).
void launch_attention_wgmma_keysplit(const AttentionArgs& a, const DeviceLayout& l,
                                     const AttentionMmaPlan& p, int64_t tokens,
                                     KernelSmemLimits& smem_limits, cudaStream_t stream);

// The kernel's dynamic shared memory per block (about 215 KB), for the caller's fit check.
size_t attention_wgmma_keysplit_smem_bytes();

}  // namespace deepinfer::cuda
