// The launches of the MoE family: problem + config + arguments. moe_route.cu and moe_experts.cu
// choose the configs (moe_heuristics.h) and call these.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe/moe_config.h"
#include "cuda/moe/moe_heuristics.h"
#include "cuda/moe/sm80/experts_quant_config.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cuda {

// ---- routing ------------------------------------------------------------------------------------

// The launches below that take `pdl` launch their kernels as programmatic dependents of the
// kernel before them on the stream where it is true (cuda/common/pdl.cuh).

// Router logits [T, E] of x [T, H] and gate_w [E, H] (f32 or bf16) by router_gemv_kernel, for
// path kGemvSmall or kGemvWide (router_logits.cu).
void launch_router_gemv(const Tensor& x, const Tensor& gate_w, RouterLogits path, float* logits,
                        bool pdl, cudaStream_t stream);

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
void launch_route_select(const RouteSelectArgs& a, bool warp, bool pdl, cudaStream_t stream);

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
  int down_group;              // activation quantization of act [pairs, I] before the down GEMM
  int64_t pairs;               // (0: none)
};

// Groups the pairs by expert and writes the tile list of tile_rows-row tiles (experts_group.cu).
void launch_group_pairs(const int32_t* ids, int64_t pairs, int experts, int tile_rows,
                        int64_t max_tiles, int32_t* sorted_pair, int32_t* tile_meta, bool pdl,
                        cudaStream_t stream);

// gate/up + SwiGLU -> act [pairs, I] and down -> y [pairs, H] on the decode GEMV kernels
// (experts_gemv.cu) or the f32 tiled kernels (experts_tiled.cu); W is float or __nv_bfloat16.
template <typename W>
void launch_experts_gemv(const ExpertsPassArgs<W>& p, float* act, float* y, bool pdl,
                         cudaStream_t stream);
template <typename W>
void launch_experts_tiled(const ExpertsPassArgs<W>& p, float* act, float* y, bool pdl,
                          cudaStream_t stream);

// The same on tensor cores (sm80/experts_mma.cu), kernel kMma64 or kMma128: x is first rounded
// into xb [tokens, H] bf16, act is bf16.
void launch_experts_mma(const ExpertsPassArgs<__nv_bfloat16>& p, ExpertsKernel kernel,
                        int64_t tokens, __nv_bfloat16* xb, __nv_bfloat16* act, float* y,
                        cudaStream_t stream);

// One matrix kind (w1, w3 or w2) of quantized experts: per-expert device pointers.
struct QuantMatrices {
  const uint8_t* const* values;  // [E] e2m1 pairs [N, K / 2] or e4m3 [N, K]
  const void* const* scales;     // [E] e8m0 [N, K / 32] or f32 [ceil(N / br), ceil(K / bc)]
  // MXFP4: [E] CUtensorMap of the values (boxes of kExpertTensorBoxRows rows x one slice's 64
  // bytes) in device memory, by which the lean kernel copies them; nullptr: per-thread cp.async.
  const void* maps = nullptr;
};

// The operands of the quantized expert GEMMs of one pass (sm80/experts_quant.cu).
struct QuantExpertsArgs {
  QuantFormat format;
  int block_rows;       // kFp8: rows per scale block
  int block_cols_log2;  // kFp8: log2 of the columns per scale block (a power of two >= 16)
  int64_t hidden;       // H
  int64_t inter;        // I
  int top_k;
  const int32_t* sorted_pair;
  TileList tiles;
  int64_t max_tiles;
  // Rows of the tile list's tiles (ExpertsPassConfig::tile_rows): 8 runs the lean MXFP4 GEMMs on
  // the narrow streaming shape (expert_stream_narrow_tiles).
  int tile_rows = 0;
  QuantMatrices w1, w3, w2;
  int in_group;    // activation quantization of x (w1's act_group; 0: none)
  int down_group;  // activation quantization of the SwiGLU output (w2's act_group)
  float limit;
  // SMs of the device: the streaming decode kernels split K over a cluster when the pass has too
  // few CTAs for them (expert_stream_splits; 0: never).
  int num_sms = 0;
};

// Elements of the staged bf16 activations of `rows` rows of K columns (activation planes: 1 when
// the rows are quantized, 3 otherwise).
int64_t quant_staged_elems(int64_t rows, int64_t k, int planes);

// gate/up + SwiGLU -> act [pairs, I] f32 and down -> y [pairs, H] f32 on quantized weights, kernel
// kQuantStream, kQuantStreamLean, kQuantDecode, kQuantPrefill or kQuantPrefillWgmma: x (quantized
// into xq [tokens, H] f32 when in_group > 0) is staged into xs, act (quantized in place when
// down_group > 0) into as; the sizes are quant_staged_elems of (tokens, H) and (pairs, I).
void launch_experts_quant(const QuantExpertsArgs& p, ExpertsKernel kernel, const float* x,
                          int64_t tokens, float* xq, __nv_bfloat16* xs, float* act,
                          __nv_bfloat16* as, float* y, bool pdl, cudaStream_t stream);

// out[t] = sum_j weight[t, j] * y[t * top_k + j] in slot order (experts_combine.cu).
void launch_experts_combine(const float* y, const int32_t* ids, const float* weights,
                            int64_t tokens, int top_k, int64_t hidden, int experts, float* out,
                            bool pdl, cudaStream_t stream);

}  // namespace deepinfer::cuda
