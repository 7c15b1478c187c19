#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/checkpoint.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

Tensor scalar_f32(float v) {
  return Tensor::from_vector(std::vector<float>{v}, {1});
}

struct NameCase {
  const char* input;
  const char* canonical;
};

// transformers 5.23 save_pretrained (hybrid), transformers in-memory, and released names.
constexpr NameCase kNames[] = {
    // Hybrid names written by save_pretrained.
    {"head.weight", "head.weight"},
    {"model.embed_tokens.weight", "embed.weight"},
    {"model.norm.weight", "norm.weight"},
    {"model.hc_head.hc_fn", "hc_head_fn"},
    {"model.hc_head.hc_base", "hc_head_base"},
    {"model.hc_head.hc_scale", "hc_head_scale"},
    {"model.layers.0.attn.wq_a.weight", "layers.0.attn.wq_a.weight"},
    {"model.layers.0.attn.norm.weight", "layers.0.attn.kv_norm.weight"},
    {"model.layers.0.attn.q_norm.weight", "layers.0.attn.q_norm.weight"},
    {"model.layers.0.attn.attn_sink", "layers.0.attn.attn_sink"},
    {"model.layers.0.attn_norm.weight", "layers.0.attn_norm.weight"},
    {"model.layers.0.ffn_norm.weight", "layers.0.ffn_norm.weight"},
    {"model.layers.0.hc_attn_fn", "layers.0.hc_attn_fn"},
    {"model.layers.2.attn.compressor.ape", "layers.2.attn.compressor.ape"},
    {"model.layers.2.attn.compressor.norm.weight", "layers.2.attn.compressor.norm.weight"},
    {"model.layers.2.attn.compressor.wgate.weight", "layers.2.attn.compressor.wgate.weight"},
    {"model.layers.2.attn.compressor.wkv.weight", "layers.2.attn.compressor.wkv.weight"},
    {"model.layers.2.attn.indexer.compressor.ape", "layers.2.attn.indexer.compressor.ape"},
    {"model.layers.2.attn.indexer.compressor.norm.weight",
     "layers.2.attn.indexer.compressor.norm.weight"},
    {"model.layers.2.attn.indexer.compressor.wgate.weight",
     "layers.2.attn.indexer.compressor.wgate.weight"},
    {"model.layers.2.attn.indexer.compressor.wkv.weight",
     "layers.2.attn.indexer.compressor.wkv.weight"},
    {"model.layers.2.attn.indexer.weights_proj.weight",
     "layers.2.attn.indexer.weights_proj.weight"},
    {"model.layers.2.attn.indexer.wq_b.weight", "layers.2.attn.indexer.wq_b.weight"},
    {"model.layers.0.ffn.experts.0.w1.weight", "layers.0.ffn.experts.0.w1.weight"},
    {"model.layers.0.ffn.gate.weight", "layers.0.ffn.gate.weight"},
    {"model.layers.0.ffn.gate.tid2eid", "layers.0.ffn.gate.tid2eid"},
    {"model.layers.0.ffn.gate.bias", "layers.0.ffn.gate.bias"},
    {"model.layers.0.ffn.shared_experts.w1.weight", "layers.0.ffn.shared_experts.w1.weight"},
    // Released checkpoint names are already canonical.
    {"embed.weight", "embed.weight"},
    {"hc_head_fn", "hc_head_fn"},
    {"layers.0.attn.kv_norm.weight", "layers.0.attn.kv_norm.weight"},
    {"layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.scale"},
    {"layers.41.ffn.experts.255.w2.weight", "layers.41.ffn.experts.255.w2.weight"},
    {"layers.2.attn.compressor.norm.weight", "layers.2.attn.compressor.norm.weight"},
    {"mtp.0.attn.kv_norm.weight", "mtp.0.attn.kv_norm.weight"},
    {"model.mtp.0.ffn.gate.bias", "mtp.0.ffn.gate.bias"},
    {"mtp.0.e_proj.scale", "mtp.0.e_proj.scale"},
    {"mtp.0.e_proj.weight_scale_inv", "mtp.0.e_proj.scale"},
    {"mtp.0.attn.norm.weight", "mtp.0.attn.norm.weight"},  // no transformers rules under mtp
    // transformers in-memory names.
    {"model.layers.0.self_attn.q_a_proj.weight", "layers.0.attn.wq_a.weight"},
    {"model.layers.0.self_attn.q_b_proj.weight", "layers.0.attn.wq_b.weight"},
    {"model.layers.0.self_attn.kv_proj.weight", "layers.0.attn.wkv.weight"},
    {"model.layers.0.self_attn.o_a_proj.weight", "layers.0.attn.wo_a.weight"},
    {"model.layers.0.self_attn.o_b_proj.weight", "layers.0.attn.wo_b.weight"},
    {"model.layers.0.self_attn.q_a_norm.weight", "layers.0.attn.q_norm.weight"},
    {"model.layers.0.self_attn.kv_norm.weight", "layers.0.attn.kv_norm.weight"},
    {"model.layers.0.self_attn.sinks", "layers.0.attn.attn_sink"},
    {"model.layers.2.self_attn.compressor.kv_proj.weight", "layers.2.attn.compressor.wkv.weight"},
    {"model.layers.2.self_attn.compressor.gate_proj.weight",
     "layers.2.attn.compressor.wgate.weight"},
    {"model.layers.2.self_attn.compressor.kv_norm.weight", "layers.2.attn.compressor.norm.weight"},
    {"model.layers.2.self_attn.compressor.position_bias", "layers.2.attn.compressor.ape"},
    {"model.layers.2.self_attn.compressor.indexer.kv_proj.weight",
     "layers.2.attn.indexer.compressor.wkv.weight"},
    {"model.layers.2.self_attn.compressor.indexer.gate_proj.weight",
     "layers.2.attn.indexer.compressor.wgate.weight"},
    {"model.layers.2.self_attn.compressor.indexer.kv_norm.weight",
     "layers.2.attn.indexer.compressor.norm.weight"},
    {"model.layers.2.self_attn.compressor.indexer.position_bias",
     "layers.2.attn.indexer.compressor.ape"},
    {"model.layers.2.self_attn.compressor.indexer.q_b_proj.weight",
     "layers.2.attn.indexer.wq_b.weight"},
    {"model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight",
     "layers.2.attn.indexer.weights_proj.weight"},
    {"model.layers.0.mlp.experts.gate_up_proj", "layers.0.ffn.experts.gate_up_proj"},
    {"model.layers.0.mlp.experts.down_proj", "layers.0.ffn.experts.down_proj"},
    {"model.layers.0.mlp.shared_experts.gate_proj.weight", "layers.0.ffn.shared_experts.w1.weight"},
    {"model.layers.0.mlp.shared_experts.up_proj.weight", "layers.0.ffn.shared_experts.w3.weight"},
    {"model.layers.0.mlp.shared_experts.down_proj.weight", "layers.0.ffn.shared_experts.w2.weight"},
    {"model.layers.0.mlp.gate.weight", "layers.0.ffn.gate.weight"},
    {"model.layers.0.mlp.gate.tid2eid", "layers.0.ffn.gate.tid2eid"},
    {"model.layers.0.mlp.gate.e_score_correction_bias", "layers.0.ffn.gate.bias"},
    {"model.layers.0.input_layernorm.weight", "layers.0.attn_norm.weight"},
    {"model.layers.0.post_attention_layernorm.weight", "layers.0.ffn_norm.weight"},
    {"model.layers.0.attn_hc.fn", "layers.0.hc_attn_fn"},
    {"model.layers.0.attn_hc.base", "layers.0.hc_attn_base"},
    {"model.layers.0.attn_hc.scale", "layers.0.hc_attn_scale"},
    {"model.layers.0.ffn_hc.fn", "layers.0.hc_ffn_fn"},
    {"model.layers.0.ffn_hc.base", "layers.0.hc_ffn_base"},
    {"model.layers.0.ffn_hc.scale", "layers.0.hc_ffn_scale"},
    {"model.layers.0.self_attn.q_a_proj.weight_scale_inv", "layers.0.attn.wq_a.scale"},
    {"model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv",
     "layers.1.ffn.shared_experts.w2.scale"},
    {"lm_head.weight", "head.weight"},
    {"model.embed_tokens.weight", "embed.weight"},
    // Names that look like a rule but are not it.
    {"layers.0.attn.norm.bias", "layers.0.attn.norm.bias"},
    {"layers.0.attn.norm", "layers.0.attn.norm"},
    {"layers.0.ffn.experts.3.gate_proj.weight", "layers.0.ffn.experts.3.gate_proj.weight"},
    {"something.unknown", "something.unknown"},
    {"model.x", "x"},
    {"modelx.weight", "modelx.weight"},
};

TEST(CanonicalTensorName, Table) {
  for (const NameCase& c : kNames) {
    EXPECT_EQ(canonical_tensor_name(c.input), c.canonical) << c.input;
  }
}

TEST(CanonicalTensorName, IsIdempotent) {
  for (const NameCase& c : kNames) {
    EXPECT_EQ(canonical_tensor_name(c.canonical), c.canonical) << c.canonical;
  }
}

TEST(Checkpoint, SingleFileWithHybridNames) {
  TempDir dir;
  write_text(dir.file("config.json"), "{}");
  write_safetensors(dir.file("model.safetensors"),
                    {{"model.layers.0.attn.norm.weight", scalar_f32(1.5f)},
                     {"model.embed_tokens.weight", scalar_f32(2.0f)},
                     {"head.weight", scalar_f32(3.0f)},
                     {"model.layers.0.attn.compressor.norm.weight", scalar_f32(4.0f)}});
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.dir(), dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"embed.weight", "head.weight",
                                                    "layers.0.attn.compressor.norm.weight",
                                                    "layers.0.attn.kv_norm.weight"}));
  EXPECT_TRUE(ckpt.contains("layers.0.attn.kv_norm.weight"));
  EXPECT_FALSE(ckpt.contains("model.layers.0.attn.norm.weight"));
  EXPECT_EQ(ckpt.tensor("layers.0.attn.kv_norm.weight").item(0), 1.5);
  EXPECT_EQ(ckpt.tensor("layers.0.attn.compressor.norm.weight").item(0), 4.0);
  EXPECT_EQ(ckpt.entry("embed.weight").name, "model.embed_tokens.weight");
  EXPECT_EQ(ckpt.file_of("head.weight").path(), dir.file("model.safetensors"));

  try {
    ckpt.entry("model.embed_tokens.weight");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    std::string m = e.what();
    EXPECT_EQ(m.rfind(dir.path(), 0), 0u) << m;
    EXPECT_NE(m.find("'model.embed_tokens.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("'embed.weight'"), std::string::npos) << m;  // the hint
  }
  EXPECT_THROW(ckpt.tensor("layers.9.attn.kv_norm.weight"), Error);
  EXPECT_THROW(ckpt.file_of("nope"), Error);
}

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                    {{"model.embed_tokens.weight", scalar_f32(1.0f)},
                     {"model.layers.0.self_attn.sinks", scalar_f32(2.0f)}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                    {{"lm_head.weight", scalar_f32(3.0f)},
                     {"model.layers.0.mlp.gate.e_score_correction_bias", scalar_f32(4.0f)}});
  // A stray file next to the index must be ignored: the index decides.
  write_safetensors(dir.file("stray.safetensors"), {{"lm_head.weight", scalar_f32(9.0f)}});
  write_text(dir.file("model.safetensors.index.json"), R"({
    "metadata": {"total_size": 16},
    "weight_map": {
      "lm_head.weight": "model-00002-of-00002.safetensors",
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.layers.0.mlp.gate.e_score_correction_bias": "model-00002-of-00002.safetensors",
      "model.layers.0.self_attn.sinks": "model-00001-of-00002.safetensors"
    }
  })");
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(),
            (std::vector<std::string>{"embed.weight", "head.weight", "layers.0.attn.attn_sink",
                                      "layers.0.ffn.gate.bias"}));
  EXPECT_EQ(ckpt.tensor("head.weight").item(0), 3.0);
  EXPECT_EQ(ckpt.tensor("layers.0.ffn.gate.bias").item(0), 4.0);
  EXPECT_EQ(ckpt.tensor("layers.0.attn.attn_sink").item(0), 2.0);
  EXPECT_EQ(ckpt.file_of("embed.weight").path(), dir.file("model-00001-of-00002.safetensors"));
}

// Opens `dir` expecting Error(code); returns the message.
std::string open_error(const std::string& dir, ErrorCode code) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "opened without error: " << dir;
  return "";
}

TEST(Checkpoint, MissingShard) {
  TempDir dir;
  write_safetensors(dir.file("a.safetensors"), {{"embed.weight", scalar_f32(1.0f)}});
  write_text(
      dir.file("model.safetensors.index.json"),
      R"({"weight_map": {"embed.weight": "a.safetensors", "head.weight": "b.safetensors"}})");
  std::string m = open_error(dir.path(), ErrorCode::kNotFound);
  EXPECT_NE(m.find("'b.safetensors'"), std::string::npos) << m;
  EXPECT_NE(m.find("model.safetensors.index.json"), std::string::npos) << m;
}

TEST(Checkpoint, IndexNamesTensorItsShardLacks) {
  TempDir dir;
  write_safetensors(dir.file("a.safetensors"), {{"embed.weight", scalar_f32(1.0f)}});
  write_text(
      dir.file("model.safetensors.index.json"),
      R"({"weight_map": {"embed.weight": "a.safetensors", "head.weight": "a.safetensors"}})");
  std::string m = open_error(dir.path(), ErrorCode::kCorruptFile);
  EXPECT_NE(m.find("'head.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find(dir.file("a.safetensors")), std::string::npos) << m;
}

TEST(Checkpoint, BadIndex) {
  TempDir dir;
  write_safetensors(dir.file("a.safetensors"), {{"embed.weight", scalar_f32(1.0f)}});
  const char* bad[] = {
      "{",
      "[]",
      R"({"metadata": {}})",
      R"({"weight_map": []})",
      R"({"weight_map": {}})",
      R"({"weight_map": {"embed.weight": 3}})",
      R"({"weight_map": {"embed.weight": "/abs/a.safetensors"}})",
  };
  for (const char* text : bad) {
    write_text(dir.file("model.safetensors.index.json"), text);
    std::string m = open_error(dir.path(), ErrorCode::kCorruptFile);
    EXPECT_NE(m.find("model.safetensors.index.json"), std::string::npos) << text << ": " << m;
  }
}

TEST(Checkpoint, DuplicateCanonicalNameInOneFile) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"),
                    {{"head.weight", scalar_f32(1.0f)}, {"lm_head.weight", scalar_f32(2.0f)}});
  std::string m = open_error(dir.path(), ErrorCode::kCorruptFile);
  EXPECT_NE(m.find("'head.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("'lm_head.weight'"), std::string::npos) << m;
}

TEST(Checkpoint, DuplicateAcrossFilesNamesBothFiles) {
  TempDir dir;
  // No index and no model.safetensors: every *.safetensors file is read.
  write_safetensors(dir.file("part-a.safetensors"),
                    {{"layers.0.attn.kv_norm.weight", scalar_f32(1.0f)}});
  write_safetensors(dir.file("part-b.safetensors"),
                    {{"model.layers.0.attn.norm.weight", scalar_f32(2.0f)}});
  std::string m = open_error(dir.path(), ErrorCode::kCorruptFile);
  EXPECT_NE(m.find(dir.file("part-a.safetensors")), std::string::npos) << m;
  EXPECT_NE(m.find(dir.file("part-b.safetensors")), std::string::npos) << m;
  EXPECT_NE(m.find("'layers.0.attn.kv_norm.weight'"), std::string::npos) << m;
}

TEST(Checkpoint, GlobWhenNoIndexOrModelFile) {
  TempDir dir;
  write_safetensors(dir.file("b.safetensors"), {{"head.weight", scalar_f32(2.0f)}});
  write_safetensors(dir.file("a.safetensors"), {{"embed.weight", scalar_f32(1.0f)}});
  write_text(dir.file("notes.txt"), "not a tensor file");
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"embed.weight", "head.weight"}));
  EXPECT_EQ(ckpt.tensor("head.weight").item(0), 2.0);
}

TEST(Checkpoint, DirectoryErrors) {
  TempDir dir;
  std::string m = open_error(dir.file("absent"), ErrorCode::kNotFound);
  EXPECT_NE(m.find(dir.file("absent")), std::string::npos) << m;
  m = open_error(dir.path(), ErrorCode::kNotFound);  // empty directory
  EXPECT_NE(m.find("safetensors"), std::string::npos) << m;
  write_text(dir.file("file"), "x");
  open_error(dir.file("file"), ErrorCode::kInvalidArgument);
  // A corrupt shard reports its own path.
  write_text(dir.file("model.safetensors"), "garbage!");
  m = open_error(dir.path(), ErrorCode::kCorruptFile);
  EXPECT_EQ(m.rfind(dir.file("model.safetensors"), 0), 0u) << m;
}

}  // namespace
}  // namespace deepinfer
