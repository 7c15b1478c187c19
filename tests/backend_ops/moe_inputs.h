// Host inputs the moe_experts rows share (cases_moe.cpp, cases_moe_quant.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "deepinfer/tensor.h"
#include "op_case.h"

namespace deepinfer::backend_ops {

// A routing as moe_experts takes it: ids [T, k] i32 and weights [T, k] f32.
struct HostRouting {
  Tensor ids, weights;
};

// k distinct experts per token in random order, with weights uniform in [0.1, 1.5].
inline HostRouting random_routing(int tokens, int experts, int top_k, Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(int64_t{tokens} * top_k));
  std::vector<float> w(ids.size());
  std::vector<int32_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::uniform_real_distribution<float> u(0.1f, 1.5f);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < top_k; ++j) {
      ids[static_cast<size_t>(int64_t{t} * top_k + j)] = order[static_cast<size_t>(j)];
      w[static_cast<size_t>(int64_t{t} * top_k + j)] = u(rng);
    }
  }
  return {Tensor::from_vector(ids, {tokens, top_k}), Tensor::from_vector(w, {tokens, top_k})};
}

}  // namespace deepinfer::backend_ops
