// The DeepSeek-V4 forward graph (docs/model.md#forward-graph), written once against Backend ops.
#pragma once

#include <memory>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "dist/communicator.h"
#include "dist/expert_placement.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/weights.h"

namespace deepinfer {

// Expert parallelism of the routed experts (docs/parallel.md): this rank holds the experts of
// its placement slots (LayerWeights::ffn.experts in slot order) and every MoE layer runs
// dist::ep_moe_experts over `comm`, so every rank of the group must run the same number of MoE
// layers per step (a rank without tokens runs idle_pass()).
struct ExpertParallel {
  dist::Communicator* comm = nullptr;  // this rank's; outlives the model
  // One per MoE layer (index = layer; MTP blocks are not run under expert parallelism).
  std::vector<dist::ExpertPlacement> placements;
  // EPLB statistics: per layer, the (token, j) pairs this rank sent to each global slot since the
  // last DeepseekV4Model::take_slot_counts ([layer][slot]; an idle pass adds nothing).
  std::vector<std::vector<int64_t>> slot_counts;
};

class DeepseekV4Model {
 public:
  DeepseekV4Model(const ModelConfig& config, ModelWeights weights, Backend& backend);

  // Enqueues one forward call; returns the device logits [plan.num_logit_rows, V], or an
  // undefined tensor when no row wants logits (the head is skipped). Reads and writes the caches
  // of the plan's slots and blocks. `hidden`, when given, receives the HC trunk after the last
  // layer, before the head ([T, hc_mult, H], every token row): what the MTP block reads.
  Tensor forward(const BatchPlan& plan, ModelCaches& caches, Tensor* hidden = nullptr);

  // One decoder layer over the HC trunk [T, N, H] -> [T, N, H]: layer `layer` is a main layer, or
  // MTP block layer - num_hidden_layers (its kind and ratio come from the config).
  Tensor decoder_layer(int layer, const LayerWeights& w, const Tensor& trunk, const BatchPlan& plan,
                       LayerCaches& caches);
  // HC collapse with `hc`, RMSNorm with `norm`, then the shared head: trunk [R, N, H] -> [R, V].
  Tensor head(const Tensor& trunk, const HcWeights& hc, const Tensor& norm);

  // From now on the routed experts are expert-parallel (the weights hold this rank's slots).
  void set_expert_parallel(std::unique_ptr<ExpertParallel> ep) { ep_ = std::move(ep); }
  const ExpertParallel* expert_parallel() const { return ep_.get(); }
  // What a rank with no tokens runs in a step of its group: every MoE layer's collectives with
  // zero rows, so the ranks that do have tokens can exchange theirs. Host-synchronous.
  void idle_pass();
  // EPLB: the per-layer slot counts gathered since the last call (ExpertParallel::slot_counts),
  // into `out` (resized, zeros when no MoE layer ran); the model's counters restart at zero.
  void take_slot_counts(std::vector<std::vector<int64_t>>& out);
  // EPLB: from the next forward on, MoE layer `layer` uses `placement` and this rank's slots hold
  // `local` (in slot order). Only between forwards, with nothing enqueued that reads the old
  // weights (the caller synchronizes the stream first).
  void install_experts(int layer, dist::ExpertPlacement placement, ExpertWeights local);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() { return backend_; }
  const HcParams& hc_params() const { return hc_params_; }

 private:
  // A layer's output before its last trunk update: hc_post(trunk, out, post, comb) is due, and
  // forward fuses it with the next layer's hc_pre (hc_post_pre).
  struct PendingHcPost {
    Tensor trunk;
    Tensor out;
    Tensor post;
    Tensor comb;
  };
  // The attention sub-layer's input norm, applied by the hc op that collapses its input.
  RowNorm attn_norm(const LayerWeights& w) const;
  // The layer from its attention mix (hc_pre of `trunk`, y normed by attn_norm) on: attention,
  // its trunk update fused with the MoE's hc_pre, the MoE; the MoE's trunk update is left to the
  // caller.
  PendingHcPost layer_after_mix(int layer, const LayerWeights& w, const Tensor& trunk,
                                const HcMix& mix, const BatchPlan& plan, LayerCaches& caches);
  Tensor attention(int layer, const AttentionWeights& w, const Tensor& x, const BatchPlan& plan,
                   LayerCaches& caches);
  // Runs a compressor over this call's tokens: stores the windows that close as normalised,
  // RoPE-d entries in `entry_cache` and the tokens' projections in `ring`.
  void compress(const CompressorWeights& w, const Tensor& x, const BatchPlan& plan, int ratio,
                bool overlap, int64_t head_dim, int rope_dim, const Tensor& ring,
                const Tensor& entry_cache);
  Tensor moe(int layer, const MoeWeights& w, const Tensor& x, const Tensor& token_ids);
  Tensor routed_experts(int layer, const MoeWeights& w, const Tensor& x, const Routing& routing);

  const ModelConfig& config_;
  ModelWeights weights_;
  Backend& backend_;
  HcParams hc_params_;
  // The backend keeps the matrix weights in bf16: attention may use bf16 tensor cores too.
  bool bf16_math_ = false;
  std::unique_ptr<ExpertParallel> ep_;  // null: every expert is local
};

}  // namespace deepinfer
