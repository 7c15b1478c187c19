// The launch of the Hopper prefill shape of the quantized expert GEMMs (experts_quant_wgmma.cu,
// sm_90a only: the host calls it only where DEEPINFER_HAVE_SM90A and the device is sm_90).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

// One pass of launch_experts_quant (moe_launch.h) in the prefill shape on wgmma: the tile list
// has ExpertQuantWgmma::kTok-row tiles; xs and as have launch_experts_quant's sizes (the staged
// order inside a 128-input slice is this kernel's own).
void launch_experts_quant_wgmma(const QuantExpertsArgs& p, const float* x, int64_t tokens,
                                float* xq, __nv_bfloat16* xs, float* act, __nv_bfloat16* as,
                                float* y, cudaStream_t stream);

}  // namespace deepinfer::cuda
