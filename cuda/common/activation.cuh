// Activations shared by the elementwise ops and the MoE experts, written as the CPU reference
// computes them (cpu::swiglu) so the results agree bit for bit.
#pragma once

#include <cuda_runtime.h>

namespace deepinfer::cuda {

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// silu(min(gate, L)) * clamp(up, -L, L): comparisons (not fminf/fmaxf) so a NaN propagates;
// silu(g) = g * sigmoid(g), the two products rounded separately.
__device__ __forceinline__ float swiglu(float gate, float up, float limit) {
  const float g = gate > limit ? limit : gate;
  const float u = up > limit ? limit : (up < -limit ? -limit : up);
  return (g * sigmoid(g)) * u;
}

}  // namespace deepinfer::cuda
