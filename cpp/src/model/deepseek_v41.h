// The DeepSeek-V4.1 text forward graph (docs/model.md#deepseek-v41-text-model; model.md B.3, C),
// written once against Backend ops: shifted mHC without a HyperHead, V4.1 attention (no per-head q
// norm; C2/C1 compressors at kv sources only, share-KV readers; index-K sources, index sources and
// share-index layers; the candidate source and candidate-restricted index sources), V4.1 MoE
// (sqrt-softplus scores + bias, no hash layers) and Engram. YOCO prefill truncation
// (V41TextConfig::yoco_truncation; model/yoco_rows.h) narrows the consumer layers' sliding windows
// ("mask") and drops their rows before the kept positions ("compact").
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/v41_config.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/v41_weights.h"
#include "model/yoco_rows.h"

namespace deepinfer {

// The host half of engram_ngrams, shared with the recorded decode graphs (decode_graphs.h): the
// n-grams of `rows` into `ngram` ([num_token_rows, n] row-major, resized; n =
// engram_max_ngram_size), column r the token at position t - r (-1 before the sequence start),
// from each row's tokens and its `history`; into `remap` (same size) the index into the previous
// step's tokens of each cell holding a carried first token (token_from_previous), -1 elsewhere.
// Token rows past those of `rows` are a graph's padding rows (token 0 at position 0, as pack_batch
// writes them): [0, -1, ..., -1]. Returns whether any cell carries. Error(kInvalidArgument)
// naming the row when its history is too short, or when `num_token_rows` is below the rows'
// token count.
bool pack_engram_ngrams(RowSpan rows, const V41TextConfig& config, int64_t num_token_rows,
                        std::vector<int32_t>& ngram, std::vector<int32_t>& remap);

// The Engram n-grams of `rows` on the device: [T, n] i32 (pack_engram_ngrams), a carried first
// token taken from `previous` (the previous step's sampled tokens) wherever it appears. Undefined
// when the model has no Engram layer.
Tensor engram_ngrams(Backend& backend, RowSpan rows, const V41TextConfig& config,
                     const Tensor& previous);

class DeepseekV41Model {
 public:
  DeepseekV41Model(const V41TextConfig& config, V41Weights weights, Backend& backend);

  // Enqueues one forward call; returns the device logits [plan.num_logit_rows, V], or an
  // undefined tensor when no row wants logits. `ngram` (engram_ngrams) holds each token row's
  // n-gram for the Engram layers (undefined when the model has none). Reads and writes the caches
  // (ModelCaches in the V4.1 layout) of the plan's slots and blocks. `yoco` (plan_yoco_rows of the
  // same rows) holds the consumer layers' rows; with rows dropped, the logits are those of the
  // wanted rows that were kept (yoco.num_logit_rows; undefined when none).
  Tensor forward(const BatchPlan& plan, const Tensor& ngram, ModelCaches& caches,
                 const YocoRows& yoco);

  const V41TextConfig& config() const { return config_; }
  const V41Weights& weights() const { return weights_; }

 private:
  // What one forward's layers hand to later layers (C.3.7): each index source's top-k and the
  // candidate source's blocks.
  struct SharedSelection {
    std::map<int, Tensor> topk;  // index source -> [T, index_topk] i32
    Tensor candidates;           // [T, candidate_topk_blocks] i32
  };

  // The attention sub-layer of `layout`'s rows (the kv source has compressed already);
  // `swa_start` narrows the sliding window per sequence (AttentionSpec::swa_start).
  Tensor attention(int layer, const Tensor& x, const BatchLayout& layout, const Tensor& swa_start,
                   ModelCaches& caches, SharedSelection& shared);
  // Kv source `layer`: the entries closing in this call, normed, RoPE'd at j * ratio and stored;
  // on an index-K source also their index keys from the normed pre-RoPE entries.
  void compress(int layer, const Tensor& x, const BatchPlan& plan, ModelCaches& caches);
  // The compressed entries the rows of compressed layer `layer` attend to: [T, index_topk] i32.
  // Share-KV readers and share-index layers read their sources' caches.
  Tensor select_entries(int layer, const Tensor& qa, const Tensor& x, const BatchLayout& layout,
                        ModelCaches& caches, SharedSelection& shared);
  Tensor moe(const MoeWeights& w, const Tensor& x, const Tensor& token_ids);
  Tensor engram(const EngramWeights& w, const Tensor& trunk, const Tensor& ngram);

  const V41TextConfig& config_;
  V41Weights weights_;
  Backend& backend_;
  HcParams hc_params_;
  float eps_ = 0.0f;
};

}  // namespace deepinfer
