// The merge of attention's key splits (flash-decoding: with few tokens the key list is split
// over several blocks so the SMs fill). Both attention kernels write the same split format:
// part_acc [splits, T, heads, D] unnormalised sums, part_md [splits, T, heads, 2] (running max,
// denominator); this kernel adds the sink and normalises. After the mma.sync kernel and the
// wgmma kernels launched with `pdl` (DEEPINFER_ATTENTION_KERNEL=wgmma_prefetch_pdl, ...) it is a
// programmatic dependent launch (it starts while the splits run and waits for them). It writes
// out in f32, or out_bf16 (non-null) in bf16.
#include <cstdint>
#include <cstring>

#include "cuda/attention/attention_launch.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/vec.cuh"

namespace deepinfer::cuda {

namespace {

// Block (token, head): merges the splits' (max, denominator, unnormalised sum) with the sink.
// The splits' statistics are staged in shared memory so each is loaded once, and the sums are
// loaded a few splits at a time.
// kPdl: a programmatic dependent launch of the split kernel (it waits for that grid first).
template <bool kPdl>
__global__ void attention_combine_kernel(const float* __restrict__ part_acc,
                                         const float* __restrict__ part_md,
                                         const float* __restrict__ sinks, float* __restrict__ out,
                                         __nv_bfloat16* __restrict__ out_bf16, int num_tokens,
                                         int heads, int dim, int splits) {
  __shared__ float m_s[kAttnMaxSplits];
  __shared__ float d_s[kAttnMaxSplits];
  __shared__ float w_s[kAttnMaxSplits];
  if constexpr (kPdl) wait_for_previous_grid();  // the splits
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t stride = static_cast<int64_t>(num_tokens) * heads;  // between splits
  const int64_t idx = t * heads + h;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    m_s[s] = part_md[2 * (s * stride + idx)];
    d_s[s] = part_md[2 * (s * stride + idx) + 1];
  }
  __syncthreads();
  const float sink = sinks[h];
  float mx = sink;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m_s[s]);
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    w_s[s] = m_s[s] == -INFINITY ? 0.0f : expf(m_s[s] - mx);  // an empty split weighs 0
  }
  __syncthreads();
  float den = expf(sink - mx);
  for (int s = 0; s < splits; ++s) den += d_s[s] * w_s[s];
  const float inv = 1.0f / den;
  for (int c4 = threadIdx.x; c4 < dim / 4; c4 += blockDim.x) {
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      const float4 v = reinterpret_cast<const float4*>(part_acc + (s * stride + idx) * dim)[c4];
      r = fma4(w_s[s], v, r);
    }
    r.x *= inv;
    r.y *= inv;
    r.z *= inv;
    r.w *= inv;
    if (out_bf16 != nullptr) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(r.x, r.y);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(r.z, r.w);
      uint2 packed;
      memcpy(&packed.x, &lo, 4);
      memcpy(&packed.y, &hi, 4);
      reinterpret_cast<uint2*>(out_bf16 + idx * dim)[c4] = packed;
    } else {
      reinterpret_cast<float4*>(out + idx * dim)[c4] = r;
    }
  }
}

}  // namespace

void launch_attention_combine(cudaStream_t stream, const float* part_acc, const float* part_md,
                              const float* sinks, float* out, __nv_bfloat16* out_bf16,
                              int64_t tokens, int64_t heads, int64_t dim, int64_t splits,
                              bool pdl) {
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads));
  if (!pdl) {
    attention_combine_kernel<false><<<grid, 128, 0, stream>>>(
        part_acc, part_md, sinks, out, out_bf16, static_cast<int>(tokens), static_cast<int>(heads),
        static_cast<int>(dim), static_cast<int>(splits));
    DEEPINFER_CUDA_LAUNCH_CHECK("attention");
    return;
  }
  launch_programmatic("attention's combine", grid, dim3(128), 0, stream, /*pdl=*/true,
                      attention_combine_kernel<true>, part_acc, part_md, sinks, out, out_bf16,
                      static_cast<int>(tokens), static_cast<int>(heads), static_cast<int>(dim),
                      static_cast<int>(splits));
}

}  // namespace deepinfer::cuda
