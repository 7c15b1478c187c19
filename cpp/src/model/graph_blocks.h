// Pieces of the decoder layer that the V4 and V4.1 graphs compute the same way.
#pragma once

#include <cstdint>

#include "deepinfer/backend.h"
#include "model/weights.h"

namespace deepinfer {

// Steps of at most this many tokens run independent chains as side branches
// (Backend::begin_branch): at decode sizes kernels fill few SMs, so two chains overlap; a
// prefill's kernels fill the device alone. The decode graphs' largest batch.
inline constexpr int64_t kBranchMaxTokens = 256;

// The attention output projection, the grouped wo_a and wo_b, of an output whose RoPE channels
// are rotated back at the query position already (K == V carries RoPE: the attention call does it
// under AttentionSpec::output_rope_inv_freq). out [T, nh, D] -> [T, H].
inline Tensor attention_output(Backend& be, const Tensor& out, const MatrixWeight& wo_a,
                               const MatrixWeight& wo_b, int o_groups) {
  const int64_t t = out.shape()[0];
  const int64_t width = out.shape()[1] * out.shape()[2];
  return be.linear(be.grouped_linear(out.reshape({t, width}), wo_a, o_groups), wo_b);
}

// The shared expert: w2(swiglu(w1 x, w3 x)), w1 and w3 as a pair.
inline Tensor shared_expert(Backend& be, const MoeWeights& w, const Tensor& x, float swiglu_limit) {
  const auto [gate, up] = be.linear_pair(x, w.shared_w1, w.shared_w3);
  return be.linear(be.swiglu(gate, up, swiglu_limit), w.shared_w2);
}

}  // namespace deepinfer
