// V41TextConfig: the V4.1 text config (model.md B.3) and its derived layer roles (C.2).
//
// The JSON fixtures (v41_config_fixtures.h) are v41_reference.py's configs; the expected role
// maps below are that module's kv_source / index_source /
// index_k_source / uses_candidates / n_prefill_layer for the same configs, so these tests
// cross-check the C++ derivation against the Python reference.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deepinfer/config.h"
#include "deepinfer/error.h"
#include "deepinfer/v41_config.h"
#include "v41_config_fixtures.h"

namespace deepinfer {
namespace {

using v41_fixtures::kFlash;
using v41_fixtures::kTinyA;
using v41_fixtures::kTinyB;
using v41_fixtures::kTinyC;

std::vector<int> uses_candidates(const V41TextConfig& c) {
  std::vector<int> out;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (c.uses_candidates(l)) out.push_back(l);
  }
  return out;
}

// A fixture without its line breaks, for edits across them.
std::string one_line(const char* fixture) {
  std::string s = fixture;
  std::erase(s, '\n');
  return s;
}

V41TextConfig parse(const std::string& text) {
  return V41TextConfig::from_json_text(text, "config.json");
}

// Replaces the one occurrence of `from` in `text`.
std::string edit(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  EXPECT_EQ(text.find(from, at + 1), std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(V41Config, FlashRolesMatchModelMdC2) {
  const V41TextConfig c = parse(kFlash);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.moe_intermediate_size, 2304);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6);
  EXPECT_TRUE(c.hc_shifted);
  EXPECT_TRUE(c.quantization.fp8);
  EXPECT_TRUE(c.quantization.experts_fp4);
  EXPECT_TRUE(c.quantization.ue8m0_scales);
  EXPECT_EQ(c.quantization.weight_block_rows, 32);
  EXPECT_EQ(c.quantization.weight_block_cols, 32);

  ASSERT_EQ(c.compress_ratios.size(), 43u);
  for (int l = 0; l < 43; ++l) {
    EXPECT_EQ(c.ratio(l), l < 2 ? 0 : l < 20 ? 2 : l < 40 ? 1 : 0) << l;
    EXPECT_EQ(c.layer_rope(l).theta, c.ratio(l) == 0 ? 10000.0 : 160000.0) << l;
    EXPECT_EQ(c.layer_rope(l).yarn, c.ratio(l) != 0) << l;
  }
  EXPECT_EQ(c.compress_rope.factor, 16.0);
  EXPECT_EQ(c.compress_rope.original_max_position_embeddings, 65536);

  // C.2: kv sources {2, 8, 14, 20}, index sources {2, 8, 14, 20, 24, 28, 32, 36}.
  for (int l = 0; l < 40; ++l) {
    const int kv = l < 2 ? -1 : l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    const int idx = l < 20 ? kv : l < 24 ? 20 : 24 + (l - 24) / 4 * 4;
    EXPECT_EQ(c.kv_source[l], kv) << l;
    EXPECT_EQ(c.index_k_source[l], kv) << l;
    EXPECT_EQ(c.index_source[l], idx) << l;
    EXPECT_EQ(c.is_kv_source(l), l == 2 || l == 8 || l == 14 || l == 20) << l;
    EXPECT_EQ(c.is_index_k_source(l), c.is_kv_source(l)) << l;
    EXPECT_EQ(c.is_index_source(l), l >= 2 && c.index_source[l] == l) << l;
    EXPECT_EQ(c.is_yoco_consumer(l), l >= 20) << l;
    EXPECT_EQ(c.is_engram_layer(l), l == 1 || l == 14) << l;
    EXPECT_EQ(c.is_candidate_source(l), l == 20) << l;
  }
  EXPECT_EQ(c.candidate_source_layer_id, 20);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  EXPECT_EQ(c.candidate_block_size, 8);
  EXPECT_EQ(uses_candidates(c), (std::vector<int>{24, 28, 32, 36}));
  EXPECT_EQ(c.yoco_boundary, 20);
  EXPECT_EQ(c.yoco_keep_tokens, 140);

  // C.7: the prime chain reproduces engram_num_embeddings; 3 orders x 8 heads per layer.
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int>{1, 14}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  ASSERT_EQ(c.engram_primes.size(), 2u);
  EXPECT_EQ(c.engram_primes[0].size(), 24u);
  EXPECT_GT(c.engram_primes[0][0], 16000000 - 1);
  EXPECT_LT(c.engram_primes[0].back(), c.engram_primes[1].front());
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{37, 38, 39}));
  EXPECT_EQ(c.num_nextn_predict_layers, 3);
}

TEST(V41Config, FlashDefaultsWhenFieldsAreAbsent) {
  // B.3: hc_shifted is absent from V4.1-Flash's config and defaults to true; the role fields
  // default to V4.1-Flash's.
  const V41TextConfig c = parse(
      R"({"model_type":"deepseek_v41","text_config":{},"quantization_config":{"quant_method":"fp8",)"
      R"("expert_dtype":"fp4","weight_block_size":[32,32],"scale_fmt":"ue8m0"}})");
  const V41TextConfig flash = parse(kFlash);
  EXPECT_TRUE(c.hc_shifted);
  EXPECT_EQ(c.kv_source, flash.kv_source);
  EXPECT_EQ(c.index_source, flash.index_source);
  EXPECT_EQ(c.engram_num_embeddings, flash.engram_num_embeddings);
  EXPECT_EQ(c.candidate_source_layer_id, 20);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
}

struct Expected {
  const char* json;
  std::vector<int> kv, index, index_k, candidates;
  int boundary;
  std::vector<int64_t> engram_rows;
};

TEST(V41Config, TinyConfigsMatchThePythonReference) {
  const std::vector<Expected> cases = {
      {kTinyA,
       {-1, -1, 2, 2, 4, 4, 6, 6, 6, 6},
       {-1, -1, 2, 2, 4, 4, 6, 6, 8, 8},
       {-1, -1, 2, 2, 4, 4, 6, 6, 6, 6},
       {8},
       6,
       {304, 462}},
      {kTinyB,
       {-1, 1, 1, 3, 3, 3, 3},
       {-1, 1, 2, 3, 4, 4, 6},
       {-1, 1, 1, 3, 3, 3, 3},
       {4, 6},
       3,
       {304}},
      {kTinyC,
       {-1, -1, 2, 2, 2, 2},
       {-1, -1, 2, 3, 3, 5},
       {-1, -1, 2, 2, 2, 2},
       {5},
       -1,
       {304, 462}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("tiny config " + std::string(1, static_cast<char>('A' + i)));
    const V41TextConfig c = parse(cases[i].json);
    EXPECT_EQ(c.kv_source, cases[i].kv);
    EXPECT_EQ(c.index_source, cases[i].index);
    EXPECT_EQ(c.index_k_source, cases[i].index_k);
    EXPECT_EQ(uses_candidates(c), cases[i].candidates);
    EXPECT_EQ(c.yoco_boundary, cases[i].boundary);
    EXPECT_EQ(c.engram_num_embeddings, cases[i].engram_rows);
    EXPECT_EQ(c.rms_norm_eps, 1e-20);
  }
  const V41TextConfig b = parse(kTinyB);
  EXPECT_EQ(b.hc_mult, 2);
  EXPECT_EQ(b.sliding_window, 6);
  EXPECT_EQ(b.engram_primes, (std::vector<std::vector<int64_t>>{{41, 43, 47, 53, 59, 61}}));
  EXPECT_FALSE(parse(kTinyC).is_yoco_consumer(5));
}

void expect_field_error(const std::string& text, const std::string& field,
                        const std::string& detail = "") {
  try {
    parse(text);
    ADD_FAILURE() << "no error; expected one naming " << field;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("config.json"), std::string::npos) << what;
    EXPECT_NE(what.find("'" + field + "'"), std::string::npos) << what;
    EXPECT_NE(what.find(detail), std::string::npos) << what;
  }
}

TEST(V41Config, ErrorsNameTheField) {
  const std::string a = one_line(kTinyA);
  expect_field_error(edit(a, R"("model_type":"deepseek_v41")", R"("model_type":"deepseek_v4")"),
                     "model_type", "deepseek_v41");
  expect_field_error(edit(a, R"("compress_ratios":[0,0,2,2,2,2,1,1,1,1,0])",
                          R"("compress_ratios":[0,0,2,2,2,2,1,1,1,1])"),
                     "text_config.compress_ratios", "num_nextn_predict_layers");
  expect_field_error(edit(a, "1,1,1,1,0]", "1,1,3,1,0]"), "text_config.compress_ratios[8]");
  // A kv source on a sliding-only layer.
  expect_field_error(
      edit(a, R"("kv_source_layer_ids":[2,4,6])", R"("kv_source_layer_ids":[1,4,6])"),
      "text_config.kv_source_layer_ids[0]", "sliding-only");
  // Index segments must nest inside kv segments: index source 4 without kv source 4 is fine,
  // but kv source 5 after index source 4 leaves layer 5 reading index 4 < kv 5.
  expect_field_error(
      edit(a, R"("kv_source_layer_ids":[2,4,6])", R"("kv_source_layer_ids":[2,5,6])"),
      "text_config.index_source_layer_ids", "does not nest");
  // A kv segment mixing ratios: C1 layer 6 reading C2 source 4.
  expect_field_error(
      edit(edit(a, R"("kv_source_layer_ids":[2,4,6])", R"("kv_source_layer_ids":[2,4])"),
           R"("candidate_source_layer_id":6)", R"("candidate_source_layer_id":null)"),
      "text_config.kv_source_layer_ids", "one ratio");
  expect_field_error(
      edit(a, R"("index_source_layer_ids":[2,4,6,8])", R"("index_source_layer_ids":[1,2,4,6,8])"),
      "text_config.index_source_layer_ids", "sliding-only");
  expect_field_error(
      edit(a, R"("index_source_layer_ids":[2,4,6,8])", R"("index_source_layer_ids":[4,6,8])"),
      "text_config.index_source_layer_ids", "no source at or before layer 2");
  expect_field_error(
      edit(a, R"("candidate_source_layer_id":6)", R"("candidate_source_layer_id":7)"),
      "text_config.candidate_source_layer_id", "not an index source");
  // Index source 4 (a C2 segment) after candidate source 2 reads another kv segment.
  expect_field_error(
      edit(a, R"("candidate_source_layer_id":6)", R"("candidate_source_layer_id":2)"),
      "text_config.candidate_source_layer_id", "another kv segment");
  expect_field_error(edit(a, R"("engram_layer_ids":[1,4])", R"("engram_layer_ids":[1,7])"),
                     "text_config.engram_layer_ids[1]", "YOCO producer");
  expect_field_error(
      edit(a, R"("engram_num_embeddings":[304,462])", R"("engram_num_embeddings":[304,463])"),
      "text_config.engram_num_embeddings[1]", "prime chain");
  expect_field_error(
      edit(a, R"("engram_num_embeddings":[304,462])", R"("engram_num_embeddings":[304])"),
      "text_config.engram_num_embeddings", "engram_layer_ids");
  expect_field_error(edit(a, R"("hc_shifted":true)", R"("hc_shifted":false)"),
                     "text_config.hc_shifted", "shifted mHC");
  expect_field_error(edit(a, R"("rms_norm_eps":1e-20)", R"("rms_norm_eps":0)"),
                     "text_config.rms_norm_eps");
  expect_field_error(edit(a, R"("num_key_value_heads":1)", R"("num_key_value_heads":2)"),
                     "text_config.num_key_value_heads");
  expect_field_error(edit(a, R"("sliding_window":8)", R"("sliding_window":"8")"),
                     "text_config.sliding_window");
  expect_field_error(edit(a, R"("type":"yarn")", R"("type":"linear")"),
                     "text_config.rope_scaling.type");
  expect_field_error(edit(a, R"("dtype":"bfloat16")", R"("dtype":"float16")"), "dtype");
  // A YOCO boundary whose window does not fit the keep tokens.
  try {
    V41TextConfig::from_json_text(a, "config.json", 4);
    ADD_FAILURE() << "keep 4 < window 8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'text_config.sliding_window'"), std::string::npos);
  }
}

TEST(V41Config, QuantizationMustBeB3s) {
  const std::string a = one_line(kTinyA);
  expect_field_error(edit(a, "[32,32]", "[128,128]"), "quantization_config.weight_block_size");
  expect_field_error(edit(a, R"("expert_dtype":"fp4")", R"("expert_dtype":"fp8")"),
                     "quantization_config.expert_dtype");
  expect_field_error(edit(a, R"("quant_method":"fp8")", R"("quant_method":"awq")"),
                     "quantization_config.quant_method");
  expect_field_error(edit(a,
                          R"(,"quantization_config":{"quant_method":"fp8","expert_dtype":"fp4",)"
                          R"("activation_scheme":"dynamic","weight_block_size":[32,32],)"
                          R"("scale_fmt":"ue8m0"})",
                          ""),
                     "quantization_config", "required");
  expect_field_error(edit(a, R"("text_config":{)", R"("text_config":7,"x":{)"), "text_config");
}

TEST(V41Config, ModelConfigReadsV41ThroughV41TextConfig) {
  const ModelConfig c = ModelConfig::from_json_text(kFlash, "config.json");
  ASSERT_NE(c.v41, nullptr);
  EXPECT_EQ(c.v41->kv_source_layer_ids, (std::vector<int>{2, 8, 14, 20}));
  // The shared view: widths, MoE, norms and quantization as the V4.1 config gives them.
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.quantization.weight_block_rows, 32);
  EXPECT_TRUE(c.quantization.experts_fp4);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);  // the DSpark blocks are not run
  // Layer kinds carry each layer's ratio (0, C2, C1) for the batch plan.
  EXPECT_EQ(c.compress_rate(0), 0);
  EXPECT_EQ(c.compress_rate(2), 2);
  EXPECT_EQ(c.compress_rate(20), 1);
  EXPECT_EQ(c.compress_rate(39), 1);
}

}  // namespace
}  // namespace deepinfer
