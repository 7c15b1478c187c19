// The launches of the attention family: problem + config + arguments. attention.cu chooses the
// configs (attention_heuristics.h) and calls these.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_heuristics.h"
#include "cuda/attention/sm90/attention_wgmma_trace.h"
#include "cuda/common/layout.cuh"
#include "cuda/common/smem_limits.h"

namespace deepinfer::cuda {

// The f32 kernel (attention_f32.cu), grid (token, head group, split). With one split it writes
// a.out, otherwise a.part_acc / a.part_md.
void launch_attention_f32(const AttentionArgs& a, const DeviceLayout& l,
                          const AttentionF32Config& c, int64_t tokens, cudaStream_t stream);

// The tensor-core kernel (sm80/attention_mma.cu) for c.supported; outputs as the f32 kernel's.
// `pdl`: a programmatic dependent launch of the kernel before it (cuda/common/pdl.cuh).
void launch_attention_mma(const AttentionArgs& a, const DeviceLayout& l,
                          const AttentionMmaConfig& c, int64_t tokens, bool pdl,
                          cudaStream_t stream);

// The Hopper kernel (sm90/attention_wgmma.cu, sm_90a builds only) for wgmma_attention_shape over
// bf16 rows or fp8 records, 64 heads per block and p.splits key splits; outputs as the f32
// kernel's (the splits merged by launch_attention_combine). p.prefetch: its prefetching variant
// (wgmma_prefetch_takes); p.pdl: that as a programmatic dependent launch of the grid before it;
// p.overlap: the warp-specialised variant (the same records; p.ilp its wgmma_overlap_ilp form).
// trace.stamps: the overlap kernel's timing trace (launch_attention_wgmma_overlap's condition).
void launch_attention_wgmma(const AttentionArgs& a, const DeviceLayout& l,
                            const AttentionMmaPlan& p, int64_t tokens,
                            KernelSmemLimits& smem_limits, cudaStream_t stream,
                            const OverlapTraceBuffer& trace = {});

// The inverse RoPE a combine applies as it stores the output (AttentionSpec::output_rope_inv_freq):
// the last 2 * pairs channels of each head rotated back at positions[token]. round_bf16: the
// merged values are rounded to bf16 first (the output bf16_output would have returned), then
// rotated and stored in f32. No inv_freq: none. Needs (dim - 2 * pairs) % 4 == 0 (whole quads).
struct AttentionOutputRope {
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int pairs = 0;
  bool round_bf16 = false;
};

// Merges `splits` > 1 split outputs with the sinks into out, or into out_bf16 in bf16 when it is
// non-null (attention_combine.cu). `pdl`: a programmatic dependent launch of the split kernel
// (which lets it start early; it waits for that grid before it reads the splits). `trace`: the
// combine blocks' records of a traced mma.sync call (a programmatic launch; attention_mma_trace.h).
// `rope`: the inverse RoPE of the output (its inv_freq set: out f32, out_bf16 null).
void launch_attention_combine(cudaStream_t stream, const float* part_acc, const float* part_md,
                              const float* sinks, float* out, __nv_bfloat16* out_bf16,
                              int64_t tokens, int64_t heads, int64_t dim, int64_t splits,
                              bool pdl = false, const MmaTraceBuffer& trace = {},
                              const AttentionOutputRope& rope = {});

}  // namespace deepinfer::cuda
