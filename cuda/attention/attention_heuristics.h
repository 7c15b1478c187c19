// How attention is cut into blocks: heads per block and key splits of the f32 kernel, and
// whether and with which plan (attention_plan.h) the tensor-core kernel runs. Host code on the
// problem's metadata only (shapes, the host's bound on the key list), never on device contents.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/attention/attention_args.h"
#include "cuda/attention/attention_f32_config.h"
#include "cuda/attention/attention_plan.h"
#include "cuda/attention/sm80/attention_mma_config.h"

namespace deepinfer::cuda {

struct AttentionProblem {
  int64_t tokens;
  int64_t heads;
  int64_t dim;
  int64_t max_keys;  // the host's bound on a token's key list (max_attention_keys)
};

struct AttentionF32Config {
  int64_t heads_per_block;
  int64_t hb_stride;
  int64_t head_groups;
  int64_t splits;
  size_t smem;
};

inline AttentionF32Config choose_attention_f32(const AttentionProblem& p, int num_sms) {
  AttentionF32Config c{};
  // Heads per block: the most whose q fits kAttnQFloats, a multiple of 8 (so the P.V phase's
  // (D/4) x (HB/8) threads fit the block), or all heads when fewer.
  const int64_t hb_cap = std::max<int64_t>(
      kAttnHeadsPerThread, kAttnQFloats / p.dim / kAttnHeadsPerThread * kAttnHeadsPerThread);
  c.heads_per_block = std::min(p.heads, hb_cap);
  c.hb_stride = (c.heads_per_block + 7) / 8 * 8;
  c.head_groups = (p.heads + c.heads_per_block - 1) / c.heads_per_block;
  c.smem = attn_smem_bytes(p.dim, c.heads_per_block, c.hb_stride);
  // Splits of each token's key list: enough blocks for two waves when tokens are few, at least
  // one tile of keys per split (by the host's bound on the list: W + entries).
  const int64_t blocks = p.tokens * c.head_groups;
  const int64_t target = 2 * static_cast<int64_t>(num_sms);
  c.splits = 1;
  if (blocks < target) {
    c.splits = std::min({(target + blocks - 1) / blocks, (p.max_keys + kAttnKeys - 1) / kAttnKeys,
                         int64_t{kAttnMaxSplits}});
    c.splits = std::max<int64_t>(1, c.splits);
  }
  return c;
}

struct AttentionMmaConfig {
  bool supported;  // false: the f32 kernel runs instead
  AttentionMmaPlan plan;
  size_t smem;
};

// The tensor-core kernel runs for D in {64, 128, 256, 512} when its shared memory fits the device
// and the head groups fit gridDim.y; attention_plan.h chooses its heads per block and key splits
// and whether the kernel merges the splits itself (with `counter_slots` counters).
inline AttentionMmaConfig choose_attention_mma(const AttentionProblem& p, int num_sms,
                                               size_t max_smem, int64_t max_splits,
                                               int64_t counter_slots,
                                               const AttentionMmaChoice& choice) {
  AttentionMmaConfig c{};
  c.smem = mma_smem_bytes(p.dim);
  c.plan = choose_mma_plan(p.tokens, p.heads, p.dim, p.max_keys, num_sms, max_splits,
                           kMmaOverheadTiles, counter_slots, choice);
  c.supported = c.smem > 0 && c.smem <= max_smem && c.plan.head_groups <= 65535;
  return c;
}

}  // namespace deepinfer::cuda
