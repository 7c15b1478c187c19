// Mixture-of-experts ops of the CPU backend: routing and the routed experts
// (docs/model.md#mixture-of-experts).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_checks.h"
#include "backend/cpu_gemm.h"
#include "backend/cpu_math.h"

namespace deepinfer {

using cpu::fail;
using cpu::grain_for;

Routing CpuBackend::moe_route_impl(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                                   const Tensor& tid2eid, const Tensor& token_ids, int top_k,
                                   float routed_scale) {
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t experts = gate_w.size(0);
  const int64_t k = top_k;
  const bool hashed = tid2eid.defined();
  Routing routing{Tensor::zeros({tokens, k}, DType::kI32), Tensor::zeros({tokens, k}, DType::kF32)};
  Tensor ids_out = routing.expert_ids;
  Tensor weights_out = routing.weights;
  enqueue([=](ThreadPool& pool) {
    std::vector<float> scores(static_cast<size_t>(tokens * experts));
    cpu::gemm_nt(x.data<float>(), hidden, gate_w.data<float>(), hidden, scores.data(), experts,
                 tokens, experts, hidden, pool);
    for (float& s : scores) s = std::sqrt(cpu::softplus(s));
    int32_t* ids = ids_out.data<int32_t>();
    if (hashed) {
      // Hash routing: the experts are a fixed function of the token id.
      const int32_t* tok = token_ids.data<int32_t>();
      const int32_t* table = tid2eid.data<int32_t>();
      const int64_t vocab = tid2eid.size(0);
      for (int64_t t = 0; t < tokens; ++t) {
        if (tok[t] < 0 || tok[t] >= vocab) {
          fail("moe_route", "token_ids[" + std::to_string(t) + "] = " + std::to_string(tok[t]) +
                                " is outside tid2eid's rows [0, " + std::to_string(vocab) + ")");
        }
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = table[tok[t] * k + j];
          if (e < 0 || e >= experts) {
            fail("moe_route", "tid2eid[" + std::to_string(tok[t]) + "][" + std::to_string(j) +
                                  "] = " + std::to_string(e) + " is outside [0, " +
                                  std::to_string(experts) + ")");
          }
          ids[t * k + j] = e;
        }
      }
    } else {
      // Top-k of scores + bias; the bias only steers the choice. Ties go to the lower index.
      const float* b = bias.defined() ? bias.data<float>() : nullptr;
      pool.parallel_for(
          tokens,
          [&](int64_t begin, int64_t end) {
            std::vector<float> key(static_cast<size_t>(experts));
            std::vector<int32_t> order(static_cast<size_t>(experts));
            for (int64_t t = begin; t < end; ++t) {
              const float* s = scores.data() + t * experts;
              for (int64_t e = 0; e < experts; ++e) {
                key[static_cast<size_t>(e)] = b != nullptr ? s[e] + b[e] : s[e];
              }
              std::iota(order.begin(), order.end(), 0);
              std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                [&](int32_t l, int32_t r) {
                                  const float kl = key[static_cast<size_t>(l)];
                                  const float kr = key[static_cast<size_t>(r)];
                                  return kl > kr || (kl == kr && l < r);
                                });
              std::copy(order.begin(), order.begin() + k, ids + t * k);
            }
          },
          grain_for(experts * 8));
    }
    float* w = weights_out.data<float>();
    for (int64_t t = 0; t < tokens; ++t) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        sum += scores[static_cast<size_t>(t * experts + ids[t * k + j])];
      }
      for (int64_t j = 0; j < k; ++j) {
        w[t * k + j] = scores[static_cast<size_t>(t * experts + ids[t * k + j])] / (sum + 1e-20f) *
                       routed_scale;
      }
    }
  });
  return routing;
}

Tensor CpuBackend::moe_experts_impl(const Tensor& x, const Routing& routing,
                                    const ExpertWeights& experts, float swiglu_limit) {
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t k = routing.expert_ids.size(1);
  const int64_t num_experts = static_cast<int64_t>(experts.w1.size());
  const int64_t inter = experts.w1[0].rows();
  const int in_group = experts.w1[0].act_group;
  const int down_group = experts.w2[0].act_group;
  const Tensor expert_ids = routing.expert_ids;
  const Tensor weights = routing.weights;
  Tensor out = Tensor::zeros({tokens, hidden}, DType::kF32);
  enqueue([=](ThreadPool& pool) {
    const int32_t* ids = expert_ids.data<int32_t>();
    const float* wts = weights.data<float>();
    const int64_t pairs = tokens * k;
    // Group the (token, slot) pairs by expert, in (token, slot) order within an expert.
    std::vector<int64_t> start(static_cast<size_t>(num_experts + 1), 0);
    for (int64_t p = 0; p < pairs; ++p) {
      if (ids[p] < 0 || ids[p] >= num_experts) {
        fail("moe_experts", "routing.expert_ids[" + std::to_string(p / k) + "][" +
                                std::to_string(p % k) + "] = " + std::to_string(ids[p]) +
                                " is outside [0, " + std::to_string(num_experts) + ")");
      }
      ++start[static_cast<size_t>(ids[p]) + 1];
    }
    std::partial_sum(start.begin(), start.end(), start.begin());
    std::vector<int64_t> pair_of(static_cast<size_t>(pairs));
    {
      std::vector<int64_t> fill(start.begin(), start.end() - 1);
      for (int64_t p = 0; p < pairs; ++p) {
        pair_of[static_cast<size_t>(fill[static_cast<size_t>(ids[p])]++)] = p;
      }
    }
    int64_t max_rows = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      max_rows =
          std::max(max_rows, start[static_cast<size_t>(e + 1)] - start[static_cast<size_t>(e)]);
    }
    std::vector<float> xs(static_cast<size_t>(max_rows * hidden));
    std::vector<float> gate(static_cast<size_t>(max_rows * inter));
    std::vector<float> up(static_cast<size_t>(max_rows * inter));
    std::vector<float> down(static_cast<size_t>(max_rows * hidden));
    const float* xp = x.data<float>();
    float* dst = out.data<float>();
    // Experts run one after another (each GEMM is split over the pool) and add into `out` in
    // expert order, then (token, slot) order: the same order whatever the thread count.
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t first = start[static_cast<size_t>(e)];
      const int64_t rows = start[static_cast<size_t>(e + 1)] - first;
      if (rows == 0) continue;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = pair_of[static_cast<size_t>(first + r)] / k;
        std::memcpy(xs.data() + r * hidden, xp + t * hidden,
                    static_cast<size_t>(hidden) * sizeof(float));
      }
      const size_t ue = static_cast<size_t>(e);
      if (in_group > 0) quantize_activation_rows(xs.data(), xs.data(), rows, hidden, in_group);
      cpu::gemm_nt(xs.data(), hidden, experts.w1[ue].values.data<float>(), hidden, gate.data(),
                   inter, rows, inter, hidden, pool);
      cpu::gemm_nt(xs.data(), hidden, experts.w3[ue].values.data<float>(), hidden, up.data(), inter,
                   rows, inter, hidden, pool);
      for (int64_t i = 0; i < rows * inter; ++i) {
        gate[static_cast<size_t>(i)] =
            cpu::swiglu(gate[static_cast<size_t>(i)], up[static_cast<size_t>(i)], swiglu_limit);
      }
      if (down_group > 0)
        quantize_activation_rows(gate.data(), gate.data(), rows, inter, down_group);
      cpu::gemm_nt(gate.data(), inter, experts.w2[ue].values.data<float>(), inter, down.data(),
                   hidden, rows, hidden, inter, pool);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t p = pair_of[static_cast<size_t>(first + r)];
        const float w = wts[p];
        const float* yr = down.data() + r * hidden;
        float* o = dst + (p / k) * hidden;
        for (int64_t h = 0; h < hidden; ++h) o[h] += yr[h] * w;
      }
    }
  });
  return out;
}

}  // namespace deepinfer
