// The merge of attention's key splits (flash-decoding: with few tokens the key list is split
// over several blocks so the SMs fill). Both attention kernels write the same split format:
// part_acc [splits, T, heads, D] unnormalised sums, part_md [splits, T, heads, 2] (running max,
// denominator); this kernel adds the sink and normalises. After the mma.sync kernel and the
// wgmma kernels launched with `pdl` (DEEPINFER_ATTENTION_KERNEL=wgmma_prefetch_pdl, ...) it is a
// programmatic dependent launch (it starts while the splits run and waits for them), and once
// its wait returns it lets the kernel after it launch: the next attention call's blocks read
// their layout while this one merges (9.69 -> 9.17 us for a B = 1 decode call on an H100, with
// attention_mma.cu's start). It writes out in f32, or out_bf16 (non-null) in bf16.
#include <cstdint>
#include <cstring>

#include "cuda/attention/attention_launch.h"
#include "cuda/attention/sm80/attention_mma_trace.cuh"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/rope/rope_quad.cuh"

namespace deepinfer::cuda {

namespace {

// out[row0 + 4 c4 ..] = r * inv, in f32 or (out_bf16 non-null) bf16; under rope (its inv_freq
// set) rounded to bf16 first where it says so and the RoPE channels rotated back at `pos`, in f32.
__device__ __forceinline__ void store_combined(float4 r, float inv, float* out,
                                               __nv_bfloat16* out_bf16, int64_t row0, int c4,
                                               const AttentionOutputRope& rope, float pos,
                                               int dim) {
  r.x *= inv;
  r.y *= inv;
  r.z *= inv;
  r.w *= inv;
  if (rope.inv_freq != nullptr) {
    if (rope.round_bf16) {
      r.x = __bfloat162float(__float2bfloat16_rn(r.x));
      r.y = __bfloat162float(__float2bfloat16_rn(r.y));
      r.z = __bfloat162float(__float2bfloat16_rn(r.z));
      r.w = __bfloat162float(__float2bfloat16_rn(r.w));
    }
    const int first = dim - 2 * rope.pairs;
    if (4 * c4 >= first) r = rope_rotate_quad(r, pos, rope.inv_freq, (4 * c4 - first) / 2, true);
    reinterpret_cast<float4*>(out + row0)[c4] = r;
    return;
  }
  if (out_bf16 != nullptr) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(r.x, r.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(r.z, r.w);
    uint2 packed;
    memcpy(&packed.x, &lo, 4);
    memcpy(&packed.y, &hi, 4);
    reinterpret_cast<uint2*>(out_bf16 + row0)[c4] = packed;
  } else {
    reinterpret_cast<float4*>(out + row0)[c4] = r;
  }
}

// Block (token, head): merges the splits' (max, denominator, unnormalised sum) with the sink.
// Every load of a column is in flight at once: each column thread issues the partial sums of up
// to kBatch splits of its first column before anything waits, so a call with at most kBatch
// splits waits out about one L2 round trip. With the statistics first and the sums eight splits
// at a time, a B = 1 decode's 20 splits waited about four: the attention call was 0.6-0.8 us
// slower on an H100 (session 42). The statistics (staged in shared memory, each loaded once) come
// from a warp of their own, whose loads are its first instructions after the wait: loaded by the
// column threads, ptxas scheduled them after the thread's own partial-sum loads, so they came back
// behind the block's 20 x 2 KB of partial sums (B = 1), and the weights waited for them. That warp
// is there where a column thread has more than 8 partial-sum loads in flight (more than 8 splits:
// B = 1, 2, s_q = 2); with fewer the column threads load the statistics after their sums, and the
// smaller block leaves room for more blocks on an SM (the larger batches' combines). The sums are
// added in split order. kPdl: a programmatic dependent launch of the split kernel (it waits for
// that grid first). kTrace: the trace instantiation (sm80/attention_mma_trace.cuh).
constexpr int kCombineColumnThreads = 128;  // a float4 column of the output each

// The block: the column threads, and the statistics' warp for batches of more than 8 splits.
constexpr int combine_threads(int batch) {
  return batch > 8 ? kCombineColumnThreads + 32 : kCombineColumnThreads;
}

template <bool kPdl, int kBatch, bool kTrace>
__global__ void __launch_bounds__(combine_threads(kBatch))
    attention_combine_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_md,
                             const float* __restrict__ sinks, float* __restrict__ out,
                             __nv_bfloat16* __restrict__ out_bf16, int num_tokens, int heads,
                             int dim, int splits, MmaTraceBuffer trace_buffer,
                             AttentionOutputRope rope) {
  __shared__ float m_s[kAttnMaxSplits];
  __shared__ float d_s[kAttnMaxSplits];
  __shared__ float w_s[kAttnMaxSplits];
  const int64_t t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x);
  constexpr bool kStatsWarp = combine_threads(kBatch) > kCombineColumnThreads;
  const bool column_thread = !kStatsWarp || tid < kCombineColumnThreads;
  const CombineTraceRecorder<kTrace> trace(trace_buffer);
  trace.start();
  const float sink = sinks[h];                 // a weight: no kernel before this one writes it
  if constexpr (kPdl) enter_dependent_grid();  // the splits
  trace.waited();
  const int64_t stride = static_cast<int64_t>(num_tokens) * heads;  // between splits
  const int64_t idx = t * heads + h;
  const int n4 = dim / 4;
  const float4* acc4 = reinterpret_cast<const float4*>(part_acc);
  float4 v[kBatch];
  const auto load_batch = [&](int c4, int s0) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (c4 < n4 && s0 + j < splits) v[j] = acc4[((s0 + j) * stride + idx) * n4 + c4];
    }
  };
  if (column_thread) load_batch(tid, 0);
  if (kStatsWarp != column_thread) {  // the statistics' warp, or else the column threads
    const int lanes = kStatsWarp ? 32 : kCombineColumnThreads;
    for (int s = kStatsWarp ? tid - kCombineColumnThreads : tid; s < splits; s += lanes) {
      const float2 md = reinterpret_cast<const float2*>(part_md)[s * stride + idx];
      m_s[s] = md.x;
      d_s[s] = md.y;
    }
  }
  // Loaded after the wait (a step's positions may come from a kernel before it), in flight with
  // the partials.
  const float pos = rope.inv_freq != nullptr ? static_cast<float>(rope.positions[t]) : 0.0f;
  __syncthreads();
  float mx = sink;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, m_s[s]);
  for (int s = tid; s < splits; s += combine_threads(kBatch)) {
    w_s[s] = m_s[s] == -INFINITY ? 0.0f : expf(m_s[s] - mx);  // an empty split weighs 0
  }
  __syncthreads();
  if (!column_thread) return;
  float den = expf(sink - mx);
  for (int s = 0; s < splits; ++s) den += d_s[s] * w_s[s];
  const float inv = 1.0f / den;
  trace.loaded();
  for (int c4 = tid; c4 < n4; c4 += kCombineColumnThreads) {
    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      if (s0 > 0) load_batch(c4, s0);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (s0 + j < splits) r = fma4(w_s[s0 + j], v[j], r);
      }
    }
    store_combined(r, inv, out, out_bf16, idx * dim, c4, rope, pos, dim);
    if (c4 + kCombineColumnThreads < n4) load_batch(c4 + kCombineColumnThreads, 0);
  }
  trace.finish();
}

// The batch for a call's split count: the smallest that holds every split (the registers grow
// with it: 80 / 96 / 164 on sm_90a); more than 32 splits loop over batches.
constexpr int combine_batch(int64_t splits) {
  return splits <= 8 ? 8 : splits <= 16 ? 16 : 32;
}

template <bool kPdl, bool kTrace = false>
auto combine_kernel_for(int64_t splits) {
  return combine_batch(splits) == 8    ? attention_combine_kernel<kPdl, 8, kTrace>
         : combine_batch(splits) == 16 ? attention_combine_kernel<kPdl, 16, kTrace>
                                       : attention_combine_kernel<kPdl, 32, kTrace>;
}

}  // namespace

void launch_attention_combine(cudaStream_t stream, const float* part_acc, const float* part_md,
                              const float* sinks, float* out, __nv_bfloat16* out_bf16,
                              int64_t tokens, int64_t heads, int64_t dim, int64_t splits, bool pdl,
                              const MmaTraceBuffer& trace, const AttentionOutputRope& rope) {
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads));
  // The trace instantiations are the programmatic launch's (the small-batch route's).
  const auto kernel = pdl && trace.stamps != nullptr ? combine_kernel_for<true, true>(splits)
                      : pdl                          ? combine_kernel_for<true>(splits)
                                                     : combine_kernel_for<false>(splits);
  const dim3 block(static_cast<unsigned>(combine_threads(combine_batch(splits))));
  launch_programmatic("attention's combine", grid, block, 0, stream, pdl, kernel, part_acc, part_md,
                      sinks, out, out_bf16, static_cast<int>(tokens), static_cast<int>(heads),
                      static_cast<int>(dim), static_cast<int>(splits), trace, rope);
}

}  // namespace deepinfer::cuda
