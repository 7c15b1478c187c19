// The DeepSeek-V4.1 text forward graph (docs/model.md#deepseek-v41-text-model; model.md B.3, C),
// written once against Backend ops: shifted mHC without a HyperHead, V4.1 attention (no per-head q
// norm; C2/C1 compressors at kv sources only, share-KV readers; index-K sources, index sources and
// share-index layers; the candidate source and candidate-restricted index sources), V4.1 MoE
// (sqrt-softplus scores + bias, no hash layers) and Engram. YOCO runs in mode "off" (exact): the
// consumer layers see every row.
#pragma once

#include <map>

#include "deepinfer/backend.h"
#include "deepinfer/v41_config.h"
#include "model/batch_plan.h"
#include "model/v41_caches.h"
#include "model/v41_weights.h"

namespace deepinfer {

class DeepseekV41Model {
 public:
  DeepseekV41Model(const V41TextConfig& config, V41Weights weights, Backend& backend);

  // Enqueues one forward call; returns the device logits [plan.num_logit_rows, V], or an
  // undefined tensor when no row wants logits. `ngram` [T, engram_max_ngram_size] i32 holds, for
  // each token row at position t, the token ids at t, t-1, ... (-1 before the sequence start):
  // the Engram layers' n-grams (undefined when the model has none). Reads and writes the caches of
  // the plan's slots and blocks (entries in plan.entries for ratios 1 and 2).
  Tensor forward(const BatchPlan& plan, const Tensor& ngram, V41Caches& caches);

  const V41TextConfig& config() const { return config_; }
  const V41Weights& weights() const { return weights_; }

 private:
  // What one forward's layers hand to later layers (C.3.7): each index source's top-k and the
  // candidate source's blocks.
  struct SharedSelection {
    std::map<int, Tensor> topk;  // index source -> [T, index_topk] i32
    Tensor candidates;           // [T, candidate_topk_blocks] i32
  };

  Tensor attention(int layer, const Tensor& x, const BatchPlan& plan, V41Caches& caches,
                   SharedSelection& shared);
  // Kv source `layer`: the entries closing in this call, normed, RoPE'd at j * ratio and stored;
  // on an index-K source also their index keys from the normed pre-RoPE entries.
  void compress(int layer, const Tensor& x, const BatchPlan& plan, V41Caches& caches);
  // The compressed entries the rows of compressed layer `layer` attend to: [T, index_topk] i32.
  Tensor select_entries(int layer, const Tensor& qa, const Tensor& x, const BatchPlan& plan,
                        V41Caches& caches, SharedSelection& shared);
  Tensor moe(const MoeWeights& w, const Tensor& x, const Tensor& token_ids);
  Tensor engram(const EngramWeights& w, const Tensor& trunk, const Tensor& ngram);

  const V41TextConfig& config_;
  V41Weights weights_;
  Backend& backend_;
  HcParams hc_params_;
  float eps_ = 0.0f;
};

}  // namespace deepinfer
