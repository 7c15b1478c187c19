// Inputs the Hopper attention kernels' GPU tests share (test_attention_wgmma_overlap.cpp,
// test_attention_wgmma_small_batch.cpp, test_attention_wgmma_keysplit.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "batch_layout.h"
#include "deepinfer/backend.h"
#include "deepinfer/tensor.h"
#include "device_backends.h"
#include "inputs.h"
#include "kv_inputs.h"

namespace deepinfer::backend_ops {

// Decode rows (s_q each) of `batch` sequences at contexts spread over first .. first + span (as
// the op table's decode_seqs), sequence i in state slot i.
inline std::vector<SeqSpec> spread_batch(int batch, int s_q, int first = 200, int span = 3900) {
  std::vector<SeqSpec> seqs;
  for (int i = 0; i < batch; ++i) seqs.push_back({first + (i * 997) % span, s_q, i});
  return seqs;
}

// Random rows of `dim` channels as a cache of `kv` holds them.
inline Tensor random_cache_rows(std::mt19937& rng, const Shape& lead, int64_t dim, int rope,
                                DType kv) {
  Shape shape = lead;
  shape.push_back(dim);
  return encode_kv_rows(random_f32(rng, shape), kv, rope);
}

// One attention call's inputs on `be` at V4 widths (512 channels with 64 RoPE channels, W = 128,
// ring 134, blocks of 128): f32 q, this call's kv rows, the ring and entries in the cache format
// `kv`, CSA's top-512 (ratio 4) or HCA's dense entries (ratio 128), sinks up to +-4 (comparable
// with the logits, so a sink dropped or added twice shows), drawn from `rng` in this order.
struct V4AttentionInputs {
  static constexpr int kDim = 512, kRope = 64, kWindow = 128, kRingLen = 134, kBlock = 128;
  HostBatch hb;
  int64_t tokens = 0;
  Tensor q_f32, kv_rows, ring, entries, topk, sinks;
  BatchLayout layout;
  AttentionSpec spec;

  V4AttentionInputs(Backend& be, std::mt19937& rng, const std::vector<SeqSpec>& seqs, int heads,
                    int ratio, DType kv)
      : hb(rng, seqs, kBlock), tokens(hb.num_tokens()) {
    int slots = 0;
    for (const SeqSpec& s : seqs) slots = std::max(slots, s.slot + 1);
    const bool sparse = ratio == 4;
    q_f32 = up(be, random_f32(rng, {tokens, heads, kDim}));
    kv_rows = up(be, random_f32(rng, {tokens, kDim}));
    ring = up_same(be, random_cache_rows(rng, {slots, kRingLen}, kDim, kRope, kv));
    entries = up_same(
        be, random_cache_rows(rng, {int64_t{hb.num_blocks} * (kBlock / ratio)}, kDim, kRope, kv));
    topk = sparse ? up(be, random_topk(rng, hb, ratio, 512)) : Tensor();
    sinks = up(be, random_f32(rng, {heads}, 4.0f));
    layout = hb.upload(be);
    spec = AttentionSpec{kWindow, 1.0f / std::sqrt(float(kDim)), ratio, sparse};
    spec.bf16_math = true;
    spec.rope_dim = kRope;
  }
};

}  // namespace deepinfer::backend_ops
