// DeepSeek-V4.1's DSpark drafter (docs/model.md#dspark-drafter; model.md C.8): the draft step on
// the Backend ops. The main keys it attends to are written by DeepseekV41Model::forward (every
// main forward, into each block's own SWA ring, ModelCaches layer num_hidden_layers + K).
//
// A draft step for a sequence whose last accepted position is ap runs the block inputs
// [golden, noise x (B-1)] at ap+1 .. ap+B (B = dspark_block_size) through the blocks mtp.0.. as
// decoder layers. Every draft query attends to the same keys: the block's main keys at
// [ap-W+1, ap] and the B draft keys (non-causal inside the block). The Backend's attention is
// causal per sequence, so the step stores the draft keys in the ring first and then attends with
// one single-token "sequence" per query at position ap+B with a window of W + B: its visible
// keys are exactly [ap-W+1, ap+B], the last of them the query row's own key argument. The draft
// keys are left in the ring (the next main forward overwrites the ones it reaches), so the ring
// must hold B positions past the window: max_backtrack >= B.
//
// Drafts are then picked one after the other: logits_i = head(norm(h_i)) + Markov(prev), draft i
// = argmax (greedy, as the V4 MTP drafter), prev = the golden token, then draft i - 1; the
// confidence logit z_i = proj . [h_i ; markov_embed(prev)] (the caller takes sigmoid(z_i / T)).
#pragma once

#include <cmath>
#include <vector>

#include "deepinfer/backend.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/deepseek_v41.h"

namespace deepinfer {

struct DSparkOutput {
  std::vector<Tensor> tokens;      // per draft i: [S] i32, the draft for position ap + 2 + i
  std::vector<Tensor> confidence;  // per draft i: [S, 1] f32, the confidence logit z_i
  std::vector<Tensor> logits;      // per draft i: [S, V] f32 (Markov term included)
};

// The confidence c_i = sigmoid(z_i / T) of a confidence logit, at DeepInfer's default head
// temperature T = 1 (DEEPINFER_DFLASH_CONFIDENCE_HEAD_TEMPERATURE; engine.md 5.2).
inline float dspark_confidence(float logit, float temperature = 1.0f) {
  return 1.0f / (1.0f + std::exp(-logit / temperature));
}

class DSparkDrafter {
 public:
  // The drafter over `model`'s weights().dspark (at least one block; Error(kInvalidArgument)
  // without it) and caches of `shape`.
  DSparkDrafter(DeepseekV41Model& model, const CacheShape& shape);

  int block_size() const { return model_.config().dspark_block_size; }

  // One draft step. `plan`: per sequence one row of B tokens [golden, noise...] at ap + 1 (its
  // logits unused); `attend`: per sequence B one-token rows at ap + B in the same slot, in the
  // same order (the attention layout above). Error(kInvalidConfig) when the caches' rings cannot
  // hold a draft block past the window (shape.max_backtrack < dspark_block_size), so a model
  // loaded with short rings still runs, without drafting.
  DSparkOutput draft(const BatchPlan& plan, const BatchPlan& attend, ModelCaches& caches);

 private:
  Tensor attention(int block, const Tensor& x, const BatchPlan& plan, const BatchPlan& attend,
                   const Tensor& last_rows, ModelCaches& caches);

  DeepseekV41Model& model_;
  int max_backtrack_;
};

}  // namespace deepinfer
