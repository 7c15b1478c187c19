// The DeepSeek-V4 parameters on a backend, grouped the way the graph uses them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "model/checkpoint.h"

namespace deepinfer {

struct HcWeights {
  Tensor fn;     // [(2+N)N, N*H] for a layer, [N, N*H] for the head
  Tensor base;   // [(2+N)N] or [N]
  Tensor scale;  // [3] or [1]
};

// A compressor (main or indexer): kv and gate projections stacked as one [2C, H] matrix so one
// GEMM yields each token's [kv | gate] row, the position bias (ape) and the entry norm.
struct CompressorWeights {
  Tensor wkv_gate;  // [2C, H], C = D (HCA) or 2D (CSA, two series)
  Tensor ape;       // [m, C]
  Tensor norm;      // [D]
};

// The GEMM weights DeepSeek quantizes are MatrixWeights (dense, FP8 or MXFP4 as the checkpoint
// ships them); the ones it ships in bf16 (compressors, indexer scorer, router, embedding, head)
// are plain tensors.
struct IndexerWeights {
  CompressorWeights compressor;  // at index_head_dim
  MatrixWeight wq_b;             // [hi * Di, Q]
  Tensor weights_proj;           // [hi, H]
};

// The projections, norms and sinks of every V4-family attention layer (V4 and V4.1 alike).
struct AttentionProjections {
  MatrixWeight wq_a;        // [Q, H]
  Tensor q_norm;            // [Q]
  MatrixWeight wq_b;        // [nh*D, Q]
  MatrixWeight wkv;         // [D, H]: V4.1's SWA key
  Tensor kv_norm;           // [D]
  MatrixWeight wo_a, wo_b;  // [G*Og, nh*D/G], [H, G*Og]
  Tensor sinks;             // [nh]
};

struct AttentionWeights : AttentionProjections {
  bool has_compressor = false;
  CompressorWeights compressor;
  bool has_indexer = false;
  IndexerWeights indexer;
};

struct MoeWeights {
  Tensor gate;     // [E, H]
  Tensor bias;     // [E] selection bias (moe layers), undefined for hash layers
  Tensor tid2eid;  // [V, k] i32 (hash layers), undefined otherwise
  ExpertWeights experts;
  MatrixWeight shared_w1, shared_w3, shared_w2;  // [I, H], [I, H], [H, I]
};

struct LayerWeights {
  Tensor attn_norm, ffn_norm;  // [H]
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights ffn;
};

// One multi-token-prediction block (mtp.K.*, docs/model.md#mtp-block): a decoder layer of the
// main kind plus the input projections that mix in the next token, and its own HC head and norm
// in front of the shared embedding and head.
struct MtpWeights {
  Tensor enorm, hnorm;          // [H]: the next token's embedding, the incoming hidden streams
  MatrixWeight e_proj, h_proj;  // [H, H] each (FP8 in DeepSeek's checkpoint)
  LayerWeights block;
  HcWeights hc_head;  // [N, N*H], [N], [1]
  Tensor norm;        // [H]
};

struct ModelWeights {
  Tensor embed;  // [V, H]
  Tensor head;   // [V, H]
  Tensor norm;   // [H]
  HcWeights hc_head;
  std::vector<LayerWeights> layers;
  Tensor main_inv_freq;      // [R/2] f32
  Tensor compress_inv_freq;  // [R/2] f32
  // The checkpoint's MTP blocks mtp.0.. (at most config.num_nextn_predict_layers); empty when it
  // ships none or WeightLoadOptions::load_mtp is off.
  std::vector<MtpWeights> mtp;
  // What the loader left out on purpose, for the user: "skipped 31 mtp.* tensors ...".
  std::vector<std::string> notes;
};

struct WeightLoadOptions {
  // Quantized weights get DeepSeek's dynamic FP8 activation quantization (MatrixWeight::act_group:
  // the FP8 block width for FP8 weights, 32 for MXFP4 experts); false keeps activations exact.
  bool quantize_activations = false;
  // Load the checkpoint's mtp.K.* blocks when it has them (false: skip them with a note).
  bool load_mtp = true;
  // Expert parallelism: the logical expert each of this rank's routed-expert slots holds, in slot
  // order (replicas repeat an expert); only those experts' bytes are read. Empty: every expert,
  // in expert order.
  std::vector<int32_t> expert_slots;
  // Called after the embedding and head, then after each layer: (done, num_hidden_layers + 1).
  std::function<void(int done, int total)> progress;
};

// Loads and checks every tensor the config implies (shape, dtype, index ranges; for quantized
// weights the scales' shape, dtype and values and the packing) and moves it to the backend
// (Backend::upload_matrix_weight decides the format it computes with). Errors name the tensor,
// the file, its shape and the expected shape.
ModelWeights load_model_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                Backend& backend, const WeightLoadOptions& options = {});
// Random weights with every tensor's shape (no checkpoint): matrices as if stored in `stored`
// (kept in backend.weight_dtype(stored)), drawn on the backend; with config.quantization.fp8 the
// GEMM weights DeepSeek quantizes are random FP8 / MXFP4 in the shipped format instead. For
// benchmarks. With options.load_mtp, the config's num_nextn_predict_layers MTP blocks too.
ModelWeights random_model_weights(const ModelConfig& config, Backend& backend, uint64_t seed,
                                  DType stored, const WeightLoadOptions& options = {});

// The EPLB weight shuffle: the routed experts `experts` (logical ids, in slot order) of main
// layer `layer`, with the values load_model_weights (checkpoint given) or random_model_weights
// (checkpoint null, the same seed and stored dtype: random weights are a function of the seed and
// the tensor's name) gave them. Reads only those experts' bytes of a per-expert or stacked
// checkpoint; the result shares no tensor with other experts. options.expert_slots is ignored.
ExpertWeights load_layer_experts(const Checkpoint* checkpoint, const ModelConfig& config,
                                 Backend& backend, int layer, std::span<const int32_t> experts,
                                 const WeightLoadOptions& options = {}, uint64_t seed = 0,
                                 DType random_stored = DType::kBF16);

}  // namespace deepinfer
