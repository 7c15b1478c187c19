// The RoPE rotation of 4 consecutive channels (two whole pairs), shared by rope_quads_kernel and
// the kernels that rotate their output as they store it (the attention combine's inverse RoPE).
// As the CPU reference op (cpp/src/backend/cpu_ops_dense.cpp): the angle float(pos) * inv_freq[i]
// and its cos and sin by cosf / sinf (not the __cosf intrinsics), products rounded separately
// (__fmul_rn / __fsub_rn: the CPU build has no FMA contraction), so the bytes match.
#pragma once

#include <cuda_runtime.h>

namespace deepinfer::cuda {

// v = channels first + 2 i .. first + 2 i + 3 of a row at position `pos`: pairs i and i + 1.
__device__ __forceinline__ float4 rope_rotate_quad(float4 v, float pos, const float* inv_freq,
                                                   int i, bool inverse) {
  float4 o;
  const float angle0 = pos * inv_freq[i];
  const float co0 = cosf(angle0);
  const float si0 = inverse ? -sinf(angle0) : sinf(angle0);
  o.x = __fsub_rn(__fmul_rn(v.x, co0), __fmul_rn(v.y, si0));
  o.y = __fadd_rn(__fmul_rn(v.y, co0), __fmul_rn(v.x, si0));
  const float angle1 = pos * inv_freq[i + 1];
  const float co1 = cosf(angle1);
  const float si1 = inverse ? -sinf(angle1) : sinf(angle1);
  o.z = __fsub_rn(__fmul_rn(v.z, co1), __fmul_rn(v.w, si1));
  o.w = __fadd_rn(__fmul_rn(v.w, co1), __fmul_rn(v.z, si1));
  return o;
}

}  // namespace deepinfer::cuda
