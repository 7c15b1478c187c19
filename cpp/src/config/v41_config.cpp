#include "deepinfer/v41_config.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include "common/json.h"
#include "config/field_reader.h"
#include "deepinfer/error.h"

namespace deepinfer {

namespace {

using config_detail::FieldReader;

bool contains(const std::vector<int>& ids, int layer) {
  return std::find(ids.begin(), ids.end(), layer) != ids.end();
}

// A list of integers in [min_value, max_value]; absent or null keeps `fallback`.
std::vector<int64_t> get_int_list(const FieldReader& r, std::string_view key,
                                  std::vector<int64_t> fallback, int64_t min_value,
                                  int64_t max_value) {
  if (!r.has(key)) return fallback;
  const json::Value& v = *r.find(key);
  if (!v.is_array()) r.fail_value(key, "a list of integers");
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.as_array().size(); ++i) {
    const json::Value& e = v.as_array()[i];
    if (!e.is_integer() || e.as_int() < min_value || e.as_int() > max_value) {
      r.fail(std::string(key) + "[" + std::to_string(i) + "]",
             "must be an integer in [" + std::to_string(min_value) + ", " +
                 std::to_string(max_value) + "], got " + e.dump());
    }
    out.push_back(e.as_int());
  }
  return out;
}

std::vector<int> get_layer_list(const FieldReader& r, std::string_view key,
                                const std::vector<int>& fallback, int64_t max_value) {
  std::vector<int64_t> wide(fallback.begin(), fallback.end());
  wide = get_int_list(r, key, wide, 0, max_value);
  return std::vector<int>(wide.begin(), wide.end());
}

// The nearest source at or before `layer`, or -1 (also on ratio-0 layers).
int nearest(const V41TextConfig& c, const std::vector<int>& sources, int layer) {
  if (c.ratio(layer) == 0) return -1;
  int best = -1;
  for (int s : sources) {
    if (s <= layer) best = std::max(best, s);
  }
  return best;
}

bool is_prime(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t i = 3; i * i <= n; i += 2) {
    if (n % i == 0) return false;
  }
  return true;
}

std::string list_text(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// The outer config.json fields of B.3: model_type, architectures, dtype, quantization_config.
void check_outer(const FieldReader& root, V41TextConfig& c) {
  const std::string model_type = root.get_string("model_type", "");
  if (model_type != "deepseek_v41") {
    root.fail("model_type",
              "must be \"deepseek_v41\", got " +
                  (root.has("model_type") ? "\"" + model_type + "\"" : std::string("nothing")));
  }
  if (root.has("architectures")) {
    const json::Value& a = *root.find("architectures");
    bool ok = a.is_array();
    if (ok) {
      ok = false;
      for (const json::Value& e : a.as_array()) {
        ok = ok || (e.is_string() && e.as_string() == "DeepseekV41ForCausalLM");
      }
    }
    if (!ok) root.fail_value("architectures", "a list containing \"DeepseekV41ForCausalLM\"");
  }
  const std::string dtype = root.get_string("dtype", root.get_string("torch_dtype", "bfloat16"));
  if (dtype != "bfloat16") {
    root.fail(root.has("dtype") ? "dtype" : "torch_dtype",
              "must be \"bfloat16\", got \"" + dtype + "\"");
  }
  if (!root.has("quantization_config")) {
    root.fail("quantization_config",
              "is required: V4.1 checkpoints are FP8 (32x32 UE8M0 blocks) with MXFP4 experts");
  }
  c.quantization = config_detail::parse_quantization(root);
  const QuantConfig& q = c.quantization;
  if (!q.experts_fp4) {
    throw Error(ErrorCode::kUnsupported,
                root.source() +
                    ": field 'quantization_config.expert_dtype' must be \"fp4\" for DeepSeek-V4.1 "
                    "(MXFP4 routed experts)");
  }
  if (q.weight_block_rows != 32 || q.weight_block_cols != 32 || !q.ue8m0_scales) {
    throw Error(ErrorCode::kUnsupported,
                root.source() +
                    ": fields 'quantization_config.weight_block_size' / 'scale_fmt' must be "
                    "[32, 32] / \"ue8m0\" for DeepSeek-V4.1, got [" +
                    std::to_string(q.weight_block_rows) + ", " +
                    std::to_string(q.weight_block_cols) + "] / " +
                    (q.ue8m0_scales ? "\"ue8m0\"" : "\"float\""));
  }
}

void read_scalars(const FieldReader& r, V41TextConfig& c) {
  auto i32 = [&r](const char* key, int& field, int64_t min_value) {
    field = static_cast<int>(r.get_int(key, field, min_value));
  };
  i32("vocab_size", c.vocab_size, 1);
  i32("hidden_size", c.hidden_size, 1);
  i32("num_hidden_layers", c.num_hidden_layers, 1);
  i32("num_attention_heads", c.num_attention_heads, 1);
  i32("head_dim", c.head_dim, 2);
  i32("qk_rope_head_dim", c.rope_head_dim, 2);
  i32("q_lora_rank", c.q_lora_rank, 1);
  i32("o_groups", c.o_groups, 1);
  i32("o_lora_rank", c.o_lora_rank, 1);
  i32("sliding_window", c.sliding_window, 1);
  c.max_position_embeddings = r.get_int("max_position_embeddings", c.max_position_embeddings, 1,
                                        std::numeric_limits<int64_t>::max());
  i32("n_routed_experts", c.n_routed_experts, 1);
  i32("num_experts_per_tok", c.num_experts_per_tok, 1);
  i32("n_shared_experts", c.n_shared_experts, 0);
  i32("moe_intermediate_size", c.moe_intermediate_size, 1);
  c.routed_scaling_factor = r.get_double("routed_scaling_factor", c.routed_scaling_factor, 0.0);
  c.norm_topk_prob = r.get_bool("norm_topk_prob", c.norm_topk_prob);
  c.swiglu_limit = r.get_double("swiglu_limit", c.swiglu_limit, 0.0);
  c.rms_norm_eps = r.get_double("rms_norm_eps", c.rms_norm_eps, 0.0);
  i32("hc_mult", c.hc_mult, 1);
  i32("hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1);
  c.hc_eps = r.get_double("hc_eps", c.hc_eps, 0.0);
  c.hc_shifted = r.get_bool("hc_shifted", true);
  i32("index_n_heads", c.index_n_heads, 1);
  i32("index_head_dim", c.index_head_dim, 2);
  i32("index_topk", c.index_topk, 1);
  i32("candidate_topk_blocks", c.candidate_topk_blocks, 1);
  i32("candidate_block_size", c.candidate_block_size, 1);
  i32("engram_max_ngram_size", c.engram_max_ngram_size, 2);
  c.engram_vocab_size = r.get_int("engram_vocab_size", c.engram_vocab_size, 2,
                                  std::numeric_limits<int64_t>::max() / 4);
  i32("engram_n_heads", c.engram_n_heads, 1);
  i32("engram_head_dim", c.engram_head_dim, 1);
  i32("engram_compressed_vocab_size", c.engram_compressed_vocab_size, 1);
  i32("engram_pad_token_id", c.engram_pad_token_id, 0);
  i32("num_nextn_predict_layers", c.num_nextn_predict_layers, 0);
  i32("dspark_block_size", c.dspark_block_size, 1);
  i32("dspark_markov_rank", c.dspark_markov_rank, 1);
  i32("dspark_noise_token_id", c.dspark_noise_token_id, 0);
  i32("dspark_n_routed_experts", c.dspark_n_routed_experts, 1);
  i32("dspark_num_experts_per_tok", c.dspark_num_experts_per_tok, 1);
  i32("image_token_id", c.image_token_id, 0);

  // Fixed architecture choices (B.3, C.1, C.5).
  if (r.get_int("num_key_value_heads", 1, 1) != 1) r.fail_value("num_key_value_heads", "1");
  if (r.get_string("hidden_act", "silu") != "silu") r.fail_value("hidden_act", "\"silu\"");
  if (r.get_string("scoring_func", "sqrtsoftplus") != "sqrtsoftplus") {
    r.fail_value("scoring_func", "\"sqrtsoftplus\"");
  }
  if (r.get_string("topk_method", "noaux_tc") != "noaux_tc") {
    r.fail_value("topk_method", "\"noaux_tc\"");
  }
  if (r.get_bool("attention_bias", false)) r.fail_value("attention_bias", "false");
  if (r.has("attention_dropout") &&
      (!r.find("attention_dropout")->is_number() || r.find("attention_dropout")->as_double() != 0))
    r.fail_value("attention_dropout", "0");
  if (!c.hc_shifted) {
    r.fail("hc_shifted", "must be true: DeepSeek-V4.1 uses shifted mHC (model.md C.4)");
  }
  if (c.rope_head_dim > c.head_dim || c.rope_head_dim % 2 != 0) {
    r.fail("qk_rope_head_dim",
           "= " + std::to_string(c.rope_head_dim) +
               " must be even and at most head_dim = " + std::to_string(c.head_dim));
  }
  if (c.index_head_dim < c.rope_head_dim) {
    r.fail("index_head_dim",
           "= " + std::to_string(c.index_head_dim) +
               " is smaller than qk_rope_head_dim = " + std::to_string(c.rope_head_dim));
  }
  if (c.num_attention_heads % c.o_groups != 0) {
    r.fail("o_groups",
           "= " + std::to_string(c.o_groups) +
               " does not divide num_attention_heads = " + std::to_string(c.num_attention_heads));
  }

  c.main_rope.theta = r.get_double("rope_theta", 10000.0, 0.0);
  c.compress_rope.theta = r.get_double("compress_rope_theta", 160000.0, 0.0);
  if (r.has("rope_scaling")) {
    const json::Value& s = *r.find("rope_scaling");
    if (!s.is_object()) r.fail_value("rope_scaling", "an object");
    const FieldReader sr(s, r.source(), r.path("rope_scaling."));
    c.compress_rope = config_detail::parse_rope(sr, c.compress_rope.theta, true);
  }
}

// Layer-role lists, the derived maps and the nesting checks of v41_reference.py's validate().
void read_roles(const FieldReader& r, V41TextConfig& c) {
  const int n = c.num_hidden_layers;
  const int total = n + c.num_nextn_predict_layers;
  std::vector<int64_t> flash_ratios(2, 0);
  flash_ratios.insert(flash_ratios.end(), 18, 2);
  flash_ratios.insert(flash_ratios.end(), 20, 1);
  flash_ratios.insert(flash_ratios.end(), 3, 0);
  std::vector<int64_t> ratios = get_int_list(r, "compress_ratios", flash_ratios, 0, 2);
  if (static_cast<int>(ratios.size()) != total) {
    r.fail("compress_ratios", "has " + std::to_string(ratios.size()) +
                                  " entries; expected num_hidden_layers + "
                                  "num_nextn_predict_layers = " +
                                  std::to_string(total));
  }
  c.compress_ratios.assign(ratios.begin(), ratios.end());

  c.kv_source_layer_ids = get_layer_list(r, "kv_source_layer_ids", {2, 8, 14, 20}, n - 1);
  c.index_source_layer_ids =
      get_layer_list(r, "index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}, n - 1);
  const json::Value* cand = r.find("candidate_source_layer_id");
  if (cand == nullptr) {
    c.candidate_source_layer_id = 20;
  } else if (cand->is_null()) {
    c.candidate_source_layer_id = -1;
  } else {
    c.candidate_source_layer_id =
        static_cast<int>(r.get_int("candidate_source_layer_id", 0, 0, n - 1));
  }
  c.engram_layer_ids = get_layer_list(r, "engram_layer_ids", {1, 14}, n - 1);
  c.engram_num_embeddings = get_int_list(r, "engram_num_embeddings", {384006168, 384016682}, 1,
                                         std::numeric_limits<int64_t>::max());
  c.dspark_target_layer_ids = get_layer_list(r, "dspark_target_layer_ids", {37, 38, 39}, n - 1);
  // The forward collects the target features as its layer loop reaches them, and main_proj's
  // columns follow the list: both orders agree only for a strictly increasing list.
  for (size_t i = 1; i < c.dspark_target_layer_ids.size(); ++i) {
    if (c.dspark_target_layer_ids[i] <= c.dspark_target_layer_ids[i - 1]) {
      r.fail("dspark_target_layer_ids[" + std::to_string(i) + "]",
             "= " + std::to_string(c.dspark_target_layer_ids[i]) +
                 " must be greater than the entry before it (" +
                 std::to_string(c.dspark_target_layer_ids[i - 1]) +
                 "): the list is strictly increasing");
    }
  }

  for (size_t i = 0; i < c.kv_source_layer_ids.size(); ++i) {
    int s = c.kv_source_layer_ids[i];
    if (c.ratio(s) == 0) {
      r.fail("kv_source_layer_ids[" + std::to_string(i) + "]",
             "= " + std::to_string(s) + " is a sliding-only layer (compress_ratios[" +
                 std::to_string(s) + "] = 0); a kv source must be compressed");
    }
  }
  c.kv_source.assign(n, -1);
  c.index_source.assign(n, -1);
  c.index_k_source.assign(n, -1);
  for (int layer = 0; layer < n; ++layer) {
    const std::string at = "layer " + std::to_string(layer) + " (compress ratio " +
                           std::to_string(c.ratio(layer)) + ")";
    if (c.ratio(layer) == 0) {
      if (contains(c.index_source_layer_ids, layer)) {
        r.fail("index_source_layer_ids", "lists " + at + ", a sliding-only layer");
      }
      continue;
    }
    const int kv = nearest(c, c.kv_source_layer_ids, layer);
    const int idx = nearest(c, c.index_source_layer_ids, layer);
    if (kv < 0) r.fail("kv_source_layer_ids", "has no source at or before " + at);
    if (idx < 0) r.fail("index_source_layer_ids", "has no source at or before " + at);
    // The segments nest (C.3.7): the index source lies inside the layer's kv segment, and the kv
    // source has the layer's ratio.
    if (idx < kv) {
      r.fail("index_source_layer_ids",
             "does not nest in kv_source_layer_ids: " + at + " reads kv source " +
                 std::to_string(kv) + " but index source " + std::to_string(idx) +
                 ", which is before it (index segments must lie inside kv segments)");
    }
    if (c.ratio(kv) != c.ratio(layer)) {
      r.fail("kv_source_layer_ids", at + " reads kv source " + std::to_string(kv) +
                                        " of compress ratio " + std::to_string(c.ratio(kv)) +
                                        "; a kv segment must have one ratio");
    }
    // Spec reading 4: the index-K sources are the kv sources.
    const int ik = nearest(c, c.kv_source_layer_ids, idx);
    if (ik != kv) {
      r.fail("index_source_layer_ids", at + ": its index source " + std::to_string(idx) +
                                           " reads the index K of layer " + std::to_string(ik) +
                                           ", not of its kv source " + std::to_string(kv));
    }
    c.kv_source[layer] = kv;
    c.index_source[layer] = idx;
    c.index_k_source[layer] = ik;
  }

  c.yoco_boundary = -1;
  for (int layer = 0; layer < n && c.yoco_boundary < 0; ++layer) {
    if (c.ratio(layer) == 1) c.yoco_boundary = layer;
  }
  if (const int b = c.yoco_boundary; b >= 0) {
    for (int layer = b; layer < n; ++layer) {
      if (c.ratio(layer) != 1) {
        r.fail("compress_ratios[" + std::to_string(layer) + "]",
               "must be 1: layers from the YOCO boundary " + std::to_string(b) +
                   " (the first ratio-1 layer) on are C1 consumers, got " +
                   std::to_string(c.ratio(layer)));
      }
    }
    if (!contains(c.kv_source_layer_ids, b)) {
      r.fail("kv_source_layer_ids", "must contain the YOCO boundary layer " + std::to_string(b) +
                                        " (share-KV must not cross it), got " +
                                        list_text(c.kv_source_layer_ids));
    }
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
      if (c.engram_layer_ids[i] >= b) {
        r.fail("engram_layer_ids[" + std::to_string(i) + "]",
               "= " + std::to_string(c.engram_layer_ids[i]) +
                   " must be a YOCO producer, below the boundary " + std::to_string(b));
      }
    }
    if (c.yoco_keep_tokens < c.sliding_window) {
      r.fail("sliding_window", "= " + std::to_string(c.sliding_window) +
                                   " exceeds the YOCO keep tokens " +
                                   std::to_string(c.yoco_keep_tokens));
    }
  }

  if (const int cs = c.candidate_source_layer_id; cs >= 0) {
    if (!contains(c.index_source_layer_ids, cs)) {
      r.fail("candidate_source_layer_id", "= " + std::to_string(cs) + " is not an index source " +
                                              list_text(c.index_source_layer_ids));
    }
    for (int layer : c.index_source_layer_ids) {
      if (layer > cs && c.kv_source[layer] != c.kv_source[cs]) {
        r.fail("candidate_source_layer_id", "= " + std::to_string(cs) + " (kv source " +
                                                std::to_string(c.kv_source[cs]) +
                                                "): index source " + std::to_string(layer) +
                                                " after it reads another kv segment (kv source " +
                                                std::to_string(c.kv_source[layer]) + ")");
      }
    }
  }

  // Engram: one row table per layer, sized by a nextprime chain (C.7.3).
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size()) {
    r.fail("engram_num_embeddings", "has " + std::to_string(c.engram_num_embeddings.size()) +
                                        " entries, engram_layer_ids " +
                                        std::to_string(c.engram_layer_ids.size()));
  }
  int64_t p = c.engram_vocab_size - 1;
  c.engram_primes.clear();
  for (size_t l = 0; l < c.engram_layer_ids.size(); ++l) {
    std::vector<int64_t> primes;
    int64_t sum = 0;
    for (int k = 0; k < (c.engram_max_ngram_size - 1) * c.engram_n_heads; ++k) {
      do ++p;
      while (!is_prime(p));
      primes.push_back(p);
      sum += p;
    }
    if (sum != c.engram_num_embeddings[l]) {
      r.fail("engram_num_embeddings[" + std::to_string(l) + "]",
             "= " + std::to_string(c.engram_num_embeddings[l]) +
                 " disagrees with the prime chain of engram_vocab_size, engram_max_ngram_size and "
                 "engram_n_heads (sum " +
                 std::to_string(sum) + ")");
    }
    c.engram_primes.push_back(std::move(primes));
  }
}

}  // namespace

bool V41TextConfig::is_kv_source(int layer) const {
  return contains(kv_source_layer_ids, layer);
}
bool V41TextConfig::is_index_source(int layer) const {
  return contains(index_source_layer_ids, layer);
}
bool V41TextConfig::is_index_k_source(int layer) const {
  return is_kv_source(layer);
}
bool V41TextConfig::is_candidate_source(int layer) const {
  return candidate_source_layer_id >= 0 && layer == candidate_source_layer_id;
}
bool V41TextConfig::uses_candidates(int layer) const {
  return candidate_source_layer_id >= 0 && is_index_source(layer) &&
         layer > candidate_source_layer_id;
}
bool V41TextConfig::is_engram_layer(int layer) const {
  return contains(engram_layer_ids, layer);
}

ModelConfig V41TextConfig::model_config() const {
  ModelConfig m;
  m.source = source;
  m.vocab_size = vocab_size;
  m.hidden_size = hidden_size;
  m.num_hidden_layers = num_hidden_layers;
  m.num_attention_heads = num_attention_heads;
  m.head_dim = head_dim;
  m.rope_head_dim = rope_head_dim;
  m.q_lora_rank = q_lora_rank;
  m.o_groups = o_groups;
  m.o_lora_rank = o_lora_rank;
  m.sliding_window = sliding_window;
  m.index_n_heads = index_n_heads;
  m.index_head_dim = index_head_dim;
  m.index_topk = index_topk;
  m.csa_compress_rate = 2;
  m.hca_compress_rate = 1;
  m.n_routed_experts = n_routed_experts;
  m.num_experts_per_tok = num_experts_per_tok;
  m.moe_intermediate_size = moe_intermediate_size;
  m.routed_scaling_factor = routed_scaling_factor;
  m.swiglu_limit = swiglu_limit;
  m.hc_mult = hc_mult;
  m.hc_sinkhorn_iters = hc_sinkhorn_iters;
  m.hc_eps = hc_eps;
  m.rms_norm_eps = rms_norm_eps;
  m.max_position_embeddings = max_position_embeddings;
  m.main_rope = main_rope;
  m.compress_rope = compress_rope;
  m.quantization = quantization;
  m.layer_types.clear();
  for (int layer = 0; layer < num_hidden_layers; ++layer) {
    const int r = ratio(layer);
    m.layer_types.push_back(r == 0   ? AttentionKind::kSliding
                            : r == 2 ? AttentionKind::kCompressedSparse
                                     : AttentionKind::kHeavilyCompressed);
  }
  m.mlp_layer_types.assign(static_cast<size_t>(num_hidden_layers), MlpKind::kMoe);
  m.num_nextn_predict_layers = 0;
  m.mtp_layer_types.clear();
  m.v41 = std::make_shared<const V41TextConfig>(*this);
  return m;
}

V41TextConfig V41TextConfig::from_file(const std::string& path, int yoco_keep_tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, path + ": cannot open the model config");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path, yoco_keep_tokens);
}

V41TextConfig V41TextConfig::from_json_text(const std::string& text, const std::string& source,
                                            int yoco_keep_tokens) {
  json::Value root = json::parse(text, source);
  if (!root.is_object()) {
    throw Error(ErrorCode::kInvalidConfig,
                source + ": the config must be a JSON object, got " + root.type_name());
  }
  const FieldReader outer(root, source);
  V41TextConfig c;
  c.source = source;
  c.yoco_keep_tokens = yoco_keep_tokens;
  check_outer(outer, c);
  if (!outer.has("text_config")) outer.fail("text_config", "is required for deepseek_v41");
  const json::Value& text_config = *outer.find("text_config");
  if (!text_config.is_object()) outer.fail_value("text_config", "an object");
  const FieldReader r(text_config, source, "text_config.");
  read_scalars(r, c);
  read_roles(r, c);
  return c;
}

void set_yoco_truncation(ModelConfig& config, const std::string& mode, int keep_tokens,
                         int max_rollback) {
  YocoTruncation truncation = YocoTruncation::kOff;
  if (mode == "mask") {
    truncation = YocoTruncation::kMask;
  } else if (mode == "compact") {
    truncation = YocoTruncation::kCompact;
  } else if (mode != "off") {
    throw Error(
        ErrorCode::kInvalidArgument,
        "'yoco_prefill_truncation' must be \"off\", \"mask\" or \"compact\", got \"" + mode + "\"");
  }
  if (config.v41 == nullptr) {
    if (truncation == YocoTruncation::kOff) return;
    throw Error(ErrorCode::kInvalidArgument,
                "'yoco_prefill_truncation' \"" + mode + "\" needs a DeepSeek-V4.1 model (YOCO " +
                    "consumer layers); " + config.source + " is not one");
  }
  const int needed = config.v41->sliding_window + max_rollback;
  if (truncation != YocoTruncation::kOff && keep_tokens < needed) {
    throw Error(ErrorCode::kInvalidArgument,
                "'yoco_keep_tokens' must be >= sliding_window (" +
                    std::to_string(config.v41->sliding_window) + ") + the speculative rollback (" +
                    std::to_string(max_rollback) + ") = " + std::to_string(needed) + ", got " +
                    std::to_string(keep_tokens));
  }
  if (truncation != YocoTruncation::kOff && config.v41->yoco_boundary < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "'yoco_prefill_truncation' \"" + mode + "\" needs YOCO consumer layers, but " +
                    config.source + " has no YOCO boundary (no layer with compress ratio 1)");
  }
  if (truncation != YocoTruncation::kOff) {
    for (int layer : config.v41->kv_source_layer_ids) {
      if (layer > config.v41->yoco_boundary) {
        // Its compressor would see the kept rows only (compact) or narrowed hidden states (mask):
        // its entries, which decode reads, would depend on where the prefill ended.
        throw Error(ErrorCode::kInvalidArgument,
                    "'yoco_prefill_truncation' \"" + mode + "\" needs the YOCO boundary " +
                        std::to_string(config.v41->yoco_boundary) +
                        " to be the last kv source, but layer " + std::to_string(layer) +
                        " compresses too (" + config.source + ")");
      }
    }
  }
  auto v41 = std::make_shared<V41TextConfig>(*config.v41);
  v41->yoco_truncation = truncation;
  v41->yoco_keep_tokens = keep_tokens;
  config.v41 = std::move(v41);
}

void set_engram_table_memory(ModelConfig& config, const std::string& mode) {
  EngramTableMemory memory = EngramTableMemory::kAuto;
  if (mode == "device") {
    memory = EngramTableMemory::kDevice;
  } else if (mode == "host") {
    memory = EngramTableMemory::kHost;
  } else if (mode != "auto") {
    throw Error(
        ErrorCode::kInvalidArgument,
        "'engram_table_memory' must be \"auto\", \"device\" or \"host\", got \"" + mode + "\"");
  }
  if (config.v41 == nullptr || config.v41->engram_layer_ids.empty()) {
    if (memory == EngramTableMemory::kAuto) return;
    throw Error(ErrorCode::kInvalidArgument,
                "'engram_table_memory' \"" + mode +
                    "\" needs a DeepSeek-V4.1 model with Engram layers; " + config.source +
                    " has none");
  }
  auto v41 = std::make_shared<V41TextConfig>(*config.v41);
  v41->engram_table_memory = memory;
  config.v41 = std::move(v41);
}

}  // namespace deepinfer
