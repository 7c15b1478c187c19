// ModelConfig parsing: the saved-by-transformers form, the released (legacy key) form, defaults,
// and one clear error per bad field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "deepinfer/config.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

// The shape of a config.json written by transformers 5.23's save_pretrained (trimmed).
const char* kSavedConfig = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
  "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25, "qk_rope_head_dim": 8,
  "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
  "index_n_heads": 16, "index_head_dim": 32, "index_topk": 3,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
  "layer_types": ["sliding_attention", "sliding_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention"],
  "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
  "rope_parameters": {
    "compress": {"attention_factor": 1.0, "beta_fast": 32, "beta_slow": 1, "factor": 4.0,
                 "original_max_position_embeddings": 32, "partial_rotary_factor": 0.25,
                 "rope_theta": 160000.0, "rope_type": "yarn"},
    "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}},
  "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "dtype": "float32",
  "eos_token_id": 1, "bos_token_id": 0, "rms_norm_eps": 1e-06, "hc_eps": 1e-06
})";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

// Runs `fn` expecting a deepinfer::Error of `code` whose message contains every fragment.
template <typename Fn>
void expect_error(Fn fn, ErrorCode code, std::initializer_list<const char*> fragments) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, ReadsTransformersSavedConfig) {
  ModelConfig c = ModelConfig::from_json_text(kSavedConfig, "tiny/config.json");
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.rope_head_dim, 8);
  EXPECT_EQ(c.csa_compress_rate, 4);
  EXPECT_EQ(c.hca_compress_rate, 8);
  EXPECT_EQ(c.layer_types[2], AttentionKind::kCompressedSparse);
  EXPECT_EQ(c.layer_types[3], AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c.mlp_layer_types[1], MlpKind::kHashMoe);
  EXPECT_EQ(c.mlp_layer_types[2], MlpKind::kMoe);
  EXPECT_FALSE(c.main_rope.yarn);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.theta, 160000.0);
  EXPECT_EQ(c.compress_rope.original_max_position_embeddings, 32);
  EXPECT_EQ(c.compress_rate(0), 0);
  EXPECT_EQ(c.compress_rate(3), 8);
}

TEST(ModelConfig, ReadsReleasedLegacyKeys) {
  // The released V4-Flash config: compress_ratios (with the MTP entry), num_hash_layers,
  // qk_rope_head_dim and a flat rope_scaling for the compress rope.
  const char* text = R"({"model_type": "deepseek_v4", "num_hidden_layers": 4,
    "compress_ratios": [0, 4, 128, 4, 0], "num_hash_layers": 1, "qk_rope_head_dim": 64,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1}, "eos_token_id": [1, 2]})";
  ModelConfig c = ModelConfig::from_json_text(text, "flash/config.json");
  ASSERT_EQ(c.layer_types.size(), 4u);
  EXPECT_EQ(c.layer_types[0], AttentionKind::kSliding);
  EXPECT_EQ(c.layer_types[1], AttentionKind::kCompressedSparse);
  EXPECT_EQ(c.layer_types[2], AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c.mlp_layer_types[0], MlpKind::kHashMoe);
  EXPECT_EQ(c.mlp_layer_types[1], MlpKind::kMoe);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.theta, 160000.0);
  EXPECT_DOUBLE_EQ(c.main_rope.theta, 10000.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 2}));
  // The entry past num_hidden_layers is the MTP block's (docs/model.md#mtp-block).
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  ASSERT_EQ(c.mtp_layer_types.size(), 1u);
  EXPECT_EQ(c.mtp_layer_types[0], AttentionKind::kSliding);
  EXPECT_EQ(c.attention_kind(4), AttentionKind::kSliding);
  EXPECT_EQ(c.compress_rate(4), 0);
}

TEST(ModelConfig, MtpBlockKindComesFromTheExtraCompressRatio) {
  ModelConfig csa = ModelConfig::from_json_text(
      R"({"model_type": "deepseek_v4", "num_hidden_layers": 2, "compress_ratios": [0, 0, 4]})",
      "x");
  ASSERT_EQ(csa.mtp_layer_types.size(), 1u);
  EXPECT_EQ(csa.attention_kind(2), AttentionKind::kCompressedSparse);
  EXPECT_EQ(csa.compress_rate(2), 4);
  EXPECT_TRUE(csa.has_compressed_layers());  // the MTP block's entries need blocks

  // Without the entry (or with layer_types) the block is sliding, as V4-Flash ships it.
  ModelConfig plain = ModelConfig::from_json_text(
      R"({"model_type": "deepseek_v4", "num_hidden_layers": 2, "compress_ratios": [0, 0],
          "num_nextn_predict_layers": 2})",
      "x");
  EXPECT_EQ(plain.mtp_layer_types,
            (std::vector<AttentionKind>{AttentionKind::kSliding, AttentionKind::kSliding}));
  EXPECT_FALSE(plain.has_compressed_layers());

  expect_error(
      [] {
        ModelConfig::from_json_text(
            R"({"model_type": "deepseek_v4", "num_hidden_layers": 2, "compress_ratios": [0, 0, 5]})",
            "ckpt/config.json");
      },
      ErrorCode::kInvalidConfig, {"ckpt/config.json", "compress_ratios[2]", "5"});
}

TEST(ModelConfig, DefaultLayerTypesAreTheV4ProPattern) {
  ModelConfig c =
      ModelConfig::from_json_text(R"({"model_type": "deepseek_v4", "num_hidden_layers": 5})", "x");
  ASSERT_EQ(c.layer_types.size(), 5u);
  EXPECT_EQ(c.layer_types[0], AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c.layer_types[1], AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c.layer_types[2], AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c.layer_types[3], AttentionKind::kCompressedSparse);
  EXPECT_EQ(c.layer_types[4], AttentionKind::kHeavilyCompressed);
}

TEST(ModelConfig, WrongFieldTypeNamesFileAndField) {
  std::string bad = replace(kSavedConfig, "\"hidden_size\": 64", "\"hidden_size\": \"64\"");
  expect_error([&] { ModelConfig::from_json_text(bad, "ckpt/config.json"); },
               ErrorCode::kInvalidConfig, {"ckpt/config.json", "'hidden_size'", "\"64\""});
}

TEST(ModelConfig, InconsistentValuesAreRejected) {
  expect_error(
      [&] {
        ModelConfig::from_json_text(
            replace(kSavedConfig, "\"num_hidden_layers\": 6", "\"num_hidden_layers\": 5"), "c");
      },
      ErrorCode::kInvalidConfig, {"'layer_types'", "num_hidden_layers is 5"});
  expect_error(
      [&] {
        ModelConfig::from_json_text(replace(kSavedConfig, "\"o_groups\": 2", "\"o_groups\": 3"),
                                    "c");
      },
      ErrorCode::kInvalidConfig, {"o_groups"});
  expect_error(
      [&] {
        ModelConfig::from_json_text(replace(kSavedConfig, "\"heavily_compressed_attention\": 8",
                                            "\"heavily_compressed_attention\": 96"),
                                    "c");
      },
      ErrorCode::kInvalidConfig, {"divide the 128-token KV block", "96"});
  expect_error(
      [&] {
        ModelConfig::from_json_text(
            replace(kSavedConfig, "\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 16"), "c");
      },
      ErrorCode::kInvalidConfig, {"qk_rope_head_dim", "disagrees"});
  expect_error(
      [&] {
        ModelConfig::from_json_text(
            replace(kSavedConfig, "\"sliding_attention\", \"sliding_attention\"",
                    "\"sliding_attention\", \"full_attention\""),
            "c");
      },
      ErrorCode::kInvalidConfig, {"layer_types[1]", "full_attention"});
}

TEST(ModelConfig, UnknownModelType) {
  expect_error([&] { ModelConfig::from_json_text(R"({"model_type": "llama"})", "c.json"); },
               ErrorCode::kInvalidConfig, {"c.json", "'model_type'", "deepseek_v4", "llama"});
  expect_error([&] { ModelConfig::from_json_text(R"({"hidden_size": 4})", "c.json"); },
               ErrorCode::kInvalidConfig, {"'model_type'"});
}

// config.json with `quant` spliced in at the top level.
ModelConfig quantized(const std::string& quant) {
  return ModelConfig::from_json_text(R"({"model_type": "deepseek_v4", )" + quant + "}", "c.json");
}

TEST(ModelConfig, ReadsDeepSeekQuantizationConfig) {
  EXPECT_FALSE(ModelConfig::from_json_text(kSavedConfig, "c").quantization.fp8);
  // DeepSeek-V4-Flash's config.json: expert_dtype at the top level.
  QuantConfig q = quantized(
                      R"("quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
      "scale_fmt": "ue8m0", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
      "expert_dtype": "fp4")")
                      .quantization;
  EXPECT_TRUE(q.fp8);
  EXPECT_TRUE(q.experts_fp4);
  EXPECT_TRUE(q.ue8m0_scales);
  EXPECT_EQ(q.weight_block_rows, 128);
  EXPECT_EQ(q.weight_block_cols, 128);
  // transformers' spelling moves expert_dtype inside; V4.1 uses 32x32 blocks; V3-style has no
  // expert_dtype (FP8 experts) and float scales.
  q = quantized(R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32],
      "scale_fmt": "ue8m0", "expert_dtype": "fp4"})")
          .quantization;
  EXPECT_TRUE(q.experts_fp4);
  EXPECT_EQ(q.weight_block_rows, 32);
  q = quantized(R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 16]})")
          .quantization;
  EXPECT_FALSE(q.experts_fp4);
  EXPECT_FALSE(q.ue8m0_scales);
  EXPECT_EQ(q.weight_block_rows, 64);
  EXPECT_EQ(q.weight_block_cols, 16);
}

TEST(ModelConfig, QuantizationConfigErrorsNameTheField) {
  expect_error([] { quantized(R"("quantization_config": {"quant_method": "awq"})"); },
               ErrorCode::kUnsupported,
               {"c.json", "quantization_config.quant_method", "awq", "fp8"});
  expect_error([] { quantized(R"("quantization_config": {"bits": 4})"); }, ErrorCode::kUnsupported,
               {"quantization_config.quant_method", "missing"});
  expect_error(
      [] {
        quantized(
            R"("quantization_config": {"quant_method": "fp8", "weight_block_size": [96, 128]})");
      },
      ErrorCode::kInvalidConfig, {"quantization_config.weight_block_size", "powers of two"});
  expect_error(
      [] {
        quantized(R"("quantization_config": {"quant_method": "fp8", "weight_block_size": 128})");
      },
      ErrorCode::kInvalidConfig, {"quantization_config.weight_block_size"});
  expect_error(
      [] { quantized(R"("quantization_config": {"quant_method": "fp8", "fmt": "e5m2"})"); },
      ErrorCode::kInvalidConfig, {"quantization_config.fmt", "e5m2"});
  expect_error(
      [] { quantized(R"("quantization_config": {"quant_method": "fp8", "scale_fmt": "e4m3"})"); },
      ErrorCode::kInvalidConfig, {"quantization_config.scale_fmt"});
  expect_error(
      [] {
        quantized(
            R"("quantization_config": {"quant_method": "fp8", "activation_scheme": "static"})");
      },
      ErrorCode::kUnsupported, {"quantization_config.activation_scheme", "static"});
  expect_error(
      [] {
        quantized(R"("quantization_config": {"quant_method": "fp8"}, "expert_dtype": "int4")");
      },
      ErrorCode::kInvalidConfig, {"'expert_dtype'", "int4"});
  expect_error(
      [] {
        quantized(R"("quantization_config": {"quant_method": "fp8", "expert_dtype": "fp8"},
                     "expert_dtype": "fp4")");
      },
      ErrorCode::kInvalidConfig, {"quantization_config.expert_dtype", "top-level"});
  expect_error([] { quantized(R"("expert_dtype": "fp4")"); }, ErrorCode::kInvalidConfig,
               {"'expert_dtype'", "no quantization_config"});
  expect_error([] { quantized(R"("quantization_config": "fp8")"); }, ErrorCode::kInvalidConfig,
               {"'quantization_config'", "an object"});
}

TEST(ModelConfig, BadJsonNamesTheFile) {
  expect_error([&] { ModelConfig::from_json_text("{\"model_type\": ", "broken/config.json"); },
               ErrorCode::kCorruptFile, {"broken/config.json"});
  expect_error([&] { ModelConfig::from_file("/nonexistent/config.json"); }, ErrorCode::kNotFound,
               {"/nonexistent/config.json"});
}

TEST(ModelConfig, RopeInverseFrequencies) {
  ModelConfig c = ModelConfig::from_json_text(kSavedConfig, "c");
  std::vector<float> main = c.rope_inv_freq(c.main_rope);
  ASSERT_EQ(main.size(), 4u);  // R = 8 -> 4 pairs
  for (size_t i = 0; i < main.size(); ++i) {
    EXPECT_NEAR(main[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0), 1e-6);
  }
  // YaRN with original 32 positions, beta 32/1, R = 8, theta 1.6e5: the correction range is
  // [floor(low), ceil(high)] clamped to [0, R-1]; dims below low extrapolate, above high
  // interpolate (divided by the factor).
  std::vector<float> comp = c.rope_inv_freq(c.compress_rope);
  auto dim_for = [](double rotations) {
    return 8.0 * std::log(32.0 / (rotations * 2.0 * 3.141592653589793)) /
           (2.0 * std::log(160000.0));
  };
  double low = std::max(std::floor(dim_for(32.0)), 0.0);
  double high = std::min(std::ceil(dim_for(1.0)), 7.0);
  if (low == high) high += 0.001;
  for (size_t i = 0; i < comp.size(); ++i) {
    double base = std::pow(160000.0, -2.0 * static_cast<double>(i) / 8.0);
    double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    double want = base / 4.0 * ramp + base * (1.0 - ramp);
    EXPECT_NEAR(comp[i], want, 1e-6 * std::max(1.0, want)) << i;
  }
}

}  // namespace
}  // namespace deepinfer
