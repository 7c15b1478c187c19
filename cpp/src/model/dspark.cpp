#include "model/dspark.h"

#include <cmath>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/graph_blocks.h"

namespace deepinfer {

DSparkDrafter::DSparkDrafter(DeepseekV41Model& model, const CacheShape& shape)
    : model_(model), max_backtrack_(shape.max_backtrack) {
  if (model.weights().dspark.blocks.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "DSparkDrafter: the model has no DSpark drafter loaded (no mtp.* tensors in the "
                "checkpoint, or they were not requested)");
  }
}

Tensor DSparkDrafter::attention(int block, const Tensor& x, const BatchPlan& plan,
                                const BatchPlan& attend, const Tensor& last_rows,
                                ModelCaches& caches) {
  Backend& be = model_.backend();
  const V41TextConfig& c = model_.config();
  const V41LayerWeights& lw = model_.weights().dspark.blocks[static_cast<size_t>(block)];
  const V41AttentionWeights& w = lw.attn;
  const BatchLayout& layout = plan.layout;
  const int64_t t = layout.num_tokens;
  const int64_t nh = c.num_attention_heads;
  const int64_t d = c.head_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  LayerCaches& own = caches.layer(c.num_hidden_layers + block);

  const Tensor qa = be.rms_norm(be.linear(x, w.wq_a), w.q_norm, eps);
  const Tensor q = be.rope(be.linear(qa, w.wq_b).reshape({t, nh, d}), layout.positions, lw.inv_freq,
                           /*inverse=*/false);
  const Tensor kv =
      be.rms_norm_rope(be.linear(x, w.wkv), w.kv_norm, eps, layout.positions, lw.inv_freq);
  // The draft keys go to the ring first: the attention rows (one per query, at ap + B) read
  // ap + 1 .. ap + B - 1 from it and ap + B, their own "chunk", from `kv` (last_rows).
  be.ring_write(own.swa_ring, kv, layout, own.rope_dim);
  AttentionSpec spec;
  spec.window = c.sliding_window + c.dspark_block_size;
  spec.scale = 1.0f / std::sqrt(static_cast<float>(d));
  spec.ratio = 0;
  spec.rope_dim = own.rope_dim;
  const Tensor out = be.attention(q, be.gather_rows(kv, last_rows), own.swa_ring, Tensor(),
                                  Tensor(), w.sinks, attend.layout, spec);
  // Rotated back at the drafted positions (layout's), not the attention rows' (attend's).
  const Tensor back = be.rope(out, layout.positions, lw.inv_freq, /*inverse=*/true);
  return attention_output(be, back, w.wo_a, w.wo_b, c.o_groups);
}

DSparkOutput DSparkDrafter::draft(const BatchPlan& plan, const BatchPlan& attend,
                                  ModelCaches& caches) {
  Backend& be = model_.backend();
  const V41TextConfig& c = model_.config();
  const V41Weights& weights = model_.weights();
  const DSparkWeights& d = weights.dspark;
  const BatchLayout& layout = plan.layout;
  const int64_t b = c.dspark_block_size;
  const int64_t s = layout.num_seqs;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  if (max_backtrack_ < b) {
    throw Error(ErrorCode::kInvalidConfig,
                c.source + ": dspark_block_size = " + std::to_string(b) +
                    " needs SWA rings of at least sliding_window + " + std::to_string(b) +
                    " positions (a draft block's keys past the window), but the caches' "
                    "max_backtrack is " +
                    std::to_string(max_backtrack_));
  }
  if (layout.num_tokens != s * b || attend.layout.num_tokens != s * b ||
      attend.layout.num_seqs != s * b) {
    throw Error(ErrorCode::kInvalidArgument,
                "DSpark draft: expected " + std::to_string(s) + " rows of dspark_block_size = " +
                    std::to_string(b) + " tokens and as many one-token attention rows, got " +
                    std::to_string(layout.num_tokens) + " tokens and " +
                    std::to_string(attend.layout.num_tokens) + " attention rows");
  }
  // Token rows by draft index: rows [i * S, (i + 1) * S) hold draft i of every sequence; the
  // last draft's rows are each attention row's own key.
  std::vector<int32_t> by_index(static_cast<size_t>(s * b)), last(static_cast<size_t>(s * b));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t q = 0; q < s; ++q) {
      by_index[static_cast<size_t>(i * s + q)] = static_cast<int32_t>(q * b + i);
      last[static_cast<size_t>(q * b + i)] = static_cast<int32_t>(q * b + b - 1);
    }
  }
  const Tensor index_rows = be.upload(Tensor::from_vector(by_index, {s * b}), DType::kI32);
  const Tensor last_rows = be.upload(Tensor::from_vector(last, {s * b}), DType::kI32);

  Tensor trunk = be.hc_expand(be.embedding(weights.embed, layout.token_ids), c.hc_mult);
  Tensor pre;  // the first sub-layer reads stream 0, as the main model's (C.4)
  for (size_t k = 0; k < d.blocks.size(); ++k) {
    const V41LayerWeights& w = d.blocks[k];
    HcShiftedMix mix = be.hc_pre_shifted(trunk, w.hc_attn.fn, w.hc_attn.base, w.hc_attn.scale, pre,
                                         model_.hc_params());
    const Tensor attn_out = attention(static_cast<int>(k), be.rms_norm(mix.y, w.attn_norm, eps),
                                      plan, attend, last_rows, caches);
    trunk = be.hc_post(trunk, attn_out, mix.post, mix.comb);
    pre = mix.pre;
    mix = be.hc_pre_shifted(trunk, w.hc_ffn.fn, w.hc_ffn.base, w.hc_ffn.scale, pre,
                            model_.hc_params());
    const Tensor ffn_out = model_.moe(w.ffn, be.rms_norm(mix.y, w.ffn_norm, eps), layout.token_ids,
                                      c.dspark_num_experts_per_tok);
    trunk = be.hc_post(trunk, ffn_out, mix.post, mix.comb);
    pre = mix.pre;
  }
  const Tensor h = be.hc_collapse(trunk, pre);  // [S*B, H], before the norm
  const Tensor base = be.linear(be.rms_norm(h, d.norm, eps), weights.head);

  DSparkOutput out;
  // Draft 0's Markov input is the golden token (each row's first token).
  Tensor prev = be.gather_rows(layout.token_ids, index_rows.narrow(0, 0, s));
  for (int64_t i = 0; i < b; ++i) {
    const Tensor rows = index_rows.narrow(0, i * s, s);
    const Tensor markov = be.embedding(d.markov_embed, prev);  // [S, R]
    const Tensor logits = be.add(be.gather_rows(base, rows), be.linear(markov, d.markov_head));
    out.confidence.push_back(be.add(be.linear(be.gather_rows(h, rows), d.confidence_hidden),
                                    be.linear(markov, d.confidence_markov)));
    prev = be.argmax(logits);
    out.tokens.push_back(prev);
    out.logits.push_back(logits);
  }
  return out;
}

}  // namespace deepinfer
