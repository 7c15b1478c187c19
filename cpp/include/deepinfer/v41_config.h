// V41TextConfig: the text model of a DeepSeek-V4.1 checkpoint (config.json model_type
// "deepseek_v41", its text_config; /work/shared/reference/model.md B.3), validated, with the layer
// roles of model.md C.2 derived from it: kv sources and share-KV readers, index-K sources, index
// sources and share-index readers, the candidate source, the YOCO boundary, Engram layers.
//
// ModelRunner and the engine run a deepseek_v41 checkpoint with the V4.1 graph
// (cpp/src/model/deepseek_v41.h). The roles are derived exactly as tests/python/v41_reference.py's
// V41TextConfig derives them (its "Spec reading" 4 and 5 included).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/config.h"

namespace deepinfer {

// DeepInfer's YOCO prefill truncation (engine.md 6.3, model.md C.6): an engine option, not a
// config.json field. kOff is exact; kMask runs every row with the consumer layers' sliding windows
// narrowed to the last yoco_keep_tokens positions of the prefill; kCompact also drops the other
// rows at the YOCO boundary (after its compressor and index keys saw them).
enum class YocoTruncation { kOff, kMask, kCompact };

// Where the Engram tables live (an engine option, engram_table_memory;
// docs/model.md#engram-tables): kDevice in device memory (upload_weight), kHost in host memory the
// kernels read in place (Backend::upload_weight_mapped), kAuto device memory for a table that takes
// at most 1/8 of the device's memory, host memory for a bigger one (V4.1-Flash's ~98 GB tables). On
// the CPU backend all three are the same host memory.
enum class EngramTableMemory { kAuto, kDevice, kHost };

struct V41TextConfig {
  std::string source;  // the file it was read from, for messages

  // Widths (defaults: V4.1-Flash, model.md B.3).
  int vocab_size = 129280;
  int hidden_size = 5120;
  int num_hidden_layers = 40;
  int num_attention_heads = 64;
  int head_dim = 512;
  int rope_head_dim = 64;  // qk_rope_head_dim
  int q_lora_rank = 1280;
  int o_groups = 8;
  int o_lora_rank = 1024;
  int sliding_window = 128;
  int64_t max_position_embeddings = 1048576;

  // MoE (C.5): noaux_tc routing by sqrt(softplus) scores, no hash layers.
  int n_routed_experts = 384;
  int num_experts_per_tok = 6;
  int n_shared_experts = 1;
  int moe_intermediate_size = 2304;
  double routed_scaling_factor = 1.5;
  bool norm_topk_prob = true;
  double swiglu_limit = 10.0;

  // Norms and shifted mHC (C.4).
  double rms_norm_eps = 1e-20;  // also the HC norm and Engram gate eps
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  bool hc_shifted = true;  // absent in V4.1-Flash's config: defaults to true; false is rejected

  // RoPE (C.2): rope_theta without YaRN on sliding-only layers and the DSpark blocks;
  // compress_rope_theta with rope_scaling (YaRN) for every rope of a compressed layer.
  RopeConfig main_rope;
  RopeConfig compress_rope;

  // Indexer.
  int index_n_heads = 32;
  int index_head_dim = 128;
  int index_topk = 512;

  // Layer roles as written in the config. Ratios: 0 sliding only, 2 = C2, 1 = C1; one entry per
  // backbone layer, then one per DSpark block.
  std::vector<int> compress_ratios;  // [num_hidden_layers + num_nextn_predict_layers]
  std::vector<int> kv_source_layer_ids;
  std::vector<int> index_source_layer_ids;
  int candidate_source_layer_id = -1;  // -1: none (JSON null)
  int candidate_topk_blocks = 2048;
  int candidate_block_size = 8;

  // Engram (C.7).
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;  // rows per engram layer = sum of its primes
  int engram_max_ngram_size = 4;
  int64_t engram_vocab_size = 16000000;
  int engram_n_heads = 8;
  int engram_head_dim = 256;
  int engram_compressed_vocab_size = 99092;
  int engram_pad_token_id = 2;
  // Per engram layer: the primes in (order, head) order, [(max_ngram_size - 1) * n_heads], from
  // one nextprime chain above engram_vocab_size - 1 continued across layers (C.7.3); their sums
  // equal engram_num_embeddings (validated).
  std::vector<std::vector<int64_t>> engram_primes;

  // DSpark drafter (C.8): parsed, not used.
  int num_nextn_predict_layers = 3;
  int dspark_block_size = 5;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 256;
  int dspark_noise_token_id = 128799;
  int dspark_n_routed_experts = 128;
  int dspark_num_experts_per_tok = 3;
  int image_token_id = 129264;

  QuantConfig quantization;  // B.3 requires fp8 32x32 UE8M0 blocks with MXFP4 experts

  // DeepInfer's YOCO KEEP_TOKENS (README default 140); not a config.json field. The consumer
  // layers of a truncated YOCO prefill run on the last keep tokens, so keep >= sliding_window.
  int yoco_keep_tokens = 140;
  YocoTruncation yoco_truncation = YocoTruncation::kOff;             // set_yoco_truncation
  EngramTableMemory engram_table_memory = EngramTableMemory::kAuto;  // set_engram_table_memory

  // ---- Derived (B.3 "Values derived by DeepInfer", C.2); -1 means none. ----
  // Per backbone layer: the nearest source at or before the layer (none on ratio-0 layers).
  std::vector<int> kv_source;       // whose compressed KV the layer reads (layer_kv_map)
  std::vector<int> index_source;    // whose top-k indices it uses (layer_index_module_map)
  std::vector<int> index_k_source;  // whose index K it reads; index-K sources = kv sources
  // First backbone layer with ratio 1 (n_prefill_layer): layers from it on are YOCO consumers.
  int yoco_boundary = -1;

  int ratio(int layer) const { return compress_ratios.at(layer); }  // DSpark blocks included
  bool is_kv_source(int layer) const;         // computes compressed KV (owns a compressor)
  bool is_index_source(int layer) const;      // computes its own top-k
  bool is_index_k_source(int layer) const;    // owns the indexer wk / k_norm
  bool is_candidate_source(int layer) const;  // also picks the candidate blocks
  // An index source after the candidate source: scores only inside the candidate blocks.
  bool uses_candidates(int layer) const;
  bool is_yoco_consumer(int layer) const { return yoco_boundary >= 0 && layer >= yoco_boundary; }
  bool is_engram_layer(int layer) const;
  // The rope of every attention part of a layer (C.2); DSpark blocks are layers
  // num_hidden_layers + K.
  const RopeConfig& layer_rope(int layer) const {
    return ratio(layer) == 0 ? main_rope : compress_rope;
  }

  // The fields V4.1 shares with V4's ModelConfig (widths, MoE, norms, mHC, ropes, quantization),
  // for the shared weight loader and batch plan. Its layer kinds only carry each layer's ratio
  // (C2 as kCompressedSparse with csa_compress_rate 2, C1 as kHeavilyCompressed with
  // hca_compress_rate 1); no V4 graph may be built from it. No MTP blocks (DSpark is not run).
  // Its `v41` holds a copy of this config.
  ModelConfig model_config() const;

  // Reads and validates a deepseek_v41 config.json (the outer config with its text_config).
  // Throws deepinfer::Error naming the file and the field ('text_config.compress_ratios[3]', ...):
  // kNotFound (no file), kCorruptFile (bad JSON), kInvalidConfig (wrong type, bad value, roles
  // that do not nest), kUnsupported (a quantization other than B.3's).
  static V41TextConfig from_file(const std::string& path, int yoco_keep_tokens = 140);
  static V41TextConfig from_json_text(const std::string& text, const std::string& source,
                                      int yoco_keep_tokens = 140);
};

// Sets `config`'s YOCO prefill truncation from the options yoco_prefill_truncation ("off", "mask"
// or "compact") and yoco_keep_tokens (its V4.1 text config is replaced by a copy). Throws
// Error(kInvalidArgument) naming the option: an unknown mode, a mode other than "off" for a model
// that is not DeepSeek-V4.1, or keep_tokens < sliding_window + max_rollback (the positions a
// speculative step can roll back: decode must find a full window inside the kept positions).
void set_yoco_truncation(ModelConfig& config, const std::string& mode, int keep_tokens,
                         int max_rollback);

// Sets where `config`'s Engram tables live from the option engram_table_memory ("auto",
// "device" or "host"; its V4.1 text config is replaced by a copy). Throws Error(kInvalidArgument)
// naming the option: an unknown mode, or "device" / "host" for a model without Engram layers.
void set_engram_table_memory(ModelConfig& config, const std::string& mode);

}  // namespace deepinfer
