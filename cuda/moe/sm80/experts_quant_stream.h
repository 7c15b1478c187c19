// The decode-shape GEMMs of the quantized experts that stream the weights through a ring of
// shared-memory slices (experts_quant_stream.cu), called by experts_quant.cu's pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

// gate/up + SwiGLU -> out = act [pairs, I] (gate_up) or down -> out = y [pairs, H] over the 16-row
// tiles of p.tiles, from activations `a` staged in `planes` bf16 planes (1 or 3) as
// stage_activations_kernel writes them. `lean`: the lean variant (kQuantStreamLean; the same bits
// in fewer instructions) where K is a multiple of kQuantSliceK, the default kernel elsewhere.
// `pdl`: a programmatic dependent launch of the kernel before it (cuda/common/pdl.cuh). Tiles of
// 8 rows (p.tile_rows) run the lean MXFP4 kernel on the narrow shape.
void launch_expert_quant_stream(const QuantExpertsArgs& p, bool gate_up, int planes, bool lean,
                                const __nv_bfloat16* a, float* out, bool pdl, cudaStream_t stream);

}  // namespace deepinfer::cuda
