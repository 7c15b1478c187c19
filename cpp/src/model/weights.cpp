#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/error.h"
#include "model/weight_loader.h"

namespace deepinfer {

namespace {

ModelWeights build_weights(WeightLoader& w, const ModelConfig& config, bool has_head);
MtpWeights build_mtp(WeightLoader& w, const ModelConfig& config, int k);
LayerWeights build_layer(WeightLoader& w, const ModelConfig& config, const std::string& p,
                         int layer, MlpKind mlp);

bool has_prefix(const Checkpoint& checkpoint, const std::string& prefix) {
  const std::vector<std::string> names = checkpoint.names();
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return n.starts_with(prefix); });
}

}  // namespace

ModelWeights load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                Backend& backend, const WeightLoadOptions& options) {
  WeightLoader w(&checkpoint, config, backend, options);
  ModelWeights m = build_weights(w, config, checkpoint.contains("head.weight"));
  // MTP blocks mtp.0.., as many as the checkpoint ships up to num_nextn_predict_layers.
  if (options.load_mtp) {
    for (int k = 0; k < config.num_nextn_predict_layers; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      if (!has_prefix(checkpoint, p)) break;
      if (config.mtp_layer_types[static_cast<size_t>(k)] == AttentionKind::kSliding &&
          checkpoint.contains(p + "attn.compressor.wkv.weight")) {
        throw Error(ErrorCode::kInvalidConfig,
                    checkpoint.file_of(p + "attn.compressor.wkv.weight").path() + ": tensor '" + p +
                        "attn.compressor.wkv.weight' belongs to a compressed MTP attention, but "
                        "config.json makes MTP block " +
                        std::to_string(k) + " sliding (compress_ratios[" +
                        std::to_string(config.num_hidden_layers + k) + "] is 0 or missing)");
      }
      m.mtp.push_back(build_mtp(w, config, k));
    }
  }
  int64_t skipped = 0;
  for (const std::string& name : checkpoint.names()) {
    if (!name.starts_with("mtp.")) continue;
    const size_t dot = name.find('.', 4);
    const std::string index = name.substr(4, dot == std::string::npos ? dot : dot - 4);
    bool loaded = false;
    for (size_t k = 0; k < m.mtp.size(); ++k) loaded = loaded || index == std::to_string(k);
    skipped += loaded ? 0 : 1;
  }
  if (skipped > 0) {
    m.notes.push_back("skipped " + std::to_string(skipped) + " mtp.* tensors (" +
                      (options.load_mtp
                           ? "MTP blocks beyond config.json's num_nextn_predict_layers = " +
                                 std::to_string(config.num_nextn_predict_layers)
                           : std::string("the multi-token-prediction drafter was not requested")) +
                      ")");
  }
  return m;
}

ModelWeights random_model_weights(const ModelConfig& config, Backend& backend, uint64_t seed,
                                  DType stored, const WeightLoadOptions& options) {
  WeightLoader w(nullptr, config, backend, options, seed, stored);
  ModelWeights m = build_weights(w, config, true);
  if (options.load_mtp) {
    for (int k = 0; k < config.num_nextn_predict_layers; ++k)
      m.mtp.push_back(build_mtp(w, config, k));
  }
  return m;
}

ExpertWeights load_layer_experts(const Checkpoint* checkpoint, const ModelConfig& config,
                                 Backend& backend, int layer, std::span<const int32_t> experts,
                                 const WeightLoadOptions& options, uint64_t seed,
                                 DType random_stored) {
  if (layer < 0 || layer >= config.num_hidden_layers || experts.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "load_layer_experts: layer " + std::to_string(layer) +
                                                 " of " + std::to_string(config.num_hidden_layers) +
                                                 " with " + std::to_string(experts.size()) +
                                                 " experts (need a main layer and >= 1 expert)");
  }
  WeightLoadOptions o = options;
  o.expert_slots.assign(experts.begin(), experts.end());
  o.progress = {};
  WeightLoader w(checkpoint, config, backend, o, seed, random_stored);
  w.set_own_expert_copies(true);
  return w.experts("layers." + std::to_string(layer) + ".ffn.experts.");
}

namespace {

ModelWeights build_weights(WeightLoader& w, const ModelConfig& config, bool has_head) {
  const int64_t h = config.hidden_size;
  const int64_t v = config.vocab_size;

  ModelWeights m;
  m.embed = w.load_matrix("embed.weight", {v, h});
  if (has_head || !config.tie_word_embeddings) {
    m.head = w.load_matrix("head.weight", {v, h});
  } else {
    m.head = m.embed;
  }
  m.norm = w.load("norm.weight", {h});
  m.hc_head = w.hc("hc_head_", config.hc_mult);
  w.report_progress(1);
  m.main_inv_freq = w.inv_freq(config.main_rope);
  m.compress_inv_freq = w.inv_freq(config.compress_rope);

  for (int li = 0; li < config.num_hidden_layers; ++li) {
    m.layers.push_back(build_layer(w, config, "layers." + std::to_string(li) + ".", li,
                                   config.mlp_layer_types[static_cast<size_t>(li)]));
    w.report_progress(li + 2);
  }
  return m;
}

// The decoder layer `layer` (a main layer, or MTP block layer - num_hidden_layers) under `p`.
LayerWeights build_layer(WeightLoader& w, const ModelConfig& config, const std::string& p,
                         int layer, MlpKind mlp) {
  const int64_t h = config.hidden_size;
  const int64_t n = config.hc_mult;
  const int64_t d = config.head_dim;
  const int64_t q = config.q_lora_rank;
  const int64_t i_size = config.moe_intermediate_size;
  LayerWeights L;
  L.attn_norm = w.load(p + "attn_norm.weight", {h});
  L.ffn_norm = w.load(p + "ffn_norm.weight", {h});
  L.hc_attn = w.hc(p + "hc_attn_", (2 + n) * n);
  L.hc_ffn = w.hc(p + "hc_ffn_", (2 + n) * n);

  AttentionWeights& a = L.attn;
  load_attention_projections(w, config, p, a);
  const AttentionKind kind = config.attention_kind(layer);
  const int ratio = config.compress_rate(layer);
  if (kind != AttentionKind::kSliding) {
    const bool csa = kind == AttentionKind::kCompressedSparse;
    a.has_compressor = true;
    a.compressor = w.compressor(p + "attn.compressor.", d, ratio, csa);
    if (csa) {
      const int64_t hi = config.index_n_heads;
      const int64_t di = config.index_head_dim;
      a.has_indexer = true;
      a.indexer.compressor = w.compressor(p + "attn.indexer.compressor.", di, ratio, true);
      a.indexer.wq_b = w.load_linear(p + "attn.indexer.wq_b.weight", {hi * di, q}, false);
      a.indexer.weights_proj = w.load_matrix(p + "attn.indexer.weights_proj.weight", {hi, h});
    }
  }

  MoeWeights& f = L.ffn;
  f.gate = w.load_matrix(p + "ffn.gate.weight", {config.n_routed_experts, h});
  if (mlp == MlpKind::kHashMoe) {
    f.tid2eid = w.tid2eid(p + "ffn.gate.tid2eid");
  } else {
    f.bias = w.load(p + "ffn.gate.bias", {config.n_routed_experts});
  }
  f.experts = w.experts(p + "ffn.experts.");
  f.shared_w1 = w.load_linear(p + "ffn.shared_experts.w1.weight", {i_size, h}, false);
  f.shared_w3 = w.load_linear(p + "ffn.shared_experts.w3.weight", {i_size, h}, false);
  f.shared_w2 = w.load_linear(p + "ffn.shared_experts.w2.weight", {h, i_size}, false);
  return L;
}

MtpWeights build_mtp(WeightLoader& w, const ModelConfig& config, int k) {
  const int64_t h = config.hidden_size;
  const std::string p = "mtp." + std::to_string(k) + ".";
  MtpWeights t;
  t.enorm = w.load(p + "enorm.weight", {h});
  t.hnorm = w.load(p + "hnorm.weight", {h});
  t.e_proj = w.load_linear(p + "e_proj.weight", {h, h}, false);
  t.h_proj = w.load_linear(p + "h_proj.weight", {h, h}, false);
  // DeepSeek's Gate hashes only layers below n_hash_layers: an MTP block routes by score.
  t.block = build_layer(w, config, p, config.num_hidden_layers + k, MlpKind::kMoe);
  t.hc_head = w.hc(p + "hc_head_", config.hc_mult);
  t.norm = w.load(p + "norm.weight", {h});
  return t;
}

}  // namespace

}  // namespace deepinfer
