// WeightLoader: reads and checks one checkpoint tensor at a time (or makes a random one) and moves
// it to a backend in the format the graph computes with. The V4 and V4.1 loaders build their
// weight structs with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "model/checkpoint.h"
#include "model/weights.h"

namespace deepinfer {

// Weights from a checkpoint, or (checkpoint null) random weights made on the backend. `config`
// supplies the widths, the expert count and the quantization the checks compare against.
class WeightLoader {
 public:
  WeightLoader(const Checkpoint* checkpoint, const ModelConfig& config, Backend& backend,
               const WeightLoadOptions& options = {}, uint64_t seed = 0,
               DType random_stored = DType::kBF16)
      : ckpt_(checkpoint),
        config_(config),
        backend_(backend),
        options_(options),
        seed_(seed),
        random_stored_(random_stored) {}

  // A floating-point vector parameter of exactly `shape`, as f32 on the backend.
  Tensor load(const std::string& name, const Shape& shape);

  // A matrix weight (GEMM operand or embedding table) in the backend's dtype for it.
  Tensor load_matrix(const std::string& name, const Shape& shape);

  // A GEMM weight DeepSeek may quantize: `name` ("<base>.weight") is dense (f32/bf16/f16), or
  // FP8 e4m3 / packed MXFP4 (a routed expert of an expert_dtype "fp4" checkpoint) with its scale
  // sibling "<base>.scale" (docs/model.md#quantized-checkpoints), checked against each other and
  // against config.json before anything reaches the backend.
  MatrixWeight load_linear(const std::string& name, const Shape& shape, bool routed_expert);

  // The scale grid of `weight_name` as the backend takes it: f32 for FP8, e8m0 for MXFP4. Checks
  // dtype, shape (one per block of the weight) and values (finite, positive, and a power of two
  // where the format says so).
  Tensor scales(const std::string& name, const std::string& weight_name, int64_t n, int64_t k,
                const MatrixWeight& w, bool powers_of_two);

  void report_progress(int done) const;

  void require_present(const std::string& name, const Shape& shape) const;

  // Random weights in the format config.json's quantization_config gives (for benchmarks of the
  // real formats without a checkpoint): every weight's bytes are a slice of one random pool per
  // format, so making a V4-Flash-sized model costs the upload, not the random draws. Values are
  // e4m3 codes of N(0, 1) draws (MXFP4: uniform nibbles) with a power-of-two scale near
  // 1 / sqrt(K), so activations keep their size through the layers.
  MatrixWeight random_quantized(const std::string& name, const Shape& shape, bool routed_expert);

  void fill_pool(std::vector<uint8_t>& pool, bool fp4) const;

  // Random init by parameter kind: norms near 1, mHC scales near 1, biases and position terms
  // small, matrices N(0, 1/fan_in) so every sub-layer moves the residual by O(1).
  Tensor random(const std::string& name, const Shape& shape, DType dtype);

  // Reads the host view and checks name, dtype family and shape.
  Tensor host(const std::string& name, const Shape& shape, bool integer);

  // Random weights use the stacked expert layout, except in a quantized format (one weight per
  // expert, as DeepSeek ships them).
  bool contains(const std::string& name) const;

  // Random weights (no checkpoint): load_format dummy.
  bool is_random() const { return ckpt_ == nullptr; }

  const std::string& file_of(const std::string& name) const;

  HcWeights hc(const std::string& prefix, int64_t rows);

  // kv and gate projections stacked into one [2C, H] f32 matrix.
  CompressorWeights compressor(const std::string& prefix, int64_t d, int64_t ratio, bool overlap);

  Tensor tid2eid(const std::string& name);

  // Each token maps to k distinct experts.
  Tensor random_tid2eid(const std::string& name);

  void set_own_expert_copies(bool own) { own_expert_copies_ = own; }

  ExpertWeights experts(const std::string& prefix);

  Tensor inv_freq(const RopeConfig& rope);

 private:
  const Checkpoint* ckpt_;
  const ModelConfig& config_;
  Backend& backend_;
  WeightLoadOptions options_;
  uint64_t seed_;
  DType random_stored_;
  bool own_expert_copies_ = false;  // see experts()
  std::vector<uint8_t> fp8_pool_;   // random_quantized's byte pools, made on first use
  std::vector<uint8_t> fp4_pool_;
};

// attn.wq_a .. attn.attn_sink of the layer under prefix `p`, at the widths of `config` (a
// ModelConfig or a V41TextConfig: both name them alike).
template <class Config>
void load_attention_projections(WeightLoader& w, const Config& config, const std::string& p,
                                AttentionProjections& a) {
  const int64_t h = config.hidden_size;
  const int64_t nh = config.num_attention_heads;
  const int64_t d = config.head_dim;
  const int64_t q = config.q_lora_rank;
  const int64_t g = config.o_groups;
  a.wq_a = w.load_linear(p + "attn.wq_a.weight", {q, h}, false);
  a.q_norm = w.load(p + "attn.q_norm.weight", {q});
  a.wq_b = w.load_linear(p + "attn.wq_b.weight", {nh * d, q}, false);
  a.wkv = w.load_linear(p + "attn.wkv.weight", {d, h}, false);
  a.kv_norm = w.load(p + "attn.kv_norm.weight", {d});
  a.wo_a = w.load_linear(p + "attn.wo_a.weight", {g * config.o_lora_rank, nh * d / g}, false);
  a.wo_b = w.load_linear(p + "attn.wo_b.weight", {h, g * config.o_lora_rank}, false);
  a.sinks = w.load(p + "attn.attn_sink", {nh});
}

}  // namespace deepinfer
