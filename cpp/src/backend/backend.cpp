// The Backend front (contract in deepinfer/backend.h): every public op checks its arguments'
// metadata here, once for all backends, then calls the backend's implementation. A backend adds
// only checks of limits of its own (each says why next to it). The front of memory, transfers and
// capture is backend_transfers.cpp; that of sampling and of the carried rows between steps,
// backend_sampling.cpp; that of the cache and attention ops, backend_attention.cpp.
#include "deepinfer/backend.h"

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "backend/op_checks.h"
#include "deepinfer/error.h"

namespace deepinfer {

using checks::DTypeSet;
using checks::OpChecks;

namespace {

// The dtypes a matrix weight may have on `backend` (backend.h).
DTypeSet matrix_dtypes(const Backend& backend) {
  return {DType::kF32, backend.weight_dtype(DType::kBF16)};
}

// fn [rows, N*H], base [rows], scale [scales] of hc_pre / hc_head, for X [T, N, H].
void check_hc_weights(const OpChecks& c, const Tensor& X, const Tensor& fn, const Tensor& base,
                      const Tensor& scale, int64_t fn_rows, int64_t scales) {
  c.tensor("fn", fn, DType::kF32, {fn_rows, X.size(1) * X.size(2)});
  c.tensor("base", base, DType::kF32, {fn_rows});
  c.tensor("scale", scale, DType::kF32, {scales});
}

void check_hc_mult(const OpChecks& c, int hc_mult) {
  if (hc_mult <= 0) c.fail("hc_mult must be positive, got " + std::to_string(hc_mult));
}

// The checks of hc_pre's arguments (X [T, N, H] and the mix weights), shared with hc_post_pre.
void check_hc_pre(const OpChecks& c, const Tensor& X, const Tensor& fn, const Tensor& base,
                  const Tensor& scale, const HcParams& params) {
  check_hc_mult(c, params.hc_mult);
  c.tensor("X", X, DType::kF32, {-1, params.hc_mult, -1});
  const int64_t n = params.hc_mult;
  check_hc_weights(c, X, fn, base, scale, (2 + n) * n, 3);
  if (params.sinkhorn_iters < 1) {
    c.fail("sinkhorn_iters must be >= 1, got " + std::to_string(params.sinkhorn_iters));
  }
}

// y_norm's weight, where defined: [H] f32 for X [T, N, H].
void check_hc_output_norm(const OpChecks& c, const Tensor& X, const RowNorm& y_norm) {
  c.optional("y_norm.weight", y_norm.weight, DType::kF32, {X.size(2)});
}

// The checks of hc_post's arguments, shared with hc_post_pre.
void check_hc_post(const OpChecks& c, const Tensor& X, const Tensor& out, const Tensor& post,
                   const Tensor& comb) {
  c.tensor("X", X, DType::kF32, {-1, -1, -1});
  const int64_t tokens = X.size(0);
  const int64_t n = X.size(1);
  c.tensor("out", out, DType::kF32, {tokens, X.size(2)});
  c.tensor("post", post, DType::kF32, {tokens, n});
  c.tensor("comb", comb, DType::kF32, {tokens, n, n});
}

}  // namespace

// ---- dense ops ----------------------------------------------------------------------------------

Tensor Backend::embedding(const Tensor& table, const Tensor& ids) {
  const OpChecks c("embedding", device_kind());
  c.tensor("table", table, matrix_dtypes(*this), {-1, -1});
  c.tensor("ids", ids, DType::kI32, {-1});
  return embedding_impl(table, ids);
}

Tensor Backend::rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  const OpChecks c("rms_norm", device_kind());
  c.rank("x", x, DType::kF32, 1, 8);
  c.optional("weight", weight, DType::kF32, {x.size(-1)});
  return rms_norm_impl(x, weight, eps);
}

Tensor Backend::linear(const Tensor& x, const MatrixWeight& w, const RowNorm& x_norm) {
  const OpChecks c("linear", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  c.weight("w", w, matrix_dtypes(*this), -1, x.size(1));
  c.optional("x_norm.weight", x_norm.weight, DType::kF32, {x.size(1)});
  return linear_impl(x, w, x_norm);
}

Tensor Backend::grouped_linear(const Tensor& x, const MatrixWeight& w, int groups) {
  const OpChecks c("grouped_linear", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  c.weight("w", w, matrix_dtypes(*this), -1, -1);
  if (groups <= 0 || x.size(1) % groups != 0 || w.rows() % groups != 0 ||
      x.size(1) / groups != w.cols()) {
    c.fail("x " + x.describe() + " and w " + w.describe() + " do not split into " +
           std::to_string(groups) + " groups (expected x [M, G*K] and w [G*N, K])");
  }
  return grouped_linear_impl(x, w, groups);
}

std::pair<Tensor, Tensor> Backend::linear_pair(const Tensor& x, const MatrixWeight& a,
                                               const MatrixWeight& b, const RowNorm& x_norm) {
  const OpChecks c("linear_pair", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  c.weight("a", a, matrix_dtypes(*this), -1, x.size(1));
  c.weight("b", b, matrix_dtypes(*this), -1, x.size(1));
  c.optional("x_norm.weight", x_norm.weight, DType::kF32, {x.size(1)});
  return linear_pair_impl(x, a, b, x_norm);
}

std::pair<Tensor, Tensor> Backend::linear_pair_impl(const Tensor& x, const MatrixWeight& a,
                                                    const MatrixWeight& b, const RowNorm& x_norm) {
  if (x_norm.weight.defined()) {
    const Tensor normed = rms_norm_impl(x, x_norm.weight, x_norm.eps);
    return {linear_impl(normed, a, {}), linear_impl(normed, b, {})};
  }
  return {linear_impl(x, a, {}), linear_impl(x, b, {})};
}

Tensor Backend::quantize_activations(const Tensor& x, int group) {
  const OpChecks c("quantize_activations", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  if (group <= 0) c.fail("group must be positive, got " + std::to_string(group));
  return quantize_activations_impl(x, group);
}

Tensor Backend::scale(const Tensor& x, float factor) {
  OpChecks("scale", device_kind()).rank("x", x, DType::kF32, 0, 8);
  return scale_impl(x, factor);
}

Tensor Backend::add(const Tensor& a, const Tensor& b) {
  const OpChecks c("add", device_kind());
  c.dense("a", a, {DType::kF32, DType::kI32});
  if (a.dim() > 8) c.fail("a: rank " + std::to_string(a.dim()) + " is above 8");
  c.tensor("b", b, a.dtype(), a.shape());
  return add_impl(a, b);
}

Tensor Backend::gather_rows(const Tensor& x, const Tensor& rows) {
  const OpChecks c("gather_rows", device_kind());
  c.dense("x", x, DTypeSet::any(), 1);
  c.tensor("rows", rows, DType::kI32, {-1});
  return gather_rows_impl(x, rows);
}

Tensor Backend::rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                     bool inverse) {
  const OpChecks c("rope", device_kind());
  // bf16 x: the attention output a backend may return under AttentionSpec::bf16_output.
  c.rank("x", x, {DType::kF32, DType::kBF16}, 2, 3);
  c.tensor("positions", positions, DType::kI32, {x.size(0)});
  c.tensor("inv_freq", inv_freq, DType::kF32, {-1});
  if (2 * inv_freq.size(0) > x.size(-1)) {
    c.fail("inv_freq " + inv_freq.describe() + " rotates " + std::to_string(2 * inv_freq.size(0)) +
           " channels, more than x's last dimension " + std::to_string(x.size(-1)));
  }
  return rope_impl(x, positions, inv_freq, inverse);
}

Tensor Backend::rms_norm_rope(const Tensor& x, const Tensor& weight, float eps,
                              const Tensor& positions, const Tensor& inv_freq, bool bf16_output) {
  const OpChecks c("rms_norm_rope", device_kind());
  c.rank("x", x, DType::kF32, 2, 3);
  c.optional("weight", weight, DType::kF32, {x.size(-1)});
  c.tensor("positions", positions, DType::kI32, {x.size(0)});
  c.tensor("inv_freq", inv_freq, DType::kF32, {-1});
  if (2 * inv_freq.size(0) > x.size(-1)) {
    c.fail("inv_freq " + inv_freq.describe() + " rotates " + std::to_string(2 * inv_freq.size(0)) +
           " channels, more than x's last dimension " + std::to_string(x.size(-1)));
  }
  return rms_norm_rope_impl(x, weight, eps, positions, inv_freq, bf16_output);
}

Tensor Backend::rms_norm_rope_kv(const Tensor& x, const Tensor& weight, float eps,
                                 const Tensor& positions, const Tensor& inv_freq, DType kv_dtype,
                                 int rope_dim) {
  const OpChecks c("rms_norm_rope_kv", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  c.optional("weight", weight, DType::kF32, {x.size(1)});
  c.tensor("positions", positions, DType::kI32, {x.size(0)});
  c.tensor("inv_freq", inv_freq, DType::kF32, {-1});
  if (2 * inv_freq.size(0) > x.size(1)) {
    c.fail("inv_freq " + inv_freq.describe() + " rotates " + std::to_string(2 * inv_freq.size(0)) +
           " channels, more than x's last dimension " + std::to_string(x.size(1)));
  }
  c.kv_dtype("kv_dtype", kv_dtype, x.size(1), rope_dim, supports_kv_cache_dtype(kv_dtype));
  return rms_norm_rope_kv_impl(x, weight, eps, positions, inv_freq, kv_dtype, rope_dim);
}

Tensor Backend::rms_norm_rope_impl(const Tensor& x, const Tensor& weight, float eps,
                                   const Tensor& positions, const Tensor& inv_freq,
                                   bool /*bf16_output*/) {
  return rope_impl(rms_norm_impl(x, weight, eps), positions, inv_freq, /*inverse=*/false);
}

void Backend::copy_rows(const Tensor& t, const Tensor& src, const Tensor& dst) {
  const OpChecks c("copy_rows", device_kind());
  c.dense("t", t, DTypeSet::any(), 1);
  c.tensor("src", src, DType::kI32, {-1});
  c.tensor("dst", dst, DType::kI32, {src.size(0)});
  copy_rows_impl(t, src, dst);
}

void Backend::fill_random_normal(const Tensor& t, uint64_t seed, float mean, float std) {
  OpChecks("fill_random_normal", device_kind()).dense("t", t, {DType::kF32, DType::kBF16});
  fill_random_normal_impl(t, seed, mean, std);
}

// ---- hyper-connections --------------------------------------------------------------------------

Tensor Backend::hc_expand(const Tensor& x, int hc_mult) {
  const OpChecks c("hc_expand", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  check_hc_mult(c, hc_mult);
  return hc_expand_impl(x, hc_mult);
}

HcMix Backend::hc_pre(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HcParams& params, const RowNorm& y_norm) {
  const OpChecks c("hc_pre", device_kind());
  check_hc_pre(c, X, fn, base, scale, params);
  check_hc_output_norm(c, X, y_norm);
  return hc_pre_impl(X, fn, base, scale, params, y_norm);
}

Tensor Backend::hc_post(const Tensor& X, const Tensor& out, const Tensor& post,
                        const Tensor& comb) {
  const OpChecks c("hc_post", device_kind());
  check_hc_post(c, X, out, post, comb);
  return hc_post_impl(X, out, post, comb);
}

HcPostPre Backend::hc_post_pre(const Tensor& X, const Tensor& out, const Tensor& post,
                               const Tensor& comb, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, const HcParams& params, const RowNorm& y_norm) {
  const OpChecks c("hc_post_pre", device_kind());
  check_hc_post(c, X, out, post, comb);
  check_hc_pre(c, X, fn, base, scale, params);  // the new trunk has X's shape
  check_hc_output_norm(c, X, y_norm);
  return hc_post_pre_impl(X, out, post, comb, fn, base, scale, params, y_norm);
}

HcPostPre Backend::hc_post_pre_impl(const Tensor& X, const Tensor& out, const Tensor& post,
                                    const Tensor& comb, const Tensor& fn, const Tensor& base,
                                    const Tensor& scale, const HcParams& params,
                                    const RowNorm& y_norm) {
  Tensor trunk = hc_post_impl(X, out, post, comb);
  return {trunk, hc_pre_impl(trunk, fn, base, scale, params, y_norm)};
}

Tensor Backend::hc_head(const Tensor& X, const Tensor& fn, const Tensor& base, const Tensor& scale,
                        const HcParams& params, const RowNorm& y_norm) {
  const OpChecks c("hc_head", device_kind());
  check_hc_mult(c, params.hc_mult);
  c.tensor("X", X, DType::kF32, {-1, params.hc_mult, -1});
  check_hc_weights(c, X, fn, base, scale, params.hc_mult, 1);
  check_hc_output_norm(c, X, y_norm);
  return hc_head_impl(X, fn, base, scale, params, y_norm);
}

HcShiftedMix Backend::hc_pre_shifted(const Tensor& X, const Tensor& fn, const Tensor& base,
                                     const Tensor& scale, const Tensor& prev_pre,
                                     const HcParams& params) {
  const OpChecks c("hc_pre_shifted", device_kind());
  check_hc_mult(c, params.hc_mult);
  c.tensor("X", X, DType::kF32, {-1, params.hc_mult, -1});
  const int64_t n = params.hc_mult;
  check_hc_weights(c, X, fn, base, scale, (2 + n) * n, 3);
  c.optional("prev_pre", prev_pre, DType::kF32, {X.size(0), n});
  if (params.sinkhorn_iters < 1) {
    c.fail("sinkhorn_iters must be >= 1, got " + std::to_string(params.sinkhorn_iters));
  }
  return hc_pre_shifted_impl(X, fn, base, scale, prev_pre, params);
}

Tensor Backend::hc_collapse(const Tensor& X, const Tensor& pre) {
  const OpChecks c("hc_collapse", device_kind());
  c.tensor("X", X, DType::kF32, {-1, -1, -1});
  c.tensor("pre", pre, DType::kF32, {X.size(0), X.size(1)});
  return hc_collapse_impl(X, pre);
}

// ---- Engram ------------------------------------------------------------------------------------

Tensor Backend::engram_hash(const Tensor& ngram, const Tensor& token_map,
                            const EngramHashParams& params) {
  const OpChecks c("engram_hash", device_kind());
  const auto n = static_cast<int64_t>(params.multipliers.size());
  if (n < 2) c.fail("params.multipliers must hold n >= 2 multipliers, got " + std::to_string(n));
  if (params.heads < 1) c.fail("params.heads must be >= 1, got " + std::to_string(params.heads));
  const int64_t tables = (n - 1) * params.heads;
  if (static_cast<int64_t>(params.primes.size()) != tables) {
    c.fail("params.primes must hold (n - 1) * heads = " + std::to_string(tables) + " primes, got " +
           std::to_string(params.primes.size()));
  }
  for (const int64_t m : params.multipliers) {
    if (m <= 0) c.fail("params.multipliers must be positive, got " + std::to_string(m));
  }
  // The rows are i32 (they feed `embedding`), so the whole table must be indexable by one.
  int64_t rows = 0;
  for (const int64_t p : params.primes) {
    if (p < 1) c.fail("params.primes must be positive, got " + std::to_string(p));
    rows += p;
    if (rows > std::numeric_limits<int32_t>::max()) {
      c.fail("params.primes sum past the i32 row range (" + std::to_string(rows) + " rows)");
    }
  }
  if (params.pad_id < 0) c.fail("params.pad_id must be >= 0, got " + std::to_string(params.pad_id));
  c.tensor("ngram", ngram, DType::kI32, {-1, n});
  c.tensor("token_map", token_map, DType::kI32, {-1});
  return engram_hash_impl(ngram, token_map, params);
}

Tensor Backend::embedding_fp8(const Tensor& values, const Tensor& scales, const Tensor& ids) {
  const OpChecks c("embedding_fp8", device_kind());
  c.tensor("values", values, DType::kF8E4M3, {-1, -1});
  const int64_t groups = (values.size(1) + 31) / 32;
  c.tensor("scales", scales, DType::kE8M0, {values.size(0), groups});
  c.tensor("ids", ids, DType::kI32, {-1});
  return embedding_fp8_impl(values, scales, ids);
}

Tensor Backend::engram_gate(const Tensor& X, const Tensor& kv, const Tensor& q_weight,
                            const Tensor& k_weight, float eps) {
  const OpChecks c("engram_gate", device_kind());
  c.tensor("X", X, DType::kF32, {-1, -1, -1});
  const int64_t n = X.size(1);
  const int64_t hidden = X.size(2);
  c.tensor("kv", kv, DType::kF32, {X.size(0), (n + 1) * hidden});
  c.tensor("q_weight", q_weight, DType::kF32, {n, hidden});
  c.tensor("k_weight", k_weight, DType::kF32, {n, hidden});
  return engram_gate_impl(X, kv, q_weight, k_weight, eps);
}

// ---- mixture of experts -------------------------------------------------------------------------

Routing Backend::moe_route(const Tensor& x, const Tensor& gate_w, const Tensor& bias,
                           const Tensor& tid2eid, const Tensor& token_ids, int top_k,
                           float routed_scale) {
  const OpChecks c("moe_route", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  c.tensor("gate_w", gate_w, matrix_dtypes(*this), {-1, x.size(1)});
  const int64_t experts = gate_w.size(0);
  if (top_k < 1 || top_k > experts) {
    c.fail("top_k " + std::to_string(top_k) + " must be in [1, " + std::to_string(experts) +
           "] (experts of gate_w " + gate_w.describe() + ")");
  }
  if (tid2eid.defined()) {
    c.tensor("tid2eid", tid2eid, DType::kI32, {-1, top_k});
    // Every token id must index a row of it.
    if (tid2eid.size(0) == 0) c.fail("argument tid2eid has no rows: " + tid2eid.describe());
    c.tensor("token_ids", token_ids, DType::kI32, {x.size(0)});
  } else {
    c.optional("bias", bias, DType::kF32, {experts});
  }
  return moe_route_impl(x, gate_w, bias, tid2eid, token_ids, top_k, routed_scale);
}

Tensor Backend::moe_experts(const Tensor& x, const Routing& routing, const ExpertWeights& experts,
                            float swiglu_limit) {
  const OpChecks c("moe_experts", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  c.tensor("routing.expert_ids", routing.expert_ids, DType::kI32, {tokens, -1});
  c.tensor("routing.weights", routing.weights, DType::kF32, {tokens, routing.expert_ids.size(1)});
  const size_t num = experts.w1.size();
  if (num == 0 || experts.w3.size() != num || experts.w2.size() != num) {
    c.fail("experts must hold the same non-zero number of w1, w3 and w2 tensors, got " +
           std::to_string(experts.w1.size()) + ", " + std::to_string(experts.w3.size()) + ", " +
           std::to_string(experts.w2.size()));
  }
  c.weight("experts.w1[0]", experts.w1[0], matrix_dtypes(*this), -1, hidden);
  const MatrixWeight& first = experts.w1[0];
  const int64_t inter = first.rows();
  for (size_t e = 0; e < num; ++e) {
    for (const auto& [name, w, rows, cols] :
         {std::tuple{"experts.w1", &experts.w1[e], inter, hidden},
          std::tuple{"experts.w3", &experts.w3[e], inter, hidden},
          std::tuple{"experts.w2", &experts.w2[e], hidden, inter}}) {
      const bool same_format = w->format == first.format && w->block_rows == first.block_rows &&
                               w->block_cols == first.block_cols && w->act_group == first.act_group;
      // Named only when it fails: 3 x 256 matrices per call, every eager MoE layer.
      if (same_format && c.weight_ok(*w, first.values.dtype(), rows, cols)) continue;
      const std::string arg = name + ("[" + std::to_string(e) + "]");
      c.weight(arg, *w, first.values.dtype(), rows, cols);
      if (!same_format) {
        c.fail("argument " + arg + " is " + w->describe() + " but experts.w1[0] is " +
               first.describe() + " (one format for all experts)");
      }
    }
  }
  return moe_experts_impl(x, routing, experts, swiglu_limit);
}

Tensor Backend::swiglu(const Tensor& gate, const Tensor& up, float swiglu_limit) {
  const OpChecks c("swiglu", device_kind());
  c.rank("gate", gate, DType::kF32, 0, 8);
  c.tensor("up", up, DType::kF32, gate.shape());
  return swiglu_impl(gate, up, swiglu_limit);
}

// ---- V4.1 ops a backend does not implement yet --------------------------------------------------

void Backend::unsupported(const char* op) const {
  throw Error(ErrorCode::kUnsupported,
              std::string(op) + ": not implemented on the " + name() + " backend yet (V4.1 op)");
}

HcShiftedMix Backend::hc_pre_shifted_impl(const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, const HcParams&) {
  unsupported("hc_pre_shifted");
}

Tensor Backend::hc_collapse_impl(const Tensor&, const Tensor&) {
  unsupported("hc_collapse");
}

Tensor Backend::engram_hash_impl(const Tensor&, const Tensor&, const EngramHashParams&) {
  unsupported("engram_hash");
}

Tensor Backend::embedding_fp8_impl(const Tensor&, const Tensor&, const Tensor&) {
  unsupported("embedding_fp8");
}

Tensor Backend::engram_gate_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 float) {
  unsupported("engram_gate");
}

IndexerQFp8 Backend::quantize_indexer_q_impl(const Tensor&, const Tensor&) {
  unsupported("quantize_indexer_q");
}

Tensor Backend::indexer_candidates_impl(const Tensor&, const Tensor&, const Tensor&,
                                        const BatchLayout&, int, int, int, float, float) {
  unsupported("indexer_candidates");
}

Tensor Backend::indexer_topk_in_candidates_impl(const Tensor&, const Tensor&, const Tensor&,
                                                const BatchLayout&, int, const Tensor&, int, int,
                                                float, float) {
  unsupported("indexer_topk_in_candidates");
}

}  // namespace deepinfer
