// The launches of the quant family, for ops of other families that quantize their inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer::cuda {

// out [rows, cols] = x rounded per group of `group` columns to its e4m3 grid (may alias x); a
// programmatic dependent launch where `pdl`.
void launch_quantize_activations(const float* x, float* out, int64_t rows, int64_t cols, int group,
                                 bool pdl, cudaStream_t stream);

}  // namespace deepinfer::cuda
