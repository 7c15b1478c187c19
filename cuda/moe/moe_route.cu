// moe_route of the CUDA backend (docs/model.md#mixture-of-experts): router logits x . gate_w^T in
// f32 (router_logits.cu: a GEMV for decode, the f32 linear for prefill), scores
// sqrt(softplus(logit)), then per token the top-k of scores + bias or the hash table row
// (route_select.cu). It matches the CPU reference op (cpp/src/backend/cpu_ops_moe.cpp) on the
// same inputs: the CPU's ids and, up to the logits' summation order, its weights.
#include <cstdint>
#include <limits>
#include <string>

#include "cuda/backend/cuda_backend.h"
#include "cuda/common/launch.cuh"
#include "cuda/elementwise/widen_bf16.h"
#include "cuda/moe/moe_heuristics.h"
#include "cuda/moe/moe_launch.h"

namespace deepinfer::cuda {

Routing CudaBackend::moe_route_impl(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                                    const Tensor& tid2eid, const Tensor& token_ids, int top_k,
                                    float routed_scale) {
  const char* op = "moe_route";
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t experts = gate_w.size(0);
  if (experts > kMaxExperts) {  // its choices feed moe_experts, which takes at most this many
    fail(op, "gate_w " + gate_w.describe() + " must have 1 to " + std::to_string(kMaxExperts) +
                 " experts");
  }
  const bool hashed = tid2eid.defined();
  if (tokens > std::numeric_limits<int>::max()) {  // cuBLAS sizes are int
    fail(op, "too many tokens in one call: " + x.describe());
  }
  Routing routing{empty({tokens, top_k}, DType::kI32), empty({tokens, top_k}, DType::kF32)};
  if (tokens == 0) return routing;
  cudaStream_t s = stream();
  Tensor logits;
  const RouterLogits path = choose_router_logits(tokens, hidden);
  if (path == RouterLogits::kSgemm) {
    // Prefill: an IEEE f32 SGEMM (linear with f32 weights; no TF32), bf16 weights widened
    // exactly into a temporary first. Same values as the GEMV up to summation order.
    if (gate_w.dtype() == DType::kBF16) {
      Tensor wide = empty({experts, hidden}, DType::kF32);
      launch_widen_bf16(gate_w.data<__nv_bfloat16>(), wide.data<float>(), experts * hidden, pdl(),
                        s, "moe_route");
      logits = linear(x, wide);
    } else {
      logits = linear(x, gate_w);
    }
  } else {
    logits = empty({tokens, experts}, DType::kF32);
    launch_router_gemv(x, gate_w, path, logits.data<float>(), pdl(), s);
  }
  RouteSelectArgs a{};
  a.logits = logits.data<float>();
  a.bias = !hashed && bias.defined() ? bias.data<float>() : nullptr;
  a.tid2eid = hashed ? tid2eid.data<int32_t>() : nullptr;
  a.token_ids = hashed ? token_ids.data<int32_t>() : nullptr;
  a.tokens = tokens;
  a.experts = static_cast<int>(experts);
  a.top_k = top_k;
  a.vocab = hashed ? tid2eid.size(0) : 0;
  a.routed_scale = routed_scale;
  a.ids = routing.expert_ids.data<int32_t>();
  a.weights = routing.weights.data<float>();
  launch_route_select(a, use_route_select_warp(top_k, hashed, experts), pdl(), s);
  return routing;
}

}  // namespace deepinfer::cuda
