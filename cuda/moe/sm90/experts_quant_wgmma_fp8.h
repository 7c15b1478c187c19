// The launch of the Hopper prefill shape of the quantized expert GEMMs on FP8 tensor cores
// (experts_quant_wgmma_fp8.cu, sm_90a only: the host calls it only where DEEPINFER_HAVE_SM90A,
// the device is sm_90 and moe_heuristics.h's quant_wgmma_fp8_fits holds).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/smem_limits.h"
#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

// One pass of launch_experts_quant (moe_launch.h) in the prefill shape on wgmma e4m3 x e4m3: the
// tile list has ExpertQuantWgmmaFp8::kTok-row tiles, p.in_group and p.down_group are > 0. x is
// quantized into xq [tokens, H] f32, act in place; xs and as take the staged rows (e4m3 [rows,
// Kp] then f32 scales [rows, Kp / 128], Kp = K rounded up to 128) and need at least
// quant_staged_elems(rows, K, 1) * 2 bytes each, as launch_experts_quant's.
void launch_experts_quant_wgmma_fp8(const QuantExpertsArgs& p, const float* x, int64_t tokens,
                                    float* xq, void* xs, float* act, void* as, float* y,
                                    KernelSmemLimits& smem_limits, cudaStream_t stream);

}  // namespace deepinfer::cuda
