#include "model/mtp.h"

#include <string>

#include "deepinfer/error.h"

namespace deepinfer {

MtpDrafter::MtpDrafter(DeepseekV4Model& model) : model_(model) {
  if (model.weights().mtp.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "MtpDrafter: the model has no mtp.* block loaded");
  }
}

MtpOutput MtpDrafter::forward(const BatchPlan& plan, const Tensor& hidden, ModelCaches& caches,
                              int step) {
  Backend& be = model_.backend();
  const ModelConfig& config = model_.config();
  const ModelWeights& weights = model_.weights();
  const BatchLayout& layout = plan.layout;
  const int64_t t = layout.num_tokens;
  const int64_t n = config.hc_mult;
  const int64_t h = config.hidden_size;
  if (step < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "MTP forward: 'step' must be >= 0, got " + std::to_string(step));
  }
  if (hidden.dtype() != DType::kF32 || hidden.shape() != Shape{t, n, h}) {
    throw Error(ErrorCode::kInvalidArgument,
                "MTP forward: 'hidden' must be f32 " + shape_str({t, n, h}) +
                    " (the HC trunk at the batch's token rows), got " + hidden.describe());
  }
  const int block = step % num_blocks();
  const MtpWeights& w = weights.mtp[static_cast<size_t>(block)];
  const int layer = config.num_hidden_layers + block;
  const float eps = static_cast<float>(config.rms_norm_eps);

  // DeepSeek's MTPBlock.forward (docs/model.md#mtp-block): the next token's normed embedding,
  // projected once and added to every stream, plus each stream of the normed incoming trunk
  // projected on its own; then one decoder layer with mHC, and the block's own HC head and norm
  // in front of the shared head.
  Tensor e =
      be.linear(be.rms_norm(be.embedding(weights.embed, layout.token_ids), w.enorm, eps), w.e_proj);
  Tensor streams = be.rms_norm(hidden, w.hnorm, eps).reshape({t * n, h});
  Tensor x =
      be.add(be.hc_expand(e, config.hc_mult), be.linear(streams, w.h_proj).reshape({t, n, h}));
  x = model_.decoder_layer(layer, w.block, x, plan, caches.layer(layer));
  if (plan.num_logit_rows == 0) return {};
  if (plan.logit_rows.defined()) x = be.gather_rows(x, plan.logit_rows);
  return {model_.head(x, w.hc_head, w.norm), x};
}

}  // namespace deepinfer
