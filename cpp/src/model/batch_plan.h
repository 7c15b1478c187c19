// The rows of one forward call, and the device metadata planned from them.
//
// A ForwardRow is one sequence's chunk of query tokens at positions [start_pos, start_pos +
// num_tokens), as the model reads it. The engine's scheduler emits StepRows that each embed one
// (the model reads them in place through a RowSpan); ModelRunner builds them from the public
// SequenceChunk. Everything the graph reads about a call (the BatchLayout, the compressed entries
// that close in it, the rows whose logits are wanted, carried tokens) is packed on the host into
// one i32 buffer and uploaded with one call, so the graph never reads the device. A recorded
// decode graph packs the same way into its own fixed-size buffer (BatchGeometry::padded, and
// BatchGeometry::padded_verify for steps with speculative verify rows).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "common/strided_span.h"
#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/model_runner.h"
#include "model/cache_tensors.h"

namespace deepinfer {

struct ForwardRow {
  int32_t slot = 0;
  int32_t start_pos = 0;
  int32_t num_tokens = 0;
  std::span<const int32_t> tokens;       // num_tokens host ids (tokens[0] unused when carried)
  std::span<const int32_t> block_table;  // physical block of each logical block
  // >= 0: tokens[0] is entry `token_from_previous` of the tokens the previous step sampled, still
  // on the device; the forward takes it from there (Backend::select_tokens) without a host sync.
  int32_t token_from_previous = -1;
  // With token_from_previous >= 0: tokens[j] for j < carried_tokens is entry token_from_previous
  // + j * carried_stride of those tokens (a verify row whose input token and drafts are all still
  // on the device, laid out per logits row of the previous step; Backend::shift_rows moves every
  // carried entry of a moved row). DeepSeek-V4 only: V4.1's Engram hashes carry one token.
  int32_t carried_tokens = 1;
  int32_t carried_stride = 0;
  // The forward returns the logits of this row's last `num_logits` tokens (0: none). One for a
  // decode row or a final prefill chunk; more when several positions are scored at once
  // (speculative verification).
  int32_t num_logits = 1;
  // The sequence's tokens before start_pos (the last ones at least; oldest first): DeepSeek-V4.1's
  // Engram layers hash each position's previous engram_max_ngram_size - 1 tokens. Unused by V4.
  std::span<const int32_t> history{};
  // The end of the prefill this row belongs to: the sequence's token count when the row was
  // scheduled (0: the row's own end, start_pos + num_tokens). DeepSeek-V4.1's YOCO prefill
  // truncation keeps the consumer layers' work in [prompt_end - keep, prompt_end) (engine.md 6.3),
  // so the chunks of one prefill agree on it.
  int32_t prompt_end = 0;
  // A KV tier hit replayed without its window state (kv_window_state bounded_replay,
  // docs/kv_store.md#window-state-on-a-hit): every sliding window of the row sees only keys at
  // positions >= swa_valid_start, and compressed entries of windows closing at or before
  // replay_end are not stored (the tiers supplied them); the compressor rings are still written.
  int32_t swa_valid_start = 0;
  int32_t replay_end = 0;
  // Zero-overhead scheduling with speculative verification: >= 0 when this row was planned as if
  // the previous step's verify row `shift_from` (its index among that step's verify rows) had
  // accepted all `max_shift` of its drafts. The forward then moves the row back by the drafts that
  // row rejected, on the device (Backend::shift_rows, shift_carried_rows), before anything reads
  // the metadata, so the host never waits for them.
  int32_t shift_from = -1;
  int32_t max_shift = 0;
};
using RowSpan = StridedSpan<const ForwardRow>;

struct BatchPlan {
  BatchLayout layout;
  // Entries closing in this call, per compression ratio used by the model.
  std::map<int, EntryBatch> entries;
  int num_logit_rows = 0;  // rows of the logits the forward returns (0: no lm_head at all)
  Tensor logit_rows;       // [S] i32 token rows whose logits are returned; undefined: every row
  Tensor next_positions;   // [S] i32, the position of the token each logits row predicts
  Tensor carry_remap;      // [T] i32, previous-step index or -1; undefined when nothing carries
  // [B] i32 ForwardRow::swa_valid_start (AttentionSpec::swa_start); undefined when no row has one.
  Tensor swa_start;
  // [E] i32 token rows of the ratio-1 entries (DeepSeek-V4.1's C1: one per token) when a replay
  // stores fewer of them than the call has tokens; undefined: one per token row, in order.
  Tensor entry_rows;
  // [B] i32 ForwardRow::shift_from and max_shift; undefined when no row may move (an exact
  // batch without such rows).
  Tensor shift_from;
  Tensor max_shift;
  bool entry_per_row = false;  // BatchGeometry::entry_per_row
  Tensor metadata;             // the device buffer every tensor above is a view of
};

// Checks the rows against the config and cache shape; every error (Error(kInvalidArgument)) names
// the row index and the field. `check_tokens` also checks each token id against the vocabulary
// (the engine checks prompts once, at admission). Returns the longest block table (at least 1).
size_t validate_rows(RowSpan rows, const ModelConfig& config, const CacheShape& caches,
                     bool check_tokens);

// The distinct compression ratios of the model's compressed layers (MTP blocks included),
// ascending.
std::vector<int> compress_ratios(const ModelConfig& config);

// The sizes of a packed batch: exact for an eager call, padded to a bucket for a recorded graph.
struct BatchGeometry {
  int num_seqs = 0;     // rows, padding rows included
  int num_tokens = 0;   // token rows
  int table_width = 1;  // block-table columns
  // Entries per ratio, in compress_ratios order. A padded (graph) batch has one per row, with
  // window -1 where no window closes.
  std::vector<int> num_entries;
  bool entry_per_row = false;
  // Rows past the call's are padding rows that take every token row the real rows leave (at
  // least one each), and entry slots past the real entries are padding (window -1, dest -1).
  bool has_padding = false;
  bool all_logits = false;  // logits of every token row (logit_rows stays undefined)
  int num_logit_rows = 0;
  bool carry = false;      // carry_remap is present
  bool swa_start = false;  // swa_start is present (a row has a swa_valid_start)
  int entry_rows = 0;      // entry_rows' length (0: absent)
  // shift_from and max_shift are present: in a recorded graph's batch always, in an exact one when
  // a row may move (ForwardRow::shift_from); its entries then have room for the most that row can
  // close wherever it lands.
  bool shift = false;

  // The exact geometry of `rows` (`max_blocks` from validate_rows).
  static BatchGeometry exact(RowSpan rows, const std::vector<int>& ratios, size_t max_blocks,
                             LogitsMode mode);
  // A decode batch (one token per row) padded to `bucket` rows and `width` table columns, with
  // logits and a carry remap for every row.
  static BatchGeometry padded(int bucket, int width, size_t num_ratios);
  // A step with speculative verify rows (rows of up to a few tokens, each wanting the logits of
  // all of them), as a recorded graph holds it: up to `bucket` real rows of at most
  // bucket * row_tokens tokens in all (counting one per padding row), plus one padding row, so
  // bucket + 1 rows and bucket * row_tokens + 1 token rows; logits of every token row, a carry
  // remap, and per ratio the most entries such rows can close (padded_verify_entries).
  static BatchGeometry padded_verify(int bucket, int row_tokens, int width,
                                     const std::vector<int>& ratios);
  // The most compressed entries of `ratio` that rows of padded_verify(bucket, row_tokens) can
  // close: a row of n tokens closes at most ceil(n / ratio), and the rows hold at most
  // bucket * row_tokens tokens (at most kMaxPaddedRowTokens each) in at most `bucket` rows.
  static int padded_verify_entries(int bucket, int row_tokens, int ratio);
  // The most tokens a row of a padded_verify batch may have: the last committed token and up to 5
  // drafts (the rings' max_backtrack slack, engine README "Speculative decoding").
  static constexpr int kMaxPaddedRowTokens = 6;
  int64_t size() const;  // i32 elements of the packed buffer
};

// Writes the metadata of `rows` laid out as `geometry` into `host` (resized). Padding rows (past
// rows.size()) are one-token sequences at position 0 in `scratch_slot`, with a zero block table
// and padding entries (window -1, dest -1): they write only state no caller owns. In a
// padded_verify geometry the padding rows share the token rows the real rows leave as evenly as
// they can (each a sequence at positions 0, 1, ... of `scratch_slot`, none of whose entries is
// stored). Error(kInvalidArgument) when `rows` do not fit `geometry`.
void pack_batch(RowSpan rows, const BatchGeometry& geometry, const std::vector<int>& ratios,
                int block_size, int32_t scratch_slot, std::vector<int32_t>& host);
// The plan whose tensors are views of `metadata` (a device i32 buffer of geometry.size()).
BatchPlan plan_views(const Tensor& metadata, const BatchGeometry& geometry,
                     const std::vector<int>& ratios, int block_size);

// Rows whose first token is still on the device (token_from_previous >= 0) take it from
// `previous` ([P] i32, the previous step's sampled tokens): plan.layout.token_ids is patched in
// place on the device. Enqueues nothing when no row carries. Call it after shift_carried_rows,
// which moves a shifted row's carried token index with the row.
void take_carried_tokens(Backend& backend, RowSpan rows, const BatchPlan& plan,
                         const Tensor& previous);

// Rows planned before the previous step's verification was known (ForwardRow::shift_from) moved
// to where its accepted drafts put them: `accepted` [K] i32, the previous step's accepted drafts
// per verify row, still on the device. Enqueues nothing when no row moves.
void shift_carried_rows(Backend& backend, RowSpan rows, const BatchPlan& plan,
                        const Tensor& accepted);
// The RowShift shift_carried_rows hands the backend: `plan`'s views (its first `num_real_seqs`
// rows are real, the rest padding) and the accepted counts.
RowShift row_shift_of(const BatchPlan& plan, int num_real_seqs, const Tensor& accepted);

// Packs `rows` exactly, uploads the buffer in one call and returns the plan over it.
BatchPlan build_batch_plan(RowSpan rows, const ModelConfig& config, const CacheShape& caches,
                           Backend& backend, LogitsMode mode, size_t max_blocks);

}  // namespace deepinfer
