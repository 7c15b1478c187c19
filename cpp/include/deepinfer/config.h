// ModelConfig: the DeepSeek-V4 hyper-parameters read from a Hugging Face config.json, validated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace deepinfer {

struct V41TextConfig;  // deepinfer/v41_config.h

enum class AttentionKind { kSliding, kCompressedSparse, kHeavilyCompressed };
enum class MlpKind { kHashMoe, kMoe };

const char* attention_kind_name(AttentionKind kind);  // the transformers layer_types spelling
const char* mlp_kind_name(MlpKind kind);

// One rotary embedding ("main" for sliding layers, "compress" for CSA/HCA layers).
struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
};

// How a checkpoint's weights are quantized (config.json quantization_config, and expert_dtype at
// the top level as DeepSeek writes it). docs/model.md#quantized-checkpoints.
struct QuantConfig {
  bool fp8 = false;             // quant_method "fp8": the dense GEMM weights are block-scaled e4m3
  int weight_block_rows = 128;  // weight_block_size[0]: output rows sharing one scale
  int weight_block_cols = 128;  // weight_block_size[1]: input columns sharing one scale
  bool ue8m0_scales = true;     // scale_fmt "ue8m0": every scale is a power of two
  bool experts_fp4 = false;     // expert_dtype "fp4": the routed experts are MXFP4

  bool operator==(const QuantConfig&) const = default;
};

struct ModelConfig {
  std::string source;  // the file it was read from, for messages

  int vocab_size = 129280;
  int hidden_size = 4096;
  int num_hidden_layers = 43;
  int num_attention_heads = 64;
  int head_dim = 512;
  int rope_head_dim = 64;  // qk_rope_head_dim = head_dim * partial_rotary_factor
  int q_lora_rank = 1024;
  int o_groups = 8;
  int o_lora_rank = 1024;
  int sliding_window = 128;

  int index_n_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  int csa_compress_rate = 4;
  int hca_compress_rate = 128;

  int n_routed_experts = 256;
  int num_experts_per_tok = 6;
  int moe_intermediate_size = 2048;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;

  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;

  int64_t max_position_embeddings = 1048576;
  bool tie_word_embeddings = false;
  int bos_token_id = 0;
  std::vector<int> eos_token_ids = {1};

  RopeConfig main_rope;      // sliding layers
  RopeConfig compress_rope;  // CSA / HCA layers (and their compressors and indexers)

  std::vector<AttentionKind> layer_types;
  std::vector<MlpKind> mlp_layer_types;

  // The multi-token-prediction blocks a checkpoint may ship (mtp.K.*, docs/model.md#mtp-block).
  // Block K is layer num_hidden_layers + K of DeepSeek's reference: its attention kind is entry
  // num_hidden_layers + K of the released compress_ratios list (sliding when the list stops
  // short or the config uses layer_types), and its MoE always routes by score (never hash).
  int num_nextn_predict_layers = 1;
  std::vector<AttentionKind> mtp_layer_types;  // [num_nextn_predict_layers]

  QuantConfig quantization;  // all defaults (fp8 false): bf16/f32 weights

  // Set for a DeepSeek-V4.1 checkpoint (model_type "deepseek_v41"): its text config with the
  // layer roles. The fields above are then V41TextConfig::model_config()'s view (widths, MoE,
  // norms, ropes, quantization; layer kinds carry only each layer's ratio) and the model is the
  // V4.1 graph. Null for DeepSeek-V4.
  std::shared_ptr<const V41TextConfig> v41;

  // Reads and validates `path` (a config.json): model_type "deepseek_v4", or "deepseek_v41"
  // (read by V41TextConfig, see `v41`). Throws deepinfer::Error naming the file and the
  // field: kNotFound (no file), kCorruptFile (bad JSON), kInvalidConfig (wrong type, bad value,
  // inconsistent values, unknown model_type), kUnsupported (a valid feature this build lacks, e.g.
  // a quant_method other than fp8).
  static ModelConfig from_file(const std::string& path);
  // Same, from JSON text; `source` names it in messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);

  // Attention kind of layer `layer`: a main layer below num_hidden_layers, MTP block
  // layer - num_hidden_layers from there.
  AttentionKind attention_kind(int layer) const;
  // Compression ratio of layer `layer`'s compressed entries (MTP blocks as in attention_kind): 0
  // for sliding layers.
  int compress_rate(int layer) const;
  bool has_compressed_layers() const;  // main layers or MTP blocks
  // Inverse frequencies of a rotary embedding, computed in fp32 the way transformers does.
  std::vector<float> rope_inv_freq(const RopeConfig& rope) const;
};

}  // namespace deepinfer
