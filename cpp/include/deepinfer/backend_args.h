// The argument and result structs of the Backend ops (deepinfer/backend.h): the mHC and Engram
// constants, the MoE routing and expert weights, the batch's device layout and compressed
// entries, the sampling rows and logit adjustments, the attention spec. Plain data over Tensors;
// backend.h has the ops' contracts.
#pragma once

#include <cstdint>
#include <vector>

#include "deepinfer/tensor.h"
#include "deepinfer/weight.h"

namespace deepinfer {

// Hyper-connection (mHC) constants of a model.
struct HcParams {
  int hc_mult = 4;
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;  // the unweighted RMSNorm over the flattened streams
};

// An RMSNorm that an op applies to the rows it makes or reads: row becomes rms_norm(row, weight,
// eps). The mHC ops norm their collapsed output y for the sub-layer; linear and linear_pair norm
// their input (a q-LoRA's norm before wq_b). Undefined weight: no norm. Part of the op so that a
// backend can norm rows in the same pass that makes or quantizes them (no launch of its own).
struct RowNorm {
  Tensor weight;  // [width of the row] f32
  float eps = 0.0f;
};

// Output of hc_pre: post [T, N], comb [T, N, N] (comb[i][j]: input stream i -> output stream j),
// and the collapsed block input y [T, H].
struct HcMix {
  Tensor post;
  Tensor comb;
  Tensor y;
};

// Output of hc_post_pre: the updated trunk [T, N, H] (hc_post's result) and the next
// sub-layer's hc_pre of it.
struct HcPostPre {
  Tensor trunk;
  HcMix mix;
};

// Output of hc_pre_shifted (V4.1 shifted mHC, docs/model.md#v41-ops): this sub-layer's pre [T, N]
// (for the next sub-layer's collapse), post [T, N], comb [T, N, N] as in HcMix, and the block
// input y [T, H] collapsed with the *previous* sub-layer's pre.
struct HcShiftedMix {
  Tensor pre;
  Tensor post;
  Tensor comb;
  Tensor y;
};

// Output of quantize_indexer_q: the indexer's q as e4m3 codes [T, h, Di] kF8E4M3 and its head
// weights [T, h] f32 times each row's power-of-two scale.
struct IndexerQFp8 {
  Tensor q;
  Tensor weights;
};

// Constants of one Engram layer's n-gram hash (V4.1, docs/model.md#v41-ops). n = multipliers.size()
// is the largest n-gram order (orders 2..n are hashed).
struct EngramHashParams {
  std::vector<int64_t> multipliers;  // M_l[0..n-1]: odd, positive
  std::vector<int64_t> primes;       // [(n-1) * heads], (order, head) order: each table's rows
  int heads = 0;
  int32_t pad_id = 0;  // cpad: the compressed id of positions before the sequence start
};

// Experts chosen per token: expert_ids [T, k] i32 and their weights [T, k] f32 (already
// renormalised and multiplied by routed_scaling_factor).
struct Routing {
  Tensor expert_ids;
  Tensor weights;
};

// Routed experts of one MoE layer, one weight per expert: w1 (gate) [I, H], w3 (up) [I, H],
// w2 (down) [H, I] (logical shapes). All of a layer's experts share one format.
struct ExpertWeights {
  std::vector<MatrixWeight> w1;
  std::vector<MatrixWeight> w3;
  std::vector<MatrixWeight> w2;
};

// Device-side layout of the token rows of one forward call. Rows of a sequence are contiguous;
// sequences may have any query length (varlen: prefill chunks and decode rows mix freely).
struct BatchLayout {
  int num_tokens = 0;
  int num_seqs = 0;
  int block_size = 128;        // tokens per paged KV block
  int max_blocks_per_seq = 0;  // columns of block_table
  Tensor token_ids;            // [T] i32
  Tensor positions;            // [T] i32, absolute position of each row
  Tensor token_seq;            // [T] i32, index of the sequence each row belongs to
  Tensor seq_q_start;          // [B + 1] i32, first row of each sequence; seq_q_start[B] == T
  Tensor seq_ctx_len;  // [B] i32, tokens already materialised in the caches before this call
  Tensor seq_slot;     // [B] i32, state slot (SWA ring, compressor rings) of each sequence
  Tensor block_table;  // [B, max_blocks_per_seq] i32, physical block of each logical block
};

// Compressed entries that close during one forward call, for one compression ratio m. Entry
// (seq, w) pools the tokens of window w, i.e. positions [w*m, (w+1)*m) (and, with overlap, the
// previous window's first half-series too). An entry with window -1 and dest -1 is padding (a
// fixed-shape batch replayed as a graph): compress_pool returns a zero row for it and
// scatter_rows does not store it.
struct EntryBatch {
  int num_entries = 0;
  Tensor seq;       // [E] i32, sequence index in the BatchLayout
  Tensor window;    // [E] i32, window index w
  Tensor rope_pos;  // [E] i32, RoPE position of the entry: w * m
  Tensor dest;      // [E] i32, row of the paged entry cache the entry is stored to
};

// Rows of a forward call planned before the previous step's speculative verification was known
// (zero-overhead scheduling, engine README "Drafting under zero-overhead scheduling"): row s with
// shift_from[s] = k >= 0 was placed as if that step's verify row k had accepted all max_shift[s]
// of its drafts; it accepted accepted[k] of them, so the row starts max_shift[s] - accepted[k]
// positions earlier. Backend::shift_rows moves such rows there on the device, rewriting the
// metadata below (views of the call's packed buffer, model/batch_plan.h) exactly as the host would
// have packed it from the true positions.
struct RowShift {
  // positions [T] and seq_ctx_len [B] rewritten; seq_q_start, block_table and block_size read.
  BatchLayout layout;
  Tensor next_positions;  // [S] i32, rewritten: the position after its token row's
  Tensor logit_rows;      // [S] i32, the token row of each logits row (undefined: row i, S == T)
  // [T] i32: every carried entry (>= 0) of a shifted row moves with it (undefined: none). A
  // carried verify row's tokens are laid out per logits row of the previous step, so all of
  // them move by the row's move.
  Tensor carry_remap;
  Tensor shift_from;  // [B] i32, -1: the row stays
  Tensor max_shift;   // [B] i32, drafts the plan assumed accepted
  Tensor accepted;    // [K] i32, drafts the previous step's verify rows accepted
  // Rows from num_real_seqs on are padding rows (a recorded graph's): they own no entries.
  int num_real_seqs = 0;
  // The entries of every compression ratio, recomputed from the new positions: one slot per row
  // (a decode graph's layout: slot s is row s's, window -1 where none closes), or dense in row
  // order with padding entries (seq = the last row, window -1, rope_pos 0, dest -1) after them.
  bool entry_per_row = false;
  std::vector<std::pair<int, EntryBatch>> entries;  // (ratio, its entries)
};

struct CompressSpec {
  int ratio = 4;         // m: tokens per window
  bool overlap = false;  // CSA: entry w pools window w-1's first series and window w's second
  int head_dim = 0;      // D: width of one entry
};

// Per-row sampling parameters on the device (one row per sequence). See cpp/src/sample/sampler.h
// for the exact semantics every backend must reproduce.
struct SamplingBatch {
  int num_rows = 0;
  int max_logprobs = 0;  // columns of the top-N outputs (0: none)
  Tensor temperature;    // [B] f32, 0 = greedy
  Tensor top_k;          // [B] i32, <= 0 = off
  Tensor top_p;          // [B] f32
  Tensor seed;           // [B] i64
  Tensor position;       // [B] i32, position of the token being generated
  Tensor num_logprobs;   // [B] i32, per-row N <= max_logprobs
};

// Host-computed changes to the logits before sampling (logit_bias, penalties, constraints; see
// SamplingParams): logits[rows[i], tokens[i]] += values[i] (each (row, token) pair at most
// once), then every token whose bit is clear in its row of `allowed` becomes -inf.
struct LogitAdjustments {
  Tensor rows;     // [N] i32
  Tensor tokens;   // [N] i32
  Tensor values;   // [N] f32
  Tensor allowed;  // [B, ceil(V / 32)] i32 bit set = allowed (bit t % 32 of word t / 32);
                   // undefined: every token allowed
};

struct SampleResult {
  Tensor tokens;        // [B] i32
  Tensor logprobs;      // [B] f32: log_softmax(logits)[token]
  Tensor top_ids;       // [B, max_logprobs] i32 (-1 past the row's N); undefined if max_logprobs 0
  Tensor top_logprobs;  // [B, max_logprobs] f32
};

struct AttentionSpec {
  int window = 128;     // sliding window W (keys in (p - W, p])
  float scale = 1.0f;   // softmax scale applied to q.k (not to the sink)
  int ratio = 0;        // compression ratio of the layer's entries; 0 = sliding only
  bool sparse = false;  // true: entries come from `topk`; false: all visible entries are used
  // The backend may round q, the keys and the probabilities to bf16 for tensor cores (f32
  // accumulation). Set for models whose matrix weights are bf16 (their activations already pass
  // through bf16 GEMMs); the CPU reference ignores it and stays f32.
  bool bf16_math = false;
  // The backend may return the output in bf16 (the f32 result rounded to nearest even) instead
  // of f32. Set by models whose consumer of the output (the inverse RoPE) takes either; halves
  // the bytes the kernel writes and the next op reads. The CPU reference ignores it and returns
  // f32; the CUDA backend honours it on its default Hopper kernel (and its combine).
  bool bf16_output = false;
  // RoPE channels at the end of each key: selects the main-KV record of kU8 and kE2M1x2 caches
  // (see "KV caches" in backend.h); ignored for f32, bf16 and kF8E4M3 caches.
  int rope_dim = 0;
  // [B] i32 or undefined (no bound): per sequence, the first position whose sliding key is
  // visible, so query p sees the sliding keys [max(p - W + 1, swa_start[b], 0), p]. DeepSeek-V4.1's
  // YOCO prefill truncation narrows the consumer layers' windows this way (engine.md 6.3).
  Tensor swa_start{};
  // [R] f32 or undefined (none): the output's last 2R channels of each head are rotated back at
  // the query's position, as rope(out, layout.positions, output_rope_inv_freq, inverse=true) does
  // (K == V carries RoPE, so the attention output does too). The result is then f32; where a
  // backend honours bf16_output it rounds the output to bf16 before the rotation (the values a
  // rope op after it would read). A backend may fuse it into its last kernel (the CUDA backend's
  // split combine).
  Tensor output_rope_inv_freq{};
};

}  // namespace deepinfer
