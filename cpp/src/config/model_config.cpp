#include <cmath>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>
#include <string_view>

#include "common/json.h"
#include "config/field_reader.h"
#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"

namespace deepinfer {

const char* attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kSliding:
      return "sliding_attention";
    case AttentionKind::kCompressedSparse:
      return "compressed_sparse_attention";
    case AttentionKind::kHeavilyCompressed:
      return "heavily_compressed_attention";
  }
  return "?";
}

const char* mlp_kind_name(MlpKind kind) {
  switch (kind) {
    case MlpKind::kHashMoe:
      return "hash_moe";
    case MlpKind::kMoe:
      return "moe";
  }
  return "?";
}

namespace {

using config_detail::FieldReader;

AttentionKind parse_attention_kind(const FieldReader& r, std::string_view key, size_t index,
                                   const json::Value& v) {
  if (v.is_string()) {
    if (v.as_string() == "sliding_attention") return AttentionKind::kSliding;
    if (v.as_string() == "compressed_sparse_attention") return AttentionKind::kCompressedSparse;
    if (v.as_string() == "heavily_compressed_attention") return AttentionKind::kHeavilyCompressed;
  }
  r.fail(std::string(key) + "[" + std::to_string(index) + "]",
         "must be one of \"sliding_attention\", \"compressed_sparse_attention\", "
         "\"heavily_compressed_attention\", got " +
             v.dump());
}

void require(bool ok, const std::string& source, const std::string& message) {
  if (!ok) throw Error(ErrorCode::kInvalidConfig, source + ": " + message);
}

}  // namespace

namespace config_detail {

// Reads one rope sub-dict ("main" or "compress" of rope_parameters, or a flat yarn dict).
RopeConfig parse_rope(const FieldReader& r, double theta, bool allow_yarn) {
  RopeConfig rope;
  rope.theta = r.get_double("rope_theta", theta, 0.0);
  std::string type = r.get_string("rope_type", r.get_string("type", "default"));
  if (type == "default") return rope;
  if (type != "yarn") {
    r.fail(r.has("rope_type") ? "rope_type" : "type",
           "must be \"default\" or \"yarn\" for DeepSeek-V4, got \"" + type + "\"");
  }
  if (!allow_yarn) r.fail("rope_type", "must be \"default\": the main rope never uses YaRN");
  rope.yarn = true;
  rope.factor = r.get_double("factor", 1.0, 0.0);
  if (!r.has("original_max_position_embeddings")) {
    r.fail("original_max_position_embeddings", "is required for YaRN");
  }
  rope.original_max_position_embeddings =
      r.get_int("original_max_position_embeddings", 0, 1, std::numeric_limits<int64_t>::max());
  rope.beta_fast = r.get_double("beta_fast", 32.0, 0.0);
  rope.beta_slow = r.get_double("beta_slow", 1.0, 0.0);
  rope.truncate = r.get_bool("truncate", true);
  // DeepSeek-V4 applies no YaRN magnitude scaling (transformers forces attention_factor = 1).
  if (r.has("attention_factor") && r.find("attention_factor")->as_double() != 1.0) {
    throw Error(ErrorCode::kUnsupported,
                r.source() + ": field '" + r.path("attention_factor") +
                    "' = " + r.find("attention_factor")->dump() +
                    ": DeepSeek-V4 uses no YaRN magnitude scaling (attention_factor 1.0)");
  }
  for (const char* key : {"mscale", "mscale_all_dim"}) {
    if (r.has(key)) {
      throw Error(ErrorCode::kUnsupported,
                  r.source() + ": field '" + r.path(key) + "' is not used by DeepSeek-V4");
    }
  }
  return rope;
}

// quantization_config (DeepSeek's block-scaled FP8, optionally with MXFP4 experts). The expert
// dtype is a top-level field in DeepSeek's config.json; transformers moves it inside.
QuantConfig parse_quantization(const FieldReader& root) {
  QuantConfig q;
  const std::string top_expert = root.get_string("expert_dtype", "");
  if (!root.has("quantization_config")) {
    if (!top_expert.empty() && top_expert != "bf16") {
      root.fail("expert_dtype", "is \"" + top_expert +
                                    "\" but there is no quantization_config (the format of the "
                                    "other weights)");
    }
    return q;
  }
  const json::Value& object = *root.find("quantization_config");
  if (!object.is_object()) root.fail_value("quantization_config", "an object");
  const FieldReader r(object, root.source(), "quantization_config.");
  const std::string method = r.get_string("quant_method", "");
  if (method != "fp8") {
    throw Error(ErrorCode::kUnsupported,
                root.source() + ": field 'quantization_config.quant_method' is " +
                    (r.has("quant_method") ? "\"" + method + "\"" : std::string("missing")) +
                    "; supported: \"fp8\" (DeepSeek's block-scaled FP8, with expert_dtype "
                    "\"fp4\" for MXFP4 routed experts)");
  }
  q.fp8 = true;
  const std::string fmt = r.get_string("fmt", "e4m3");
  if (fmt != "e4m3") r.fail_value("fmt", "\"e4m3\"");
  const std::string scale_fmt = r.get_string("scale_fmt", "float");
  if (scale_fmt != "ue8m0" && scale_fmt != "float") {
    r.fail_value("scale_fmt", "\"ue8m0\" or \"float\"");
  }
  q.ue8m0_scales = scale_fmt == "ue8m0";
  const std::string activations = r.get_string("activation_scheme", "dynamic");
  if (activations != "dynamic") {
    throw Error(ErrorCode::kUnsupported,
                root.source() + ": field 'quantization_config.activation_scheme' is \"" +
                    activations + "\"; supported: \"dynamic\"");
  }
  if (r.has("weight_block_size")) {
    const json::Value& b = *r.find("weight_block_size");
    auto power_of_two = [](const json::Value& v) {
      return v.is_integer() && v.as_int() >= 1 && v.as_int() <= 4096 &&
             (v.as_int() & (v.as_int() - 1)) == 0;
    };
    if (!b.is_array() || b.as_array().size() != 2 || !power_of_two(b.as_array()[0]) ||
        !power_of_two(b.as_array()[1])) {
      r.fail_value("weight_block_size", "two powers of two [rows, cols] no larger than 4096");
    }
    q.weight_block_rows = static_cast<int>(b.as_array()[0].as_int());
    q.weight_block_cols = static_cast<int>(b.as_array()[1].as_int());
  }
  const std::string inner_expert = r.get_string("expert_dtype", "");
  if (!inner_expert.empty() && !top_expert.empty() && inner_expert != top_expert) {
    r.fail("expert_dtype",
           "is \"" + inner_expert + "\" but the top-level expert_dtype is \"" + top_expert + "\"");
  }
  const std::string expert = inner_expert.empty() ? top_expert : inner_expert;
  if (expert == "fp4") {
    q.experts_fp4 = true;
  } else if (!expert.empty() && expert != "fp8") {
    if (inner_expert.empty()) root.fail_value("expert_dtype", "\"fp4\" or \"fp8\"");
    r.fail_value("expert_dtype", "\"fp4\" or \"fp8\"");
  }
  return q;
}

}  // namespace config_detail

using config_detail::parse_quantization;
using config_detail::parse_rope;

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::kNotFound, path +
                                          ": cannot open the model config (does the checkpoint "
                                          "directory contain config.json?)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json::Value root = json::parse(text, source);
  if (!root.is_object()) {
    throw Error(ErrorCode::kInvalidConfig,
                source + ": the config must be a JSON object, got " + root.type_name());
  }
  FieldReader r(root, source);
  ModelConfig c;
  c.source = source;

  const std::string model_type = r.get_string("model_type", "");
  if (model_type == "deepseek_v41")
    return V41TextConfig::from_json_text(text, source).model_config();
  if (model_type != "deepseek_v4") {
    std::string got = r.has("model_type") ? "\"" + model_type + "\"" : "nothing";
    r.fail("model_type", "must be \"deepseek_v4\", got " + got);
  }
  c.quantization = parse_quantization(r);
  c.vocab_size = static_cast<int>(r.get_int("vocab_size", c.vocab_size, 1));
  c.hidden_size = static_cast<int>(r.get_int("hidden_size", c.hidden_size, 1));
  c.num_hidden_layers = static_cast<int>(r.get_int("num_hidden_layers", c.num_hidden_layers, 1));
  c.num_attention_heads =
      static_cast<int>(r.get_int("num_attention_heads", c.num_attention_heads, 1));
  c.head_dim = static_cast<int>(r.get_int("head_dim", c.head_dim, 2));
  c.q_lora_rank = static_cast<int>(r.get_int("q_lora_rank", c.q_lora_rank, 1));
  c.o_groups = static_cast<int>(r.get_int("o_groups", c.o_groups, 1));
  c.o_lora_rank = static_cast<int>(r.get_int("o_lora_rank", c.o_lora_rank, 1));
  c.sliding_window = static_cast<int>(r.get_int("sliding_window", c.sliding_window, 1));
  c.index_n_heads = static_cast<int>(r.get_int("index_n_heads", c.index_n_heads, 1));
  c.index_head_dim = static_cast<int>(r.get_int("index_head_dim", c.index_head_dim, 2));
  c.index_topk = static_cast<int>(r.get_int("index_topk", c.index_topk, 1));
  c.n_routed_experts = static_cast<int>(r.get_int("n_routed_experts", c.n_routed_experts, 1));
  c.num_experts_per_tok =
      static_cast<int>(r.get_int("num_experts_per_tok", c.num_experts_per_tok, 1));
  c.moe_intermediate_size =
      static_cast<int>(r.get_int("moe_intermediate_size", c.moe_intermediate_size, 1));
  c.routed_scaling_factor = r.get_double("routed_scaling_factor", c.routed_scaling_factor, 0.0);
  c.swiglu_limit = r.get_double("swiglu_limit", c.swiglu_limit, 0.0);
  c.hc_mult = static_cast<int>(r.get_int("hc_mult", c.hc_mult, 1));
  c.hc_sinkhorn_iters = static_cast<int>(r.get_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1));
  c.hc_eps = r.get_double("hc_eps", c.hc_eps, 0.0);
  c.rms_norm_eps = r.get_double("rms_norm_eps", c.rms_norm_eps, 0.0);
  c.max_position_embeddings = r.get_int("max_position_embeddings", c.max_position_embeddings, 1,
                                        std::numeric_limits<int64_t>::max());
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", c.tie_word_embeddings);
  c.bos_token_id = static_cast<int>(r.get_int("bos_token_id", c.bos_token_id, 0));
  if (r.has("eos_token_id")) {
    const json::Value& eos = *r.find("eos_token_id");
    c.eos_token_ids.clear();
    if (eos.is_array()) {
      for (size_t i = 0; i < eos.as_array().size(); ++i) {
        const json::Value& e = eos.as_array()[i];
        if (!e.is_integer() || e.as_int() < 0) {
          r.fail("eos_token_id[" + std::to_string(i) + "]",
                 "must be a non-negative integer, got " + e.dump());
        }
        c.eos_token_ids.push_back(static_cast<int>(e.as_int()));
      }
    } else {
      c.eos_token_ids.push_back(static_cast<int>(r.get_int("eos_token_id", 1, 0)));
    }
  }

  // Fixed architecture choices of DeepSeek-V4: anything else is a different model.
  if (r.get_int("num_key_value_heads", 1, 1) != 1) {
    r.fail("num_key_value_heads", "must be 1 (DeepSeek-V4 shares one K=V head), got " +
                                      r.find("num_key_value_heads")->dump());
  }
  if (r.get_string("hidden_act", "silu") != "silu") r.fail_value("hidden_act", "\"silu\"");
  if (r.get_string("scoring_func", "sqrtsoftplus") != "sqrtsoftplus") {
    r.fail_value("scoring_func", "\"sqrtsoftplus\"");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (r.get_bool(key, false)) r.fail(key, "must be false: DeepSeek-V4 has no biases");
  }

  // Partial rotary dimension: partial_rotary_factor, or the legacy qk_rope_head_dim.
  if (r.has("partial_rotary_factor")) {
    double prf = r.get_double("partial_rotary_factor", 0.125, 0.0);
    if (prf > 1.0) r.fail_value("partial_rotary_factor", "in (0, 1]");
    c.rope_head_dim = static_cast<int>(c.head_dim * prf);
    if (r.has("qk_rope_head_dim") && r.get_int("qk_rope_head_dim", 0, 1) != c.rope_head_dim) {
      r.fail("qk_rope_head_dim", "= " + r.find("qk_rope_head_dim")->dump() +
                                     " disagrees with head_dim * partial_rotary_factor = " +
                                     std::to_string(c.rope_head_dim));
    }
  } else if (r.has("qk_rope_head_dim")) {
    c.rope_head_dim = static_cast<int>(r.get_int("qk_rope_head_dim", 64, 2));
  } else {
    c.rope_head_dim = c.head_dim / 8;
  }

  // Compression rates: compress_rates {type: rate}, legacy compress_rate_csa / compress_rate_hca.
  if (r.has("compress_rates")) {
    const json::Value& rates = *r.find("compress_rates");
    if (!rates.is_object()) r.fail_value("compress_rates", "an object of layer type -> rate");
    FieldReader rr(rates, source, "compress_rates.");
    for (const auto& [key, value] : rates.as_object()) {
      if (key != "compressed_sparse_attention" && key != "heavily_compressed_attention") {
        rr.fail(key,
                "is not a compressed layer type (compressed_sparse_attention or "
                "heavily_compressed_attention)");
      }
      (void)value;
    }
    c.csa_compress_rate =
        static_cast<int>(rr.get_int("compressed_sparse_attention", c.csa_compress_rate, 1));
    c.hca_compress_rate =
        static_cast<int>(rr.get_int("heavily_compressed_attention", c.hca_compress_rate, 1));
  }
  c.csa_compress_rate = static_cast<int>(r.get_int("compress_rate_csa", c.csa_compress_rate, 1));
  c.hca_compress_rate = static_cast<int>(r.get_int("compress_rate_hca", c.hca_compress_rate, 1));

  // Layer types: explicit layer_types, else legacy compress_ratios (0/4/128 per layer, truncated
  // to num_hidden_layers: the released config lists the MTP block too), else the V4-Pro default.
  const size_t n = static_cast<size_t>(c.num_hidden_layers);
  auto parse_ratio = [&r](const json::Value& v, size_t i) {
    std::string key = "compress_ratios[" + std::to_string(i) + "]";
    if (!v.is_integer()) r.fail(key, "must be an integer, got " + v.dump());
    if (v.as_int() == 0) return AttentionKind::kSliding;
    if (v.as_int() == 4) return AttentionKind::kCompressedSparse;
    if (v.as_int() == 128) return AttentionKind::kHeavilyCompressed;
    r.fail(key,
           "must be 0 (sliding), 4 (CSA) or 128 (HCA) in a DeepSeek-V4 config, got " + v.dump());
  };
  if (r.has("layer_types")) {
    const json::Value& lt = *r.find("layer_types");
    if (!lt.is_array()) r.fail_value("layer_types", "a list of layer type names");
    for (size_t i = 0; i < lt.as_array().size(); ++i) {
      c.layer_types.push_back(parse_attention_kind(r, "layer_types", i, lt.as_array()[i]));
    }
    if (c.layer_types.size() != n) {
      r.fail("layer_types", "has " + std::to_string(c.layer_types.size()) +
                                " entries but num_hidden_layers is " + std::to_string(n));
    }
  } else if (r.has("compress_ratios")) {
    const json::Value& cr = *r.find("compress_ratios");
    if (!cr.is_array()) r.fail_value("compress_ratios", "a list of integers");
    for (size_t i = 0; i < cr.as_array().size() && i < n; ++i) {
      c.layer_types.push_back(parse_ratio(cr.as_array()[i], i));
    }
    if (c.layer_types.size() != n) {
      r.fail("compress_ratios",
             "has " + std::to_string(cr.as_array().size()) +
                 " entries, fewer than num_hidden_layers = " + std::to_string(n));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      bool hca = i < 2 || (i - 2) % 2 == 0;
      c.layer_types.push_back(hca ? AttentionKind::kHeavilyCompressed
                                  : AttentionKind::kCompressedSparse);
    }
  }

  // MTP blocks: DeepSeek's reference builds block K as layer num_hidden_layers + K, whose
  // attention reads compress_ratios[num_hidden_layers + K] (V4-Flash: 0, sliding).
  c.num_nextn_predict_layers = static_cast<int>(r.get_int("num_nextn_predict_layers", 1, 0));
  const json::Value* ratios = r.find("compress_ratios");
  for (size_t k = 0; k < static_cast<size_t>(c.num_nextn_predict_layers); ++k) {
    const bool listed =
        ratios != nullptr && ratios->is_array() && n + k < ratios->as_array().size();
    c.mtp_layer_types.push_back(listed ? parse_ratio(ratios->as_array()[n + k], n + k)
                                       : AttentionKind::kSliding);
  }

  if (r.has("mlp_layer_types")) {
    const json::Value& mt = *r.find("mlp_layer_types");
    if (!mt.is_array()) r.fail_value("mlp_layer_types", "a list of \"hash_moe\" / \"moe\"");
    for (size_t i = 0; i < mt.as_array().size(); ++i) {
      const json::Value& v = mt.as_array()[i];
      if (v.is_string() && v.as_string() == "hash_moe") {
        c.mlp_layer_types.push_back(MlpKind::kHashMoe);
      } else if (v.is_string() && v.as_string() == "moe") {
        c.mlp_layer_types.push_back(MlpKind::kMoe);
      } else {
        r.fail("mlp_layer_types[" + std::to_string(i) + "]",
               "must be \"hash_moe\" or \"moe\", got " + v.dump());
      }
    }
    if (c.mlp_layer_types.size() != n) {
      r.fail("mlp_layer_types", "has " + std::to_string(c.mlp_layer_types.size()) +
                                    " entries but num_hidden_layers is " + std::to_string(n));
    }
  } else {
    size_t n_hash = static_cast<size_t>(r.get_int("num_hash_layers", 3, 0));
    for (size_t i = 0; i < n; ++i) {
      c.mlp_layer_types.push_back(i < n_hash ? MlpKind::kHashMoe : MlpKind::kMoe);
    }
  }

  // Rotary embeddings: nested rope_parameters {main, compress}, or a flat dict (and the legacy
  // rope_scaling) that configures the compress rope only.
  const double rope_theta = r.get_double("rope_theta", 10000.0, 0.0);
  const double compress_theta = r.get_double("compress_rope_theta", 160000.0, 0.0);
  c.main_rope.theta = rope_theta;
  c.compress_rope.theta = compress_theta;
  const json::Value* rp = r.find("rope_parameters");
  if (rp == nullptr || rp->is_null()) rp = r.find("rope_scaling");
  if (rp != nullptr && !rp->is_null()) {
    std::string rp_name = r.find("rope_parameters") && !r.find("rope_parameters")->is_null()
                              ? "rope_parameters"
                              : "rope_scaling";
    if (!rp->is_object()) r.fail_value(rp_name, "an object");
    const json::Value* main = rp->find("main");
    const json::Value* compress = rp->find("compress");
    if (main != nullptr && compress != nullptr) {
      if (!main->is_object()) r.fail_value(rp_name + ".main", "an object");
      if (!compress->is_object()) r.fail_value(rp_name + ".compress", "an object");
      c.main_rope = parse_rope(FieldReader(*main, source, rp_name + ".main."), rope_theta, false);
      c.compress_rope =
          parse_rope(FieldReader(*compress, source, rp_name + ".compress."), compress_theta, true);
    } else {
      c.compress_rope = parse_rope(FieldReader(*rp, source, rp_name + "."), compress_theta, true);
      c.compress_rope.theta = compress_theta;  // a flat dict's rope_theta is the main theta
    }
  }

  // Consistency between fields.
  const std::string& s = source;
  require(c.head_dim % 2 == 0, s, "head_dim must be even, got " + std::to_string(c.head_dim));
  require(
      c.rope_head_dim >= 2 && c.rope_head_dim % 2 == 0 && c.rope_head_dim <= c.head_dim, s,
      "the rotary dimension head_dim * partial_rotary_factor = " + std::to_string(c.rope_head_dim) +
          " must be even and within [2, head_dim = " + std::to_string(c.head_dim) + "]");
  require(c.index_head_dim >= c.rope_head_dim, s,
          "index_head_dim (" + std::to_string(c.index_head_dim) +
              ") must be at least the rotary dimension (" + std::to_string(c.rope_head_dim) + ")");
  require(c.num_attention_heads % c.o_groups == 0, s,
          "num_attention_heads (" + std::to_string(c.num_attention_heads) +
              ") must be divisible by o_groups (" + std::to_string(c.o_groups) + ")");
  require(c.num_experts_per_tok <= c.n_routed_experts, s,
          "num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) +
              ") exceeds n_routed_experts (" + std::to_string(c.n_routed_experts) + ")");
  for (int rate : {c.csa_compress_rate, c.hca_compress_rate}) {
    require(128 % rate == 0, s,
            "compression rates must divide the 128-token KV block, got " + std::to_string(rate));
  }
  for (int eos : c.eos_token_ids) {
    require(eos < c.vocab_size, s,
            "eos_token_id " + std::to_string(eos) + " is outside the vocabulary (vocab_size " +
                std::to_string(c.vocab_size) + ")");
  }
  require(c.bos_token_id < c.vocab_size, s,
          "bos_token_id " + std::to_string(c.bos_token_id) + " is outside the vocabulary");
  return c;
}

AttentionKind ModelConfig::attention_kind(int layer) const {
  if (layer >= num_hidden_layers) {
    return mtp_layer_types.at(static_cast<size_t>(layer - num_hidden_layers));
  }
  return layer_types.at(static_cast<size_t>(layer));
}

int ModelConfig::compress_rate(int layer) const {
  switch (attention_kind(layer)) {
    case AttentionKind::kSliding:
      return 0;
    case AttentionKind::kCompressedSparse:
      return csa_compress_rate;
    case AttentionKind::kHeavilyCompressed:
      return hca_compress_rate;
  }
  return 0;
}

bool ModelConfig::has_compressed_layers() const {
  for (AttentionKind k : layer_types) {
    if (k != AttentionKind::kSliding) return true;
  }
  for (AttentionKind k : mtp_layer_types) {
    if (k != AttentionKind::kSliding) return true;
  }
  return false;
}

std::vector<float> ModelConfig::rope_inv_freq(const RopeConfig& rope) const {
  // Mirrors transformers' fp32 arithmetic (default and YaRN rope init) so angles agree bit for
  // bit as far as the math library allows.
  const int dim = rope_head_dim;
  const float base = static_cast<float>(rope.theta);
  std::vector<float> pos_freqs(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freqs[static_cast<size_t>(i)] = std::pow(base, exponent);
  }
  std::vector<float> inv(pos_freqs.size());
  if (!rope.yarn) {
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / pos_freqs[i];
    return inv;
  }
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(static_cast<double>(rope.original_max_position_embeddings) /
                           (rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast);
  double high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float factor = static_cast<float>(rope.factor);
  for (size_t i = 0; i < inv.size(); ++i) {
    float extrapolation = 1.0f / pos_freqs[i];
    float interpolation = 1.0f / (factor * pos_freqs[i]);
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

}  // namespace deepinfer
