// A small V4 model for the engine tests that need a whole engine on the CPU without a
// checkpoint on disk: four layers (sliding, compressed sparse, heavily compressed, compressed
// sparse), so a block carries compressed entries and index keys and a snapshot every kind of ring,
// top-4 of 8 experts (a combine of more than two terms), random weights (load_format "dummy").
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "deepinfer/engine_config.h"

namespace deepinfer::test {

// The config.json of the model (transformers' spelling).
inline const char* kSmallV4Config = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 1, "head_dim": 32, "partial_rotary_factor": 0.25, "qk_rope_head_dim": 8,
  "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
  "index_n_heads": 4, "index_head_dim": 32, "index_topk": 3,
  "n_routed_experts": 8, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
  "layer_types": ["sliding_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention", "compressed_sparse_attention"],
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
  "rope_parameters": {
    "compress": {"attention_factor": 1.0, "beta_fast": 32, "beta_slow": 1, "factor": 4.0,
                 "original_max_position_embeddings": 32, "partial_rotary_factor": 0.25,
                 "rope_theta": 160000.0, "rope_type": "yarn"},
    "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}},
  "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "dtype": "float32",
  "max_position_embeddings": 1024,
  "eos_token_id": 1, "bos_token_id": 0, "rms_norm_eps": 1e-06, "hc_eps": 1e-06
})";

// Writes the config.json into `dir`.
inline void write_small_v4(const std::string& dir) {
  std::ofstream(dir + "/config.json") << kSmallV4Config;
}

// An engine config over `dir` on one CPU thread: dummy weights (the same values for every
// engine: they depend on the seed and each tensor's name only).
inline EngineConfig small_v4_engine(const std::string& dir) {
  EngineConfig c;
  c.model_path = dir;
  c.load_format = "dummy";
  c.seed = 7;
  c.placement.device = "cpu";
  c.placement.num_threads = 1;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_model_len = 512;
  return c;
}

// small_v4_engine for a group of `ranks` data-parallel, expert-parallel ranks.
inline EngineConfig small_v4_group(const std::string& dir, int ranks) {
  EngineConfig c = small_v4_engine(dir);
  c.parallel.data_parallel_size = ranks;
  c.parallel.expert_parallel_size = ranks;
  return c;
}

// Six prompts of 5..60 tokens, different from each other.
inline std::vector<std::vector<int32_t>> small_v4_prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> tokens;
    for (int j = 0; j < 5 + 11 * i; ++j) tokens.push_back(2 + (37 * i + 13 * j) % 250);
    p.push_back(tokens);
  }
  return p;
}

// Greedy, 12 tokens, past any EOS.
inline SamplingParams greedy12() {
  SamplingParams s;
  s.temperature = 0.0f;
  s.max_tokens = 12;
  s.ignore_eos = true;
  return s;
}

}  // namespace deepinfer::test
