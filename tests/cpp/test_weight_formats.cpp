// DeepSeek's low-precision formats on the host: the e4m3 / e8m0 / e2m1 scalar codecs,
// dequantize_weight (block-scaled FP8 with ragged edge blocks, MXFP4 nibble order), the dynamic
// activation quantization every backend reproduces, and the op checks of a MatrixWeight.
// docs/model.md#quantized-checkpoints has the conventions and their sources.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "deepinfer/weight.h"
#include "error_message.h"
#include "model/weights.h"

namespace deepinfer {
namespace {

using testing::error_message;

// A host tensor of `dtype` (one byte per element) holding `bytes`.
Tensor byte_tensor(const std::vector<uint8_t>& bytes, const Shape& shape, DType dtype) {
  Tensor t = Tensor::zeros(shape, dtype);
  std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

TEST(WeightFormats, RoundToE4m3MatchesTheCodec) {
  // Every value between two neighbouring codes (and the midpoints: ties to even) rounds like the
  // exhaustive scan of f32_to_f8e4m3.
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = f8e4m3_to_f32(static_cast<uint8_t>(code));
    const float hi = f8e4m3_to_f32(static_cast<uint8_t>(code + 1));
    for (float t : {0.0f, 0.25f, 0.5f, 0.75f, 1.0f}) {
      const float v = lo + (hi - lo) * t;
      EXPECT_EQ(round_to_f8e4m3(v), f8e4m3_to_f32(f32_to_f8e4m3(v))) << v;
      EXPECT_EQ(round_to_f8e4m3(-v), f8e4m3_to_f32(f32_to_f8e4m3(-v))) << -v;
    }
  }
  EXPECT_EQ(round_to_f8e4m3(1000.0f), 448.0f);  // saturates
  EXPECT_EQ(round_to_f8e4m3(-460.0f), -448.0f);
  EXPECT_EQ(round_to_f8e4m3(0x1p-10f), 0.0f);  // half the smallest subnormal: ties to even 0
  EXPECT_EQ(round_to_f8e4m3(0x1.8p-10f), 0x1p-9f);
}

TEST(WeightFormats, E8m0AndE2m1) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(125), 0.25f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  uint8_t bits = 0;
  EXPECT_TRUE(f32_to_e8m0_exact(0.25f, &bits));
  EXPECT_EQ(bits, 125);
  EXPECT_TRUE(f32_to_e8m0_exact(std::ldexp(1.0f, -127), &bits));
  EXPECT_EQ(bits, 0);
  EXPECT_FALSE(f32_to_e8m0_exact(0.3f, &bits));
  EXPECT_FALSE(f32_to_e8m0_exact(-0.25f, &bits));
  EXPECT_FALSE(f32_to_e8m0_exact(0.0f, &bits));
  EXPECT_FALSE(f32_to_e8m0_exact(INFINITY, &bits));
  const float table[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(c), table[c]);
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 8u)), -table[c]);  // bit 3 is the sign
  }
  float f = 0.0f;
  convert_elements(&bits, DType::kE8M0, &f, DType::kF32, 1);  // bits = 0: 2^-127
  EXPECT_EQ(f, std::ldexp(1.0f, -127));
}

TEST(WeightFormats, SafetensorsNames) {
  DType d = DType::kF32;
  ASSERT_TRUE(dtype_from_safetensors("F8_E8M0", &d));
  EXPECT_EQ(d, DType::kE8M0);
  ASSERT_TRUE(dtype_from_safetensors("I8", &d));
  EXPECT_EQ(d, DType::kI8);
  ASSERT_TRUE(dtype_from_safetensors("U8", &d));
  EXPECT_EQ(d, DType::kU8);
  EXPECT_EQ(dtype_size(DType::kE2M1x2), 1u);
  EXPECT_STREQ(dtype_name(DType::kE2M1x2), "e2m1x2");
  EXPECT_FALSE(is_floating(DType::kE8M0));
}

TEST(WeightFormats, DequantizeMxfp4NibbleOrderAndScale) {
  // Byte j holds inputs 2j (low nibble) and 2j+1 (high nibble): 0xE4 is code 4 (+2.0) then code
  // 0xE (-4.0); with scale 2^-3 the row starts 0.25, -0.5.
  MatrixWeight w;
  w.format = WeightFormat::kMxfp4;
  w.block_rows = 1;
  w.block_cols = 32;
  std::vector<uint8_t> bytes(2 * 16, 0);
  bytes[0] = 0xE4;
  bytes[16] = 0x71;  // row 1: +0.5 then +6.0, scale 2^1
  w.values = byte_tensor(bytes, {2, 16}, DType::kE2M1x2);
  w.scales = byte_tensor({124, 128}, {2, 1}, DType::kE8M0);
  ASSERT_EQ(w.cols(), 32);
  Tensor d = dequantize_weight(w, DType::kF32);
  ASSERT_EQ(d.shape(), (Shape{2, 32}));
  EXPECT_EQ(d.data<float>()[0], 0.25f);
  EXPECT_EQ(d.data<float>()[1], -0.5f);
  EXPECT_EQ(d.data<float>()[2], 0.0f);
  EXPECT_EQ(d.data<float>()[32], 1.0f);
  EXPECT_EQ(d.data<float>()[33], 12.0f);
}

TEST(WeightFormats, DequantizeFp8BlocksWithRaggedEdges) {
  // [3, 5] in 2x4 blocks: scale grid [2, 2]; the last row and column use their partial block's
  // scale.
  MatrixWeight w;
  w.format = WeightFormat::kFp8Block;
  w.block_rows = 2;
  w.block_cols = 4;
  std::vector<uint8_t> codes(15, f32_to_f8e4m3(1.5f));
  w.values = byte_tensor(codes, {3, 5}, DType::kF8E4M3);
  w.scales = Tensor::from_vector(std::vector<float>{1.0f, 2.0f, 4.0f, 8.0f}, {2, 2});
  EXPECT_EQ(weight_scale_shape(3, 5, 2, 4), (Shape{2, 2}));
  Tensor d = dequantize_weight(w, DType::kBF16).to(DType::kF32);
  const float expected[3][5] = {{1.5f, 1.5f, 1.5f, 1.5f, 3.0f},
                                {1.5f, 1.5f, 1.5f, 1.5f, 3.0f},
                                {6.0f, 6.0f, 6.0f, 6.0f, 12.0f}};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 5; ++c) EXPECT_EQ(d.data<float>()[r * 5 + c], expected[r][c]) << r << c;
  }
}

TEST(WeightFormats, ActivationQuantizationFollowsDeepGemmFormula) {
  // Group of 4: amax 3.5 -> scale 2^ceil(log2(3.5 / 448)) = 2^-7; x / scale in e4m3 (3 mantissa
  // bits): 3.5 * 128 = 448 exact, 0.3 * 128 = 38.4 -> 40 (spacing 4 in [32, 64)).
  std::vector<float> x = {3.5f, 0.3f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1e-3f};
  std::vector<float> out(x.size());
  quantize_activation_rows(x.data(), out.data(), 1, 9, 4);
  EXPECT_EQ(out[0], 3.5f);
  EXPECT_EQ(out[1], 40.0f / 128.0f);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[4], 0.0f);  // an all-zero group stays zero (amax clamped to 1e-4)
  // The tail group [1e-3] alone: scale 2^ceil(log2(1e-3 / 448)) = 2^-18; 1e-3 * 2^18 = 262.1
  // -> 256 (spacing 32 in [256, 448]).
  EXPECT_EQ(out[8], 256.0f * std::ldexp(1.0f, -18));
  // In place gives the same.
  quantize_activation_rows(x.data(), x.data(), 1, 9, 4);
  EXPECT_EQ(x, out);
}

TEST(WeightFormats, CpuBackendRunsQuantizedWeightsExactly) {
  auto be = make_cpu_backend(1);
  MatrixWeight w;
  w.format = WeightFormat::kFp8Block;
  w.block_rows = 1;
  w.block_cols = 2;
  std::vector<uint8_t> codes = {f32_to_f8e4m3(1.0f), f32_to_f8e4m3(-2.0f), f32_to_f8e4m3(0.5f),
                                f32_to_f8e4m3(3.0f)};
  w.values = byte_tensor(codes, {2, 2}, DType::kF8E4M3);
  w.scales = Tensor::from_vector(std::vector<float>{0.5f, 4.0f}, {2, 1});
  const MatrixWeight up = be->upload_matrix_weight(w);
  EXPECT_FALSE(up.quantized());  // the reference keeps exact f32 values
  Tensor x = be->upload(Tensor::from_vector(std::vector<float>{1.0f, 0.3f}, {1, 2}), DType::kF32);
  Tensor y = be->to_host(be->linear(x, up));
  EXPECT_FLOAT_EQ(y.data<float>()[0], 0.5f * (1.0f - 0.6f));
  EXPECT_FLOAT_EQ(y.data<float>()[1], 4.0f * (0.5f + 0.9f));
  // With activation quantization (group 2): 0.3 -> 0.3 / 2^-8 = 76.8 -> 80 (spacing 8).
  w.act_group = 2;
  y = be->to_host(be->linear(x, be->upload_matrix_weight(w)));
  const float xq = 80.0f / 256.0f;
  EXPECT_FLOAT_EQ(y.data<float>()[0], 0.5f * (1.0f - 2.0f * xq));
  Tensor q = be->to_host(be->quantize_activations(x, 2));
  EXPECT_EQ(q.data<float>()[1], xq);
}

TEST(WeightFormats, OpChecksNameTheBadPart) {
  auto be = make_cpu_backend(1);
  MatrixWeight w;
  w.format = WeightFormat::kFp8Block;
  w.block_rows = 2;
  w.block_cols = 2;
  w.values = byte_tensor(std::vector<uint8_t>(12, 0x38), {3, 4}, DType::kF8E4M3);
  w.scales = Tensor::from_vector(std::vector<float>(2, 1.0f), {1, 2});  // needs [2, 2]
  std::string m = error_message([&] { be->upload_matrix_weight(w); });
  EXPECT_NE(m.find("host.scales"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[2, 2]"), std::string::npos) << m;
  w.scales = Tensor::from_vector(std::vector<float>(4, 1.0f), {2, 2});
  w.values = Tensor::from_vector(std::vector<float>(12, 1.0f), {3, 4});
  m = error_message([&] { be->upload_matrix_weight(w); });
  EXPECT_NE(m.find("host.values"), std::string::npos) << m;
  EXPECT_NE(m.find("f8_e4m3"), std::string::npos) << m;
  const MatrixWeight dense(
      be->upload(Tensor::from_vector(std::vector<float>(12), {3, 4}), DType::kF32));
  Tensor x = be->upload(Tensor::from_vector(std::vector<float>(3), {1, 3}), DType::kF32);
  m = error_message([&] { be->linear(x, dense); });
  EXPECT_NE(m.find("linear: argument w"), std::string::npos) << m;
  m = error_message([&] { be->quantize_activations(x, 0); });
  EXPECT_NE(m.find("group must be positive"), std::string::npos) << m;
}

TEST(WeightFormats, RandomWeightsFollowTheQuantizationConfig) {
  // Benchmarks draw random weights in the checkpoint's formats: every GEMM weight DeepSeek
  // quantizes (routed experts one per expert, in MXFP4) carries its activation group.
  const ModelConfig c = ModelConfig::from_json_text(
      R"({"model_type": "deepseek_v4", "vocab_size": 64, "hidden_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 32,
          "partial_rotary_factor": 0.25, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
          "sliding_window": 8, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 4,
          "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "layer_types": ["sliding_attention", "compressed_sparse_attention"],
          "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
          "mlp_layer_types": ["hash_moe", "moe"],
          "quantization_config": {"quant_method": "fp8", "scale_fmt": "ue8m0",
                                  "weight_block_size": [16, 16]},
          "expert_dtype": "fp4"})",
      "c.json");
  auto be = make_cpu_backend(1);
  WeightLoadOptions options;
  options.quantize_activations = true;
  const ModelWeights w = random_model_weights(c, *be, 3, DType::kBF16, options);
  for (const LayerWeights& layer : w.layers) {
    EXPECT_EQ(layer.attn.wq_a.act_group, 16);
    EXPECT_EQ(layer.attn.wo_b.act_group, 16);
    EXPECT_EQ(layer.ffn.shared_w2.act_group, 16);
    ASSERT_EQ(layer.ffn.experts.w1.size(), 4u);
    for (const MatrixWeight& e : layer.ffn.experts.w2) EXPECT_EQ(e.act_group, 32);
  }
  EXPECT_EQ(w.layers[1].attn.indexer.wq_b.act_group, 16);
  // The CPU reference keeps the exact values; they are finite and not all zero.
  const Tensor v = be->to_host(w.layers[1].ffn.experts.w1[2].values);
  double sum = 0.0;
  for (int64_t i = 0; i < v.numel(); ++i) sum += std::fabs(v.data<float>()[i]);
  EXPECT_TRUE(std::isfinite(sum));
  EXPECT_GT(sum, 0.0);
}

}  // namespace
}  // namespace deepinfer
