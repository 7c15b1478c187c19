#include "model/deepseek_v41.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/graph_blocks.h"

namespace deepinfer {

namespace {

// A compressed layer's entries: its kv source's (share-KV readers own none).
const Tensor& entries_of(ModelCaches& caches, int layer, const V41TextConfig& config) {
  return caches.layer(config.kv_source.at(static_cast<size_t>(layer))).comp_entries;
}

}  // namespace

bool pack_engram_ngrams(RowSpan rows, const V41TextConfig& config, int64_t num_token_rows,
                        std::vector<int32_t>& ngram, std::vector<int32_t>& remap) {
  const int64_t n = config.engram_max_ngram_size;
  int64_t total = 0;
  for (const ForwardRow& r : rows) total += r.num_tokens;
  if (num_token_rows < total) {
    throw Error(ErrorCode::kInvalidArgument, "Engram n-grams: " + std::to_string(num_token_rows) +
                                                 " token rows asked for " + std::to_string(total) +
                                                 " tokens of the batch");
  }
  // Every cell not written below is -1: before the sequence start, or not carried. A padding
  // row's column 0 is its token 0.
  ngram.assign(static_cast<size_t>(num_token_rows * n), -1);
  remap.assign(static_cast<size_t>(num_token_rows * n), -1);
  for (int64_t row = total; row < num_token_rows; ++row) ngram[static_cast<size_t>(row * n)] = 0;
  bool carries = false;
  size_t cell = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    const ForwardRow& r = rows[b];
    if (r.token_from_previous >= 0 && r.carried_tokens > 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "forward batch: sequence " + std::to_string(b) + ": carries " +
                      std::to_string(r.carried_tokens) +
                      " tokens from the previous step; the Engram n-grams take one");
    }
    const int64_t needed = std::min<int64_t>(r.start_pos, n - 1);
    if (static_cast<int64_t>(r.history.size()) < needed) {
      throw Error(ErrorCode::kInvalidArgument,
                  "forward batch: sequence " + std::to_string(b) + ": 'history' has " +
                      std::to_string(r.history.size()) +
                      " tokens, the Engram n-grams at start_pos " + std::to_string(r.start_pos) +
                      " need the last " + std::to_string(needed));
    }
    const int64_t hist = static_cast<int64_t>(r.history.size());
    for (int64_t i = 0; i < r.num_tokens; ++i) {
      for (int64_t back = 0; back < n; ++back, ++cell) {
        const int64_t chunk_index = i - back;
        if (r.start_pos + chunk_index < 0) continue;
        if (chunk_index >= 0) {
          ngram[cell] = r.tokens[static_cast<size_t>(chunk_index)];
          if (chunk_index == 0 && r.token_from_previous >= 0) {
            remap[cell] = r.token_from_previous;
            carries = true;
          }
        } else {
          ngram[cell] = r.history[static_cast<size_t>(hist + chunk_index)];
        }
      }
    }
  }
  return carries;
}

Tensor engram_ngrams(Backend& backend, RowSpan rows, const V41TextConfig& config,
                     const Tensor& previous) {
  if (config.engram_layer_ids.empty()) return Tensor();
  const int64_t n = config.engram_max_ngram_size;
  int64_t total = 0;
  for (const ForwardRow& r : rows) total += r.num_tokens;
  std::vector<int32_t> host, remap;
  const bool carries = pack_engram_ngrams(rows, config, total, host, remap);
  Tensor ngram = backend.upload(Tensor::from_vector(host, {total, n}), DType::kI32);
  if (carries) {
    backend.select_tokens(ngram.reshape({total * n}),
                          backend.upload(Tensor::from_vector(remap, {total * n}), DType::kI32),
                          previous);
  }
  return ngram;
}

DeepseekV41Model::DeepseekV41Model(const V41TextConfig& config, V41Weights weights,
                                   Backend& backend)
    : config_(config), weights_(std::move(weights)), backend_(backend) {
  hc_params_.hc_mult = config.hc_mult;
  hc_params_.sinkhorn_iters = config.hc_sinkhorn_iters;
  hc_params_.hc_eps = static_cast<float>(config.hc_eps);
  // C.4: the HC norm (unweighted; fn has the weight folded in) uses rms_norm_eps.
  hc_params_.norm_eps = static_cast<float>(config.rms_norm_eps);
  eps_ = static_cast<float>(config.rms_norm_eps);
}

Tensor DeepseekV41Model::forward(const BatchPlan& plan, const Tensor& ngram, ModelCaches& caches,
                                 const YocoRows& yoco) {
  Backend& be = backend_;
  // The rows the layers run on: every row, until YOCO compact truncation drops some.
  const BatchLayout* layout = &plan.layout;
  BatchLayout kept_layout;
  // Every layer's window bound: a replayed hit's (undefined: none), then in the consumer layers
  // YOCO's narrowed windows, which include it (yoco_row_ranges).
  Tensor swa_start = plan.swa_start;
  if (!config_.engram_layer_ids.empty() && !ngram.defined()) {
    throw Error(ErrorCode::kInvalidArgument,
                "DeepSeek-V4.1 forward: the model has Engram layers but no 'ngram' was given");
  }

  Tensor trunk = be.hc_expand(be.embedding(weights_.embed, plan.layout.token_ids), config_.hc_mult);
  // Shifted mHC (C.4): each sub-layer collapses its input with the previous sub-layer's pre; the
  // first one (undefined pre) takes stream 0.
  Tensor pre;
  SharedSelection shared;
  // DSpark (C.8): the stream mean of the trunk entering each target layer's attention mix.
  const bool dspark = !weights_.dspark.blocks.empty();
  std::vector<Tensor> features;
  for (int layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const V41LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
    // Engram rewrites the trunk after the previous post, before this layer's attention mix (C.7).
    if (w.has_engram) trunk = engram(w.engram, trunk, ngram);
    if (dspark && std::ranges::find(config_.dspark_target_layer_ids, layer) !=
                      config_.dspark_target_layer_ids.end()) {
      const int64_t rows = layout->num_tokens;
      reserve_dspark_rows(rows);
      features.push_back(be.hc_collapse(trunk, dspark_rows_.mean.narrow(0, 0, rows)));
    }

    HcShiftedMix mix =
        be.hc_pre_shifted(trunk, w.hc_attn.fn, w.hc_attn.base, w.hc_attn.scale, pre, hc_params_);
    Tensor x = be.rms_norm(mix.y, w.attn_norm, eps_);
    // Kv sources compress every row of the call, the YOCO boundary's included (C.6).
    if (w.attn.has_compressor) compress(layer, x, plan, caches);
    if (config_.is_yoco_consumer(layer) && yoco.narrows) swa_start = yoco.swa_start;
    if (layer == config_.yoco_boundary && yoco.drops) {
      if (yoco.layout.num_tokens == 0) break;  // no row reaches the consumer layers
      // Compact truncation: from here on only the kept rows, with what later layers read of
      // the earlier ones (the trunk, this sub-layer's mix, the shared top-k and candidates).
      const Tensor& kept = yoco.kept_rows;
      kept_layout = yoco.layout;
      kept_layout.token_ids = be.gather_rows(plan.layout.token_ids, kept);
      layout = &kept_layout;
      trunk = be.gather_rows(trunk, kept);
      x = be.gather_rows(x, kept);
      mix.post = be.gather_rows(mix.post, kept);
      mix.comb = be.gather_rows(mix.comb, kept);
      mix.pre = be.gather_rows(mix.pre, kept);
      for (auto& [source, topk] : shared.topk) topk = be.gather_rows(topk, kept);
      for (Tensor& f : features) f = be.gather_rows(f, kept);
      if (shared.candidates.defined()) shared.candidates = be.gather_rows(shared.candidates, kept);
    }
    const Tensor attn_out = attention(layer, x, *layout, swa_start, caches, shared);
    trunk = be.hc_post(trunk, attn_out, mix.post, mix.comb);
    pre = mix.pre;

    mix = be.hc_pre_shifted(trunk, w.hc_ffn.fn, w.hc_ffn.base, w.hc_ffn.scale, pre, hc_params_);
    const Tensor ffn_out = moe(w.ffn, be.rms_norm(mix.y, w.ffn_norm, eps_), layout->token_ids,
                               config_.num_experts_per_tok);
    trunk = be.hc_post(trunk, ffn_out, mix.post, mix.comb);
    pre = mix.pre;
  }
  // Only rows that reached every target layer have main keys (none when no row reached the
  // consumer layers: the loop stopped early).
  if (dspark && features.size() == config_.dspark_target_layer_ids.size() &&
      layout->num_tokens > 0) {
    dspark_main_keys(features, *layout, caches);
  }

  const int num_logit_rows = yoco.drops ? yoco.num_logit_rows : plan.num_logit_rows;
  if (num_logit_rows == 0) return Tensor();
  const Tensor& logit_rows = yoco.drops ? yoco.logit_rows : plan.logit_rows;
  if (logit_rows.defined()) {
    trunk = be.gather_rows(trunk, logit_rows);
    pre = be.gather_rows(pre, logit_rows);
  }
  // No HyperHead: the final collapse uses the last FFN sub-layer's pre (C.4).
  const Tensor hidden = be.hc_collapse(trunk, pre);
  return be.linear(be.rms_norm(hidden, weights_.norm, eps_), weights_.head);
}

Tensor DeepseekV41Model::engram(const EngramWeights& w, const Tensor& trunk, const Tensor& ngram) {
  Backend& be = backend_;
  const int64_t t = trunk.shape()[0];
  const Tensor rows = be.engram_hash(ngram, weights_.engram_token_map, w.hash);  // [T, (n-1)*heads]
  const int64_t per_token = rows.shape()[1];
  const Tensor flat = rows.reshape({t * per_token});
  const Tensor looked_up = w.embed_scales.defined()
                               ? be.embedding_fp8(w.embed, w.embed_scales, flat)
                               : be.embedding(w.embed, flat);
  const Tensor kv = be.linear(looked_up.reshape({t, per_token * w.embed.shape()[1]}), w.wkv);
  return be.engram_gate(trunk, kv, w.q_weight, w.k_weight, eps_);
}

Tensor DeepseekV41Model::attention(int layer, const Tensor& x, const BatchLayout& layout,
                                   const Tensor& swa_start, ModelCaches& caches,
                                   SharedSelection& shared) {
  Backend& be = backend_;
  const V41AttentionWeights& w = weights_.layers[static_cast<size_t>(layer)].attn;
  const Tensor& inv_freq = weights_.layers[static_cast<size_t>(layer)].inv_freq;
  const int64_t t = layout.num_tokens;
  const int64_t nh = config_.num_attention_heads;
  const int64_t d = config_.head_dim;
  const int ratio = config_.ratio(layer);

  // q-LoRA queries without a per-head norm (C.3.1); one shared K=V vector per token. wq_a and
  // wkv read x: a pair (one pass over x on a backend that fuses them). Where no indexer reads
  // q_norm(qa) too, wq_b norms it itself (RowNorm: no launch of its own on a backend that norms
  // as it quantizes).
  const auto [qa_lora, kv_proj] = be.linear_pair(x, w.wq_a, w.wkv);
  const Tensor qa = ratio > 0 ? be.rms_norm(qa_lora, w.q_norm, eps_) : Tensor();
  const Tensor q_proj =
      ratio > 0 ? be.linear(qa, w.wq_b) : be.linear(qa_lora, w.wq_b, RowNorm{w.q_norm, eps_});
  const Tensor q = be.rope(q_proj.reshape({t, nh, d}), layout.positions, inv_freq,
                           /*inverse=*/false);
  LayerCaches& own = caches.layer(layer);
  // This call's keys in the SWA ring's format, quantized where they are made: attention reads them
  // and ring_write stores them as they are.
  const Tensor kv = be.rms_norm_rope_kv(kv_proj, w.kv_norm, eps_, layout.positions, inv_freq,
                                        own.swa_ring.dtype(), own.rope_dim);

  Tensor topk;
  if (ratio > 0) topk = select_entries(layer, qa, x, layout, caches, shared);

  AttentionSpec spec;
  spec.window = config_.sliding_window;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(d));
  spec.ratio = ratio;
  spec.sparse = ratio > 0;  // every compressed layer has an index source (validated)
  spec.rope_dim = own.rope_dim;
  spec.swa_start = swa_start;
  spec.output_rope_inv_freq = inv_freq;
  const Tensor out =
      be.attention(q, kv, own.swa_ring, ratio > 0 ? entries_of(caches, layer, config_) : Tensor(),
                   topk, w.sinks, layout, spec);
  // The ring is written after attention read the keys this chunk's queries need from it.
  be.ring_write(own.swa_ring, kv, layout, own.rope_dim);
  return attention_output(be, out, w.wo_a, w.wo_b, config_.o_groups);
}

void DeepseekV41Model::compress(int layer, const Tensor& x, const BatchPlan& plan,
                                ModelCaches& caches) {
  Backend& be = backend_;
  const V41AttentionWeights& w = weights_.layers[static_cast<size_t>(layer)].attn;
  const Tensor& inv_freq = weights_.layers[static_cast<size_t>(layer)].inv_freq;
  LayerCaches& own = caches.layer(layer);
  const int ratio = config_.ratio(layer);
  const EntryBatch& entries = plan.entries.at(ratio);
  Tensor pooled;
  if (ratio == 1) {
    // C1: one entry per token, in token row order (the plan lists a call's windows that way);
    // a replayed hit's rows before its end store none (plan.entry_rows lists the rest).
    if (entries.num_entries > 0) {
      pooled = be.linear(plan.entry_rows.defined() ? be.gather_rows(x, plan.entry_rows) : x,
                         w.compressor.wkv_gate);
    }
  } else {
    // C2: a per-channel softmax of wgate over the window's 2 tokens weighs their wkv (no ape).
    const Tensor proj = be.linear(x, w.compressor.wkv_gate);  // [T, 2D] = [kv | gate]
    if (entries.num_entries > 0) {
      CompressSpec spec;
      spec.ratio = ratio;
      spec.overlap = false;
      spec.head_dim = config_.head_dim;
      pooled = be.compress_pool(proj, own.comp_ring, w.compressor.ape, plan.layout, entries, spec);
    }
    be.ring_write(own.comp_ring, proj, plan.layout);
  }
  if (entries.num_entries == 0) return;
  // `pre` (normed, pre-RoPE) also feeds the index keys (C.3.3, C.3.4).
  const Tensor pre = be.rms_norm(pooled, w.compressor.norm, eps_);
  be.scatter_rows(own.comp_entries, be.rope(pre, entries.rope_pos, inv_freq, /*inverse=*/false),
                  entries.dest, own.rope_dim);
  if (w.indexer.owns_k) {
    const Tensor k = be.rms_norm_rope(be.linear(pre, w.indexer.wk), w.indexer.k_norm, eps_,
                                      entries.rope_pos, inv_freq);
    be.scatter_rows(own.index_entries, k, entries.dest, /*rope_dim=*/0);
  }
}

Tensor DeepseekV41Model::select_entries(int layer, const Tensor& qa, const Tensor& x,
                                        const BatchLayout& layout, ModelCaches& caches,
                                        SharedSelection& shared) {
  Backend& be = backend_;
  if (!config_.is_index_source(layer)) {  // share-index: the nearest index source's top-k
    return shared.topk.at(config_.index_source.at(static_cast<size_t>(layer)));
  }
  const V41IndexerWeights& w = weights_.layers[static_cast<size_t>(layer)].attn.indexer;
  const Tensor& inv_freq = weights_.layers[static_cast<size_t>(layer)].inv_freq;
  const int64_t t = layout.num_tokens;
  const int64_t hi = config_.index_n_heads;
  const int64_t di = config_.index_head_dim;
  const int ratio = config_.ratio(layer);
  const Tensor qi = be.rope(be.linear(qa, w.wq_b).reshape({t, hi, di}), layout.positions, inv_freq,
                            /*inverse=*/false);
  const Tensor weights = be.linear(x, MatrixWeight(w.weights_proj));
  const Tensor& keys =
      caches.layer(config_.index_k_source.at(static_cast<size_t>(layer))).index_entries;
  // No 1/sqrt(Di), 1/sqrt(hi) factors (C.3.4): they cannot change the selection.
  constexpr float kScoreScale = 1.0f;
  constexpr float kWeightScale = 1.0f;
  if (config_.is_candidate_source(layer)) {
    shared.candidates =
        be.indexer_candidates(qi, weights, keys, layout, ratio, config_.candidate_block_size,
                              config_.candidate_topk_blocks, kScoreScale, kWeightScale);
  }
  Tensor topk;
  if (config_.uses_candidates(layer)) {
    topk = be.indexer_topk_in_candidates(qi, weights, keys, layout, ratio, shared.candidates,
                                         config_.candidate_block_size, config_.index_topk,
                                         kScoreScale, kWeightScale);
  } else {  // the candidate source itself scans every visible entry
    topk = be.indexer_topk(qi, weights, keys, layout, ratio, config_.index_topk, kScoreScale,
                           kWeightScale);
  }
  shared.topk[layer] = topk;
  return topk;
}

void DeepseekV41Model::dspark_main_keys(const std::vector<Tensor>& features,
                                        const BatchLayout& layout, ModelCaches& caches) {
  Backend& be = backend_;
  const DSparkWeights& d = weights_.dspark;
  const int64_t t = layout.num_tokens;
  const int64_t h = config_.hidden_size;
  const auto targets = static_cast<int64_t>(features.size());
  // [T, targets * H]: the features side by side, stored as rows t * targets + j of a
  // [T * targets, H] buffer (the Backend has no concatenation).
  Tensor feat = be.zeros({t * targets, h}, DType::kF32);
  reserve_dspark_rows(t);
  for (int64_t j = 0; j < targets; ++j) {
    be.scatter_rows(feat, features[static_cast<size_t>(j)],
                    dspark_rows_.feature_rows[static_cast<size_t>(j)].narrow(0, 0, t));
  }
  const Tensor mh =
      be.rms_norm(be.linear(feat.reshape({t, targets * h}), d.main_proj), d.main_norm, eps_);
  for (size_t k = 0; k < d.blocks.size(); ++k) {
    const V41LayerWeights& w = d.blocks[k];
    LayerCaches& own = caches.layer(config_.num_hidden_layers + static_cast<int>(k));
    const Tensor key = be.rms_norm_rope(be.linear(mh, w.attn.wkv), w.attn.kv_norm, eps_,
                                        layout.positions, w.inv_freq);
    be.ring_write(own.swa_ring, key, layout, own.rope_dim);
  }
}

void DeepseekV41Model::reserve_dspark_rows(int64_t rows) {
  if (rows <= dspark_rows_.rows) return;
  // Decode graphs recorded earlier read the current tables: they stay alive (retired), and the
  // size at least doubles so the retired ones total less than the live one.
  if (dspark_rows_.rows > 0) {
    dspark_rows_.retired.push_back(dspark_rows_.mean);
    for (const Tensor& t : dspark_rows_.feature_rows) dspark_rows_.retired.push_back(t);
  }
  rows = std::max(rows, 2 * dspark_rows_.rows);
  const int64_t n = config_.hc_mult;
  const auto targets = static_cast<int64_t>(config_.dspark_target_layer_ids.size());
  const std::vector<float> mean(static_cast<size_t>(rows * n), 1.0f / static_cast<float>(n));
  dspark_rows_.mean = backend_.upload(Tensor::from_vector(mean, {rows, n}), DType::kF32);
  dspark_rows_.feature_rows.clear();
  for (int64_t j = 0; j < targets; ++j) {
    std::vector<int32_t> dest(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      dest[static_cast<size_t>(r)] = static_cast<int32_t>(r * targets + j);
    dspark_rows_.feature_rows.push_back(
        backend_.upload(Tensor::from_vector(dest, {rows}), DType::kI32));
  }
  dspark_rows_.rows = rows;
}

Tensor DeepseekV41Model::moe(const MoeWeights& w, const Tensor& x, const Tensor& token_ids,
                             int top_k) {
  Backend& be = backend_;
  const float limit = static_cast<float>(config_.swiglu_limit);
  // C.5: sqrt(softplus) scores, selection by scores + bias, no hash layers.
  const Routing routing = be.moe_route(x, w.gate, w.bias, Tensor(), token_ids, top_k,
                                       static_cast<float>(config_.routed_scaling_factor));
  return be.add(be.moe_experts(x, routing, w.experts, limit), shared_expert(be, w, x, limit));
}

}  // namespace deepinfer
