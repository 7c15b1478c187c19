// The multi-token-prediction (MTP) drafter: DeepSeek-V4's mtp.K.* blocks run on the Backend ops
// (docs/model.md#mtp-block).
//
// A pass reads, at each position p of its rows, the HC trunk the main model left at p (or a
// previous pass's output trunk, when drafting further ahead) and the token at p + 1, and yields
// logits for the token at p + 2. Its attention keeps its own caches (ModelCaches layer
// num_hidden_layers + K) in the sequences' slots and blocks; positions written by drafts that
// are later rejected are simply overwritten by the next pass over them.
#pragma once

#include "deepinfer/backend.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/deepseek_v4.h"

namespace deepinfer {

struct MtpOutput {
  Tensor logits;  // [plan.num_logit_rows, V] f32; undefined when no row wants logits
  Tensor hidden;  // [plan.num_logit_rows, N, H]: the block's HC trunk at the logits rows
};

class MtpDrafter {
 public:
  // The drafter over `model`'s weights().mtp blocks (at least one) and its shared embedding and
  // head.
  explicit MtpDrafter(DeepseekV4Model& model);

  int num_blocks() const { return static_cast<int>(model_.weights().mtp.size()); }

  // Enqueues one pass of block `step % num_blocks()` (draft step `step`: step 0 reads the main
  // model's trunk, step j > 0 the trunk of step j - 1). The plan's token ids are the tokens at
  // p + 1; `hidden` [T, hc_mult, H] f32 holds the trunk at the plan's T token rows.
  MtpOutput forward(const BatchPlan& plan, const Tensor& hidden, ModelCaches& caches, int step);

 private:
  DeepseekV4Model& model_;
};

}  // namespace deepinfer
