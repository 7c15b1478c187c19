// moe_experts of the CUDA backend (docs/model.md#mixture-of-experts), matching the CPU reference
// op (cpp/src/backend/cpu_ops_moe.cpp) on the same inputs. All on the device and in stream order
// (no host sync, no host-side routing), in passes of at most kMaxPassTokens tokens:
//  1. experts_group.cu (one CTA): the (token, slot) pairs are counted per expert, the counts
//     exclusive-scanned into row offsets, the pairs scattered into expert order, and the list of
//     row tiles (expert, first sorted row, rows) the GEMMs run over is written with its length.
//  2. gate/up GEMM + SwiGLU over the tile list -> act [pairs, I], rows in expert order.
//  3. down GEMM over the tile list -> y [pairs, H], rows in (token, slot) order.
//  4. experts_combine.cu: out[t] = sum_j weight[t, j] * y[t, j], summed in slot order j.
// The GEMM grids are sized from a host bound on the tile count (ceil(P / rows) + min(E, P));
// CTAs past the count the device wrote exit at once. Each output element depends only on its own
// row and weight column, reduced over K in a fixed order whatever else shares its tile, and step
// 4 sums in slot order: the result is deterministic even though the scatter of step 1 (shared
// atomics) puts the pairs of one expert in run-dependent order.
//
// The GEMM shapes, chosen per pass by moe_heuristics.h (each with its own tile size in the tile
// list): decode (experts_gemv.cu), prefill with bf16 weights on tensor cores
// (sm80/experts_mma.cu, 64- or 128-row tiles), prefill otherwise (experts_tiled.cu).
//
// Robustness where the CPU op throws (a device op cannot): a routing.expert_ids entry outside
// [0, E) is dropped (that slot contributes nothing to its token).
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"
#include "cuda/moe/moe_heuristics.h"
#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

namespace {

// One pass of moe_experts over `tokens` rows (<= kMaxPassTokens).
template <typename W>
void run_experts_pass(CudaBackend& be, const float* x, const int32_t* ids, const float* weights,
                      int64_t tokens, int top_k, int64_t hidden, int64_t inter, int experts,
                      const W* const* w1s, const W* const* w3s, const W* const* w2s, bool vec,
                      float limit, float* out) {
  cudaStream_t stream = be.stream();
  const int64_t pairs = tokens * top_k;
  const ExpertsPassConfig c =
      choose_experts_pass({pairs, experts, hidden, inter, std::is_same_v<W, __nv_bfloat16>, vec},
                          be.max_shared_memory_per_block());
  const bool mma = c.kernel == ExpertsKernel::kMma64 || c.kernel == ExpertsKernel::kMma128;

  Tensor sorted = be.empty({pairs}, DType::kI32);
  Tensor tile_meta = be.empty({3 * c.max_tiles + 1}, DType::kI32);
  Tensor act = be.empty({pairs, inter}, mma ? DType::kBF16 : DType::kF32);
  Tensor y = be.empty({pairs, hidden}, DType::kF32);
  int32_t* meta = tile_meta.data<int32_t>();
  ExpertsPassArgs<W> p{};
  p.x = x;
  p.hidden = hidden;
  p.inter = inter;
  p.top_k = top_k;
  p.sorted_pair = sorted.data<int32_t>();
  p.tiles = {meta, meta + c.max_tiles, meta + 2 * c.max_tiles, meta + 3 * c.max_tiles};
  p.max_tiles = c.max_tiles;
  p.w1s = w1s;
  p.w3s = w3s;
  p.w2s = w2s;
  p.limit = limit;

  launch_group_pairs(ids, pairs, experts, c.tile_rows, c.max_tiles, sorted.data<int32_t>(), meta,
                     stream);
  if (c.kernel == ExpertsKernel::kGemv) {
    launch_experts_gemv<W>(p, act.data<float>(), y.data<float>(), stream);
  } else if (c.kernel == ExpertsKernel::kTiled) {
    launch_experts_tiled<W>(p, act.data<float>(), y.data<float>(), stream);
  } else if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    Tensor xb = be.empty({tokens, hidden}, DType::kBF16);
    launch_experts_mma(p, c.kernel, tokens, static_cast<__nv_bfloat16*>(xb.raw_data()),
                       static_cast<__nv_bfloat16*>(act.raw_data()), y.data<float>(), stream);
  }
  launch_experts_combine(y.data<float>(), ids, weights, tokens, top_k, hidden, experts, out,
                         stream);
}

}  // namespace

Tensor CudaBackend::moe_experts_impl(const Tensor& x, const Routing& routing,
                                     const ExpertWeights& experts, float swiglu_limit) {
  const char* op = "moe_experts";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t k = routing.expert_ids.size(1);
  const size_t num = experts.w1.size();
  if (num > static_cast<size_t>(kMaxExperts)) {  // group_pairs keeps two ints per expert in smem
    fail(op, "at most " + std::to_string(kMaxExperts) + " experts, got " + std::to_string(num));
  }
  if (experts.w1[0].format == WeightFormat::kFp8Block) {
    // upload_matrix_weight keeps FP8 weights as e4m3 bytes, which the expert kernels do not read.
    fail(op, "fp8_block expert weights are not supported by the CUDA expert kernels yet");
  }
  const DType wdtype = experts.w1[0].values.dtype();
  const int64_t inter = experts.w1[0].rows();
  const int num_experts = static_cast<int>(num);

  // Per-expert pointer table [w1 | w3 | w2]: uploaded on first use, then cached by the backend.
  std::vector<int64_t> ptrs(3 * num);
  bool vec = aligned16(x.raw_data()) && hidden % 8 == 0 && inter % 8 == 0;
  for (size_t e = 0; e < num; ++e) {
    const Tensor* mats[3] = {&experts.w1[e].values, &experts.w3[e].values, &experts.w2[e].values};
    for (int m = 0; m < 3; ++m) {
      const void* p = mats[m]->raw_data();
      vec = vec && aligned16(p);
      ptrs[static_cast<size_t>(m) * num + e] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p));
    }
  }
  Tensor out = empty({tokens, hidden}, DType::kF32);
  if (tokens == 0 || hidden == 0) return out;
  if (k == 0 || inter == 0) {
    DEEPINFER_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), stream()));
    return out;
  }
  const Tensor& dev_table = pointer_table(ptrs);
  const void* const* base = static_cast<const void* const*>(dev_table.raw_data());
  for (int64_t t0 = 0; t0 < tokens; t0 += kMaxPassTokens) {
    const int64_t n = std::min(kMaxPassTokens, tokens - t0);
    const float* xp = x.data<float>() + t0 * hidden;
    const int32_t* ids = routing.expert_ids.data<int32_t>() + t0 * k;
    const float* wts = routing.weights.data<float>() + t0 * k;
    float* dst = out.data<float>() + t0 * hidden;
    if (wdtype == DType::kBF16) {
      using W = __nv_bfloat16;
      const W* const* tab = reinterpret_cast<const W* const*>(base);
      run_experts_pass<W>(*this, xp, ids, wts, n, static_cast<int>(k), hidden, inter, num_experts,
                          tab, tab + num, tab + 2 * num, vec, swiglu_limit, dst);
    } else {
      const float* const* tab = reinterpret_cast<const float* const*>(base);
      run_experts_pass<float>(*this, xp, ids, wts, n, static_cast<int>(k), hidden, inter,
                              num_experts, tab, tab + num, tab + 2 * num, vec, swiglu_limit, dst);
    }
  }
  return out;
}

}  // namespace deepinfer::cuda
