// The DeepSeek-V4.1 text model's parameters on a backend (model.md C.9 names), grouped the way
// the V4.1 graph uses them, and the tables of its Engram layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/v41_config.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace deepinfer {

// The compressor of a kv source (C.3.3): C2 stacks wkv and wgate as one [2D, H] matrix (each
// token's [kv | gate] row, what compress_pool takes) with a zero `ape` [2, D] (V4.1 has none);
// C1 has wkv [D, H] only (one entry per token). `norm` [D].
// The indexer of an index source (C.3.4): wq_b, weights_proj, and on index-K sources wk [Di, D]
// with k_norm [Di], applied to the compressor's normed pre-RoPE entries.
struct V41IndexerWeights {
  MatrixWeight wq_b;    // [hi * Di, Q]
  Tensor weights_proj;  // [hi, H]
  bool owns_k = false;  // an index-K source
  MatrixWeight wk;      // [Di, D]
  Tensor k_norm;        // [Di]
};

// No per-head q norm (C.3.1).
struct V41AttentionWeights : AttentionProjections {
  bool has_compressor = false;  // a kv source
  CompressorWeights compressor;
  bool has_indexer = false;  // an index source
  V41IndexerWeights indexer;
};

// One Engram layer (C.7): the hash constants, the table, the projection and the gate weights.
struct EngramWeights {
  EngramHashParams hash;
  // [rows, engram_head_dim]: dense (f32 / the backend's bf16), or as shipped (f8_e4m3 with
  // embed_scales [rows, ceil(engram_head_dim / 32)] e8m0; only looked-up rows are decoded).
  Tensor embed;
  Tensor embed_scales;  // undefined for a dense table
  // Both live in host memory the kernels read in place (engram_table_memory, upload_weight_mapped).
  bool embed_on_host = false;
  MatrixWeight wkv;  // [(N+1)*H, (n-1)*heads*engram_head_dim]
  Tensor q_weight;   // [N, H]
  Tensor k_weight;   // [N, H]
};

struct V41LayerWeights {
  Tensor attn_norm, ffn_norm;  // [H]
  HcWeights hc_attn, hc_ffn;   // [(2+N)N, N*H], [(2+N)N], [3]
  V41AttentionWeights attn;
  MoeWeights ffn;  // bias always set, tid2eid never (no hash layers in V4.1)
  bool has_engram = false;
  EngramWeights engram;
  Tensor inv_freq;  // [R/2] f32: the layer's rope (main, or compress with YaRN; C.2)
};

// The DSpark drafter (C.8, C.9): blocks mtp.K.* (layer num_hidden_layers + K: sliding attention
// with the main rope, the DSpark MoE of dspark_n_routed_experts, mHC), the main-key projection
// mtp.0 owns and the head parts the last block owns. The embedding and lm head are the model's.
struct DSparkWeights {
  std::vector<V41LayerWeights> blocks;
  MatrixWeight main_proj;    // [H, targets * H]
  Tensor main_norm;          // [H]
  Tensor norm;               // [H]
  Tensor markov_embed;       // [V, R] (a matrix weight: embedding table)
  MatrixWeight markov_head;  // [V, R]
  // confidence_head.proj [1, H + R] split by the input it weighs: h_i, then the Markov embedding.
  MatrixWeight confidence_hidden;  // [1, H]
  MatrixWeight confidence_markov;  // [1, R]
};

struct V41Weights {
  Tensor embed;  // [V, H]
  Tensor head;   // [V, H]
  Tensor norm;   // [H]
  std::vector<V41LayerWeights> layers;
  DSparkWeights dspark;  // no blocks: the checkpoint ships none, or they were not requested
  // Token id -> compressed id (C.7.1), [V] i32; undefined without Engram layers.
  Tensor engram_token_map;
  // What the loader left out on purpose: "skipped 12 vision tensors ...".
  std::vector<std::string> notes;
};

// The Engram tables that are not checkpoint tensors (C.7.1, C.7.3): the compressed-tokenizer map
// and each Engram layer's multipliers, precomputed offline (NumPy's generator is not re-implemented
// here). File <checkpoint>/engram_tables.json:
//   {"token_map": [V ints in [0, engram_compressed_vocab_size)],
//    "multipliers": {"<layer>": [engram_max_ngram_size odd positive ints], ...}}
inline constexpr const char* kEngramTablesFile = "engram_tables.json";

struct EngramTables {
  std::vector<int32_t> token_map;
  std::vector<std::vector<int64_t>> multipliers;  // per config.engram_layer_ids entry
};

// Reads and checks <dir>/engram_tables.json against the config (Error naming the file and field:
// kNotFound, kCorruptFile, kInvalidConfig). Not read (empty tables) without Engram layers.
EngramTables read_engram_tables(const std::string& dir, const V41TextConfig& config);

// Loads and checks every tensor the config's layer roles imply, by the C.9 names (an optional
// "model." prefix is dropped by Checkpoint), with the V4 loader's checks and error style (a
// missing tensor or a wrong shape names the tensor, its shape and the expected one). FP8 (block
// size from quantization_config) and MXFP4 expert weights go through the quantized MatrixWeight
// path. The DSpark drafter's mtp.* tensors load (every block of num_nextn_predict_layers, each
// tensor required) when options.load_mtp is on and the checkpoint has any; otherwise they are
// skipped with a note, as are vision.* / aligner.* / image_*. gate.bias_vl (image tokens) is not
// read. expert_slots is ignored (no expert parallelism for V4.1 yet).
V41Weights load_v41_weights(const Checkpoint& checkpoint, const V41TextConfig& config,
                            const ModelConfig& shared, Backend& backend,
                            const WeightLoadOptions& options = {});

// Random weights of the same shapes and formats (load_format dummy, for benchmarks): the V4
// loader's random init (WeightLoader with no checkpoint, quantized when the config says so) and
// random Engram tables (random_engram_tables); the DSpark drafter too when options.load_mtp is
// on and the config has blocks. Outputs are meaningless.
V41Weights random_v41_weights(const V41TextConfig& config, const ModelConfig& shared,
                              Backend& backend, uint64_t seed, DType stored,
                              const WeightLoadOptions& options = {});

// Engram tables for random weights: token v maps to compressed id v mod
// engram_compressed_vocab_size, and each Engram layer gets engram_max_ngram_size odd multipliers
// below the bound of model.md C.7.3 (so the hash products stay below 2^63), drawn from `seed`.
EngramTables random_engram_tables(const V41TextConfig& config, uint64_t seed);

}  // namespace deepinfer
