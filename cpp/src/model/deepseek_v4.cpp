#include "model/deepseek_v4.h"

#include <cmath>
#include <optional>
#include <tuple>
#include <utility>

#include "deepinfer/error.h"
#include "dist/expert_parallel.h"
#include "model/graph_blocks.h"

namespace deepinfer {

DeepseekV4Model::DeepseekV4Model(const ModelConfig& config, ModelWeights weights, Backend& backend)
    : config_(config), weights_(std::move(weights)), backend_(backend) {
  hc_params_.hc_mult = config.hc_mult;
  hc_params_.sinkhorn_iters = config.hc_sinkhorn_iters;
  hc_params_.hc_eps = static_cast<float>(config.hc_eps);
  hc_params_.norm_eps = static_cast<float>(config.rms_norm_eps);
  // Attention may round to bf16 when the model's dense weights are bf16 (as DeepSeek ships the
  // embedding, compressors and head next to FP8 / MXFP4 GEMM weights): its activations already
  // pass through bf16 GEMMs. With f32 dense weights it stays exact.
  bf16_math_ = weights_.embed.dtype() == DType::kBF16;
}

Tensor DeepseekV4Model::forward(const BatchPlan& plan, ModelCaches& caches, Tensor* hidden) {
  Backend& be = backend_;
  const BatchLayout& layout = plan.layout;

  // The residual trunk is hc_mult parallel streams, mixed in and out of every sub-layer (mHC).
  // Each trunk update (hc_post) but the last is one op with the next sub-layer's mix (hc_pre).
  Tensor trunk = be.hc_expand(be.embedding(weights_.embed, layout.token_ids), config_.hc_mult);
  std::optional<PendingHcPost> pending;
  for (int li = 0; li < config_.num_hidden_layers; ++li) {
    const LayerWeights& w = weights_.layers[static_cast<size_t>(li)];
    HcMix mix;
    if (pending) {
      HcPostPre next =
          be.hc_post_pre(pending->trunk, pending->out, pending->post, pending->comb, w.hc_attn.fn,
                         w.hc_attn.base, w.hc_attn.scale, hc_params_, attn_norm(w));
      trunk = next.trunk;
      mix = next.mix;
    } else {
      mix =
          be.hc_pre(trunk, w.hc_attn.fn, w.hc_attn.base, w.hc_attn.scale, hc_params_, attn_norm(w));
    }
    // KV tier imports on the copy stream: layer L waits only for its own blocks' copies (its
    // attention is the first reader), so the copies of later layers overlap the compute of
    // earlier ones (ModelCaches::import_layered).
    caches.wait_layer(be, li);
    pending = layer_after_mix(li, w, trunk, mix, plan, caches.layer(li));
  }
  if (pending) trunk = be.hc_post(pending->trunk, pending->out, pending->post, pending->comb);
  if (hidden != nullptr) *hidden = trunk;
  // The head runs only on the rows whose logits are wanted (none for a prefill step whose chunks
  // all stop short of their prompt's end).
  if (plan.num_logit_rows == 0) return Tensor();
  if (plan.logit_rows.defined()) trunk = be.gather_rows(trunk, plan.logit_rows);
  return head(trunk, weights_.hc_head, weights_.norm);
}

RowNorm DeepseekV4Model::attn_norm(const LayerWeights& w) const {
  return {w.attn_norm, static_cast<float>(config_.rms_norm_eps)};
}

Tensor DeepseekV4Model::decoder_layer(int layer, const LayerWeights& w, const Tensor& trunk,
                                      const BatchPlan& plan, LayerCaches& caches) {
  Backend& be = backend_;
  const HcMix mix =
      be.hc_pre(trunk, w.hc_attn.fn, w.hc_attn.base, w.hc_attn.scale, hc_params_, attn_norm(w));
  const PendingHcPost p = layer_after_mix(layer, w, trunk, mix, plan, caches);
  return be.hc_post(p.trunk, p.out, p.post, p.comb);
}

DeepseekV4Model::PendingHcPost DeepseekV4Model::layer_after_mix(int layer, const LayerWeights& w,
                                                                const Tensor& trunk,
                                                                const HcMix& mix,
                                                                const BatchPlan& plan,
                                                                LayerCaches& caches) {
  Backend& be = backend_;
  Tensor attn_out = attention(layer, w.attn, mix.y, plan, caches);
  const RowNorm ffn_norm{w.ffn_norm, static_cast<float>(config_.rms_norm_eps)};
  HcPostPre ffn = be.hc_post_pre(trunk, attn_out, mix.post, mix.comb, w.hc_ffn.fn, w.hc_ffn.base,
                                 w.hc_ffn.scale, hc_params_, ffn_norm);
  Tensor ffn_out = moe(layer, w.ffn, ffn.mix.y, plan.layout.token_ids);
  be.join_branches();  // no branch outlives its layer (the next chunk's attention reads the ring)
  return {ffn.trunk, ffn_out, ffn.mix.post, ffn.mix.comb};
}

Tensor DeepseekV4Model::head(const Tensor& trunk, const HcWeights& hc, const Tensor& norm) {
  Backend& be = backend_;
  const Tensor hidden = be.hc_head(trunk, hc.fn, hc.base, hc.scale, hc_params_,
                                   {norm, static_cast<float>(config_.rms_norm_eps)});
  return be.linear(hidden, weights_.head);
}

Tensor DeepseekV4Model::attention(int layer, const AttentionWeights& w, const Tensor& x,
                                  const BatchPlan& plan, LayerCaches& caches) {
  Backend& be = backend_;
  const BatchLayout& layout = plan.layout;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int64_t t = layout.num_tokens;
  const int64_t nh = config_.num_attention_heads;
  const int64_t d = config_.head_dim;
  const AttentionKind kind = config_.attention_kind(layer);
  const int ratio = config_.compress_rate(layer);
  // Sliding layers use the plain "main" rope; CSA/HCA layers use the "compress" rope everywhere.
  const Tensor& inv_freq =
      kind == AttentionKind::kSliding ? weights_.main_inv_freq : weights_.compress_inv_freq;

  AttentionSpec spec;
  spec.window = config_.sliding_window;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(d));
  spec.ratio = ratio;
  spec.sparse = w.has_indexer;
  spec.bf16_math = bf16_math_;
  // The same condition lets the output be rounded to bf16 (before the inverse RoPE below): a
  // backend that writes it between kernels writes half the bytes; rounded once more before wo_a's
  // activation quantization to e4m3.
  spec.bf16_output = bf16_math_;
  spec.rope_dim = caches.rope_dim;
  spec.swa_start = plan.swa_start;  // a replayed hit's window bound (undefined: none)
  // K == V carries RoPE: the output's RoPE channels are rotated back in the call (a backend fuses
  // it into its last kernel).
  spec.output_rope_inv_freq = inv_freq;

  // q-LoRA queries with a per-head unweighted norm; one shared K=V vector per token. Where the
  // backend's attention rounds q to bf16 anyway, q may come in bf16: the attention kernel reads
  // half the bytes, and the norm writes half.
  const bool q_bf16 = be.attention_rounds_query(d, caches.swa_ring.dtype(), spec);
  // The compressors (and the indexer's weights) read x alone and write their own caches: at
  // decode sizes a side branch next to the query path below, joined before the indexer and
  // attention read what they wrote.
  Tensor index_weights;
  if (w.has_compressor) {
    std::optional<SideBranch> branch;
    if (t <= kBranchMaxTokens) branch.emplace(be);
    const bool csa = kind == AttentionKind::kCompressedSparse;
    compress(w.compressor, x, plan, ratio, csa, d, caches.rope_dim, caches.comp_ring,
             caches.comp_entries);
    if (w.has_indexer) {
      compress(w.indexer.compressor, x, plan, ratio, true, config_.index_head_dim,
               /*rope_dim=*/0, caches.index_ring, caches.index_entries);
      index_weights = be.linear(x, w.indexer.weights_proj);
    }
  }
  // wq_a and wkv read x, wq_b and the indexer's wq_b read q_norm(qa): a pair each (one pass over
  // the input on a backend that fuses them), q_norm part of the second (RowNorm: the CUDA
  // backend norms qa as it quantizes it at decode sizes, no launch of its own).
  auto [qa_lora, kv_proj] = be.linear_pair(x, w.wq_a, w.wkv);
  const RowNorm q_norm{w.q_norm, eps};
  Tensor q_proj, qi_proj;
  if (w.has_indexer) {
    std::tie(q_proj, qi_proj) = be.linear_pair(qa_lora, w.wq_b, w.indexer.wq_b, q_norm);
  } else {
    q_proj = be.linear(qa_lora, w.wq_b, q_norm);
  }
  Tensor q = be.rms_norm_rope(q_proj.reshape({t, nh, d}), Tensor(), eps, layout.positions, inv_freq,
                              /*bf16_output=*/q_bf16);
  // This call's keys in the SWA ring's format, quantized where they are made: attention reads them
  // and ring_write stores them as they are.
  Tensor kv = be.rms_norm_rope_kv(kv_proj, w.kv_norm, eps, layout.positions, inv_freq,
                                  caches.swa_ring.dtype(), caches.rope_dim);

  be.join_branches();

  Tensor topk;
  if (w.has_indexer) {
    const int64_t hi = config_.index_n_heads;
    const int64_t di = config_.index_head_dim;
    Tensor qi = be.rope(qi_proj.reshape({t, hi, di}), layout.positions, weights_.compress_inv_freq,
                        /*inverse=*/false);
    // Over fp8 index keys the indexer takes q in fp8, its per-row scales in the weights, as
    // DeepSeek's engine runs it (tensor/indexer_q.h); f32 and bf16 keys keep q exact.
    if (caches.index_entries.dtype() == DType::kU8) {
      IndexerQFp8 q8 = be.quantize_indexer_q(qi, index_weights);
      qi = std::move(q8.q);
      index_weights = std::move(q8.weights);
    }
    topk = be.indexer_topk(qi, index_weights, caches.index_entries, layout, ratio,
                           config_.index_topk, 1.0f / std::sqrt(static_cast<float>(di)),
                           1.0f / std::sqrt(static_cast<float>(hi)));
  }

  Tensor out =
      be.attention(q, kv, caches.swa_ring, w.has_compressor ? caches.comp_entries : Tensor(), topk,
                   w.sinks, layout, spec);
  {
    // The ring is written after attention read the keys this chunk's queries need from it, and
    // read again only by the next call: a side branch next to the output projection (joined by
    // the layer's end).
    std::optional<SideBranch> branch;
    if (t <= kBranchMaxTokens) branch.emplace(be);
    be.ring_write(caches.swa_ring, kv, layout, caches.rope_dim);
  }

  return attention_output(be, out, w.wo_a, w.wo_b, config_.o_groups);
}

void DeepseekV4Model::compress(const CompressorWeights& w, const Tensor& x, const BatchPlan& plan,
                               int ratio, bool overlap, int64_t head_dim, int rope_dim,
                               const Tensor& ring, const Tensor& entry_cache) {
  Backend& be = backend_;
  Tensor proj = be.linear(x, w.wkv_gate);  // [T, 2C] = [kv | gate] per token
  const EntryBatch& entries = plan.entries.at(ratio);
  if (entries.num_entries > 0) {
    CompressSpec spec;
    spec.ratio = ratio;
    spec.overlap = overlap;
    spec.head_dim = static_cast<int>(head_dim);
    Tensor pooled = be.compress_pool(proj, ring, w.ape, plan.layout, entries, spec);
    // An entry is rotated at its window's first position.
    pooled = be.rms_norm_rope(pooled, w.norm, static_cast<float>(config_.rms_norm_eps),
                              entries.rope_pos, weights_.compress_inv_freq);
    be.scatter_rows(entry_cache, pooled, entries.dest, rope_dim);
  }
  be.ring_write(ring, proj, plan.layout);
}

Tensor DeepseekV4Model::moe(int layer, const MoeWeights& w, const Tensor& x,
                            const Tensor& token_ids) {
  Backend& be = backend_;
  const float limit = static_cast<float>(config_.swiglu_limit);
  Routing routing =
      be.moe_route(x, w.gate, w.bias, w.tid2eid, token_ids, config_.num_experts_per_tok,
                   static_cast<float>(config_.routed_scaling_factor));
  // The shared expert reads x alone: at decode sizes a side branch next to the routed experts (in
  // process; an expert-parallel exchange keeps one stream). Next to the routing, its GEMVs held
  // SMs that the routing's short kernels waited for: decode steps were 0.2-1.5% slower (H100).
  Tensor shared;
  {
    std::optional<SideBranch> branch;
    if (ep_ == nullptr && x.size(0) <= kBranchMaxTokens) branch.emplace(be);
    shared = shared_expert(be, w, x, limit);
  }
  Tensor routed = routed_experts(layer, w, x, routing);
  be.join_branches();
  return be.add(routed, shared);
}

Tensor DeepseekV4Model::routed_experts(int layer, const MoeWeights& w, const Tensor& x,
                                       const Routing& routing) {
  const float limit = static_cast<float>(config_.swiglu_limit);
  if (ep_ == nullptr) return backend_.moe_experts(x, routing, w.experts, limit);
  if (layer >= static_cast<int>(ep_->placements.size())) {
    throw Error(ErrorCode::kUnsupported,
                "expert parallelism: layer " + std::to_string(layer) +
                    " has no expert placement (MTP blocks do not run expert-parallel)");
  }
  // The dispatch reads the routing on the host (its counts decide the exchange), so this waits
  // for the stream even inside a launch that otherwise never does (docs/parallel.md says why
  // this is the in-process path's price).
  const bool was_forbidden = backend_.set_host_sync_forbidden(false);
  struct Restore {
    Backend& be;
    bool forbidden;
    ~Restore() { be.set_host_sync_forbidden(forbidden); }
  } restore{backend_, was_forbidden};
  const auto l = static_cast<size_t>(layer);
  if (ep_->slot_counts.size() != ep_->placements.size())
    ep_->slot_counts.resize(ep_->placements.size());
  return dist::ep_moe_experts(*ep_->comm, backend_, x, routing, ep_->placements[l], w.experts,
                              limit, &ep_->slot_counts[l]);
}

void DeepseekV4Model::take_slot_counts(std::vector<std::vector<int64_t>>& out) {
  if (ep_ == nullptr) {
    out.clear();
    return;
  }
  out.resize(ep_->placements.size());
  if (ep_->slot_counts.size() != ep_->placements.size())
    ep_->slot_counts.resize(ep_->placements.size());
  for (size_t l = 0; l < ep_->placements.size(); ++l) {
    const auto slots = static_cast<size_t>(ep_->placements[l].num_slots());
    std::vector<int64_t>& c = ep_->slot_counts[l];
    if (c.size() != slots) c.assign(slots, 0);
    // Swap rather than copy: both vectors keep their capacity, so a step allocates nothing.
    out[l].swap(c);
    c.assign(slots, 0);
  }
}

void DeepseekV4Model::install_experts(int layer, dist::ExpertPlacement placement,
                                      ExpertWeights local) {
  if (ep_ == nullptr || layer < 0 || layer >= static_cast<int>(ep_->placements.size()) ||
      layer >= static_cast<int>(weights_.layers.size())) {
    throw Error(ErrorCode::kInvalidArgument,
                "install_experts: layer " + std::to_string(layer) +
                    " is not an expert-parallel MoE layer of this model");
  }
  const auto l = static_cast<size_t>(layer);
  const auto slots = static_cast<size_t>(placement.slots_per_rank());
  if (placement.num_ranks() != ep_->placements[l].num_ranks() ||
      placement.num_logical() != ep_->placements[l].num_logical() || local.w1.size() != slots ||
      local.w3.size() != slots || local.w2.size() != slots) {
    throw Error(ErrorCode::kInvalidArgument,
                "install_experts: layer " + std::to_string(layer) + " got " +
                    std::to_string(local.w1.size()) + " local experts for a placement of " +
                    std::to_string(slots) + " slots per rank over " +
                    std::to_string(placement.num_ranks()) + " ranks (the model has " +
                    std::to_string(ep_->placements[l].num_ranks()) + ")");
  }
  ep_->placements[l] = std::move(placement);
  weights_.layers[l].ffn.experts = std::move(local);
}

void DeepseekV4Model::idle_pass() {
  if (ep_ == nullptr) return;
  Backend& be = backend_;
  const int64_t k = config_.num_experts_per_tok;
  Routing none;
  none.expert_ids = be.empty({0, k}, DType::kI32);
  none.weights = be.empty({0, k}, DType::kF32);
  const Tensor x = be.empty({0, config_.hidden_size}, DType::kF32);
  for (int li = 0; li < config_.num_hidden_layers; ++li)
    routed_experts(li, weights_.layers[static_cast<size_t>(li)].ffn, x, none);
}

}  // namespace deepinfer
