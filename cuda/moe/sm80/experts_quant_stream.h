// The decode-shape GEMMs of the quantized experts that stream the weights through a ring of
// shared-memory slices (experts_quant_stream.cu), called by experts_quant.cu's pass.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

// The split K of one pass's two streaming GEMMs (experts_quant_config.h's
// choose_quant_stream_splits on at most live_tiles tiles and `sms` SMs) and the scratch the split
// GEMMs need: f32 partial sums and int arrival counters that are zero when the pass's first GEMM
// starts (the split GEMMs leave them zero for the next). p.gate_up_splits, p.down_splits,
// p.split_partials and p.split_arrivals take these; p.max_tiles sizes the scratch.
struct QuantStreamSplits {
  int gate_up;
  int down;
  int64_t partial_floats;  // 0 when neither GEMM splits
  int64_t arrivals;
};
QuantStreamSplits plan_quant_stream_splits(const QuantExpertsArgs& p, int64_t live_tiles, int sms);

// gate/up + SwiGLU -> out = act [pairs, I] (gate_up) or down -> out = y [pairs, H] over the 16-row
// tiles of p.tiles, from activations `a` staged in `planes` bf16 planes (1 or 3) as
// stage_activations_kernel writes them; K split as p.gate_up_splits / p.down_splits say.
void launch_expert_quant_stream(const QuantExpertsArgs& p, bool gate_up, int planes,
                                const __nv_bfloat16* a, float* out, cudaStream_t stream);

}  // namespace deepinfer::cuda
