// The launches of the MoE family: problem + config + arguments. moe_route.cu and moe_experts.cu
// choose the configs (moe_heuristics.h) and call these.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe/moe_config.h"
#include "cuda/moe/moe_heuristics.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// ---- routing ------------------------------------------------------------------------------------

// Router logits [T, E] of x [T, H] and gate_w [E, H] (f32 or bf16) by router_gemv_kernel, for
// path kGemvSmall or kGemvWide (router_logits.cu).
void launch_router_gemv(const Tensor& x, const Tensor& gate_w, RouterLogits path, float* logits,
                        cudaStream_t stream);

// out = f32(in), n elements (router_logits.cu).
void launch_widen_bf16(const __nv_bfloat16* in, float* out, int64_t n, cudaStream_t stream);

struct RouteSelectArgs {
  const float* logits;       // [T, E]
  const float* bias;         // [E] or null
  const int32_t* tid2eid;    // [vocab, top_k] (hash routing) or null
  const int32_t* token_ids;  // [T] (hash routing) or null
  int64_t tokens;
  int experts;
  int top_k;
  int64_t vocab;
  float routed_scale;
  int32_t* ids;    // [T, top_k]
  float* weights;  // [T, top_k]
};

// The top-k selection and weights (route_select.cu); `warp`: route_select_warp_kernel.
void launch_route_select(const RouteSelectArgs& a, bool warp, cudaStream_t stream);

// ---- experts ------------------------------------------------------------------------------------

// The operands every expert GEMM of one moe_experts pass reads.
template <typename W>
struct ExpertsPassArgs {
  const float* x;  // [tokens, H] f32 activations
  int64_t hidden;  // H
  int64_t inter;   // I
  int top_k;
  const int32_t* sorted_pair;  // [pairs] pair index of each expert-sorted row
  TileList tiles;              // the tile list group_pairs writes
  int64_t max_tiles;           // host bound on its length: the grids' size
  const W* const* w1s;         // [E] gate weights [I, H]
  const W* const* w3s;         // [E] up weights [I, H]
  const W* const* w2s;         // [E] down weights [H, I]
  float limit;                 // the SwiGLU clamp
};

// Groups the pairs by expert and writes the tile list of tile_rows-row tiles (experts_group.cu).
void launch_group_pairs(const int32_t* ids, int64_t pairs, int experts, int tile_rows,
                        int64_t max_tiles, int32_t* sorted_pair, int32_t* tile_meta,
                        cudaStream_t stream);

// gate/up + SwiGLU -> act [pairs, I] and down -> y [pairs, H] on the decode GEMV kernels
// (experts_gemv.cu) or the f32 tiled kernels (experts_tiled.cu); W is float or __nv_bfloat16.
template <typename W>
void launch_experts_gemv(const ExpertsPassArgs<W>& p, float* act, float* y, cudaStream_t stream);
template <typename W>
void launch_experts_tiled(const ExpertsPassArgs<W>& p, float* act, float* y, cudaStream_t stream);

// The same on tensor cores (sm80/experts_mma.cu), kernel kMma64 or kMma128: x is first rounded
// into xb [tokens, H] bf16, act is bf16.
void launch_experts_mma(const ExpertsPassArgs<__nv_bfloat16>& p, ExpertsKernel kernel,
                        int64_t tokens, __nv_bfloat16* xb, __nv_bfloat16* act, float* y,
                        cudaStream_t stream);

// out[t] = sum_j weight[t, j] * y[t * top_k + j] in slot order (experts_combine.cu).
void launch_experts_combine(const float* y, const int32_t* ids, const float* weights,
                            int64_t tokens, int top_k, int64_t hidden, int experts, float* out,
                            cudaStream_t stream);

}  // namespace deepinfer::cuda
