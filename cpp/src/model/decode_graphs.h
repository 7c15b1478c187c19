// DecodeGraphs: decode steps (one token per sequence) replayed as recorded graphs.
//
// A decode step launches a few hundred small kernels whose launch cost alone is comparable to
// their run time at small batches. Recording the forward once per shape and replaying it makes a
// step one graph launch. A recording fixes every tensor address and every launch parameter, so:
//  - batches are padded to a bucket of sequences (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, ...)
//    and block tables to a power-of-two width; each (bucket, width) pair is recorded once, on
//    first use (that step runs eagerly, then the recording is made without running it);
//  - the step's metadata (batch_plan.h, packed with BatchGeometry::padded) lives in one device
//    buffer per recording, refreshed with a single upload_into before each replay; carried
//    tokens are then patched into it on the device;
//  - padding rows are one-token sequences at position 0 in a scratch state slot that no caller
//    owns, with padding entries (window -1, dest -1) that store nothing: they read and write
//    nothing a real sequence uses, and real rows never read theirs;
//  - logits land in one [largest bucket, vocab] buffer shared by all recordings (replays are
//    serialised on the stream), and forward returns a view of its first B rows.
// Steps with speculative verify rows (the last committed token and d <= 5 drafts, every one
// wanting its logits; engine README "Speculative decoding"), mixed with plain decode rows, are
// recorded too (BatchGeometry::padded_verify), keyed by (bucket, row_tokens, width): the rows
// keep their own token counts in the device metadata (the layout is ragged, as an eager call's
// is), and row_tokens = ceil((real tokens + padding rows) / bucket) sizes the call at
// bucket * row_tokens + 1 token rows over bucket + 1 rows. The padding rows (at least the one past
// the bucket) take every token row the real rows leave, as sequences at positions 0, 1, ... of
// the scratch slot with padding entries, so, as above, they write nothing a real sequence uses
// and real rows never read theirs. This was chosen over padding every row to the batch's longest
// (a plain row padded with tokens would write past its position into its own slot's rings, which
// a real sequence does use) and over per-row shapes (one recording per mix): real rows are packed
// exactly as an eager call packs them, only the padding differs, so a verify replay computes what
// the eager call does, and a batch of 63 plain rows and one 5-token row runs 129 token rows, not
// 64 * 5. Their compressed entries are packed as an eager call's (those that close), followed by
// padding entries up to the most such rows can close. Their logits fill a second buffer of
// [kMaxVerifyBatch * 6 + 1, vocab] rows, made on the first verify step; forward returns the first
// (real tokens) rows, which are the rows' logits in order since every row wants all of its own.
// Verify steps of more than kMaxVerifyBatch rows run eagerly, as do V4.1's (its ratio-1 entries
// are read one per token row, which the padding would break) and MTP-drafting steps
// (ModelInstance::forward_with_mtp never replays).
// DeepSeek-V4.1 (deepseek_v41.h) decode steps are recorded the same way. Its Engram n-grams, built
// on the host from each row's `history`, are one more per-recording input buffer [bucket, n],
// refreshed with upload_into before each replay; a carried token is patched into it on the device
// (select_tokens with a remap staged the same way), as into the metadata. Calls whose rows YOCO
// prefill truncation narrows run eagerly (accepts() is false): the recording passes no consumer
// rows. With keep >= sliding_window (validated) neither a decode row nor a prefill's last one-token
// chunk is narrowed; a one-token chunk inside a longer prefill that asks for its logits (a
// ModelRunner call) can be.
#pragma once

#include <atomic>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "deepinfer/backend.h"
#include "deepinfer/config.h"
#include "deepinfer/model_runner.h"
#include "model/batch_plan.h"
#include "model/cache_tensors.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v41.h"

namespace deepinfer {

class DecodeGraphs {
 public:
  // Buckets up to `max_batch` sequences; padding rows use state slot `scratch_slot` of `caches`.
  DecodeGraphs(const ModelConfig& config, DeepseekV4Model& model, ModelCaches& caches,
               Backend& backend, int max_batch, int scratch_slot);
  // The same for DeepSeek-V4.1 (config.v41 set; caches in the V4.1 layout).
  DecodeGraphs(const ModelConfig& config, DeepseekV41Model& model, ModelCaches& caches,
               Backend& backend, int max_batch, int scratch_slot);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // The bucket sizes used up to `max_batch` (ascending, the last one is max_batch).
  static std::vector<int> buckets_up_to(int max_batch);

  // The most rows a step with verify rows may have to be replayed.
  static constexpr int kMaxVerifyBatch = 64;

  // True for 1 to max_batch() rows of one token each, each wanting that token's logits (for
  // V4.1, none of them narrowed by YOCO prefill truncation), and for 1 to max_verify_batch() rows
  // of 1 to BatchGeometry::kMaxPaddedRowTokens tokens each, each wanting all of its logits
  // (num_logits == num_tokens, or `mode` kAll).
  bool accepts(RowSpan rows, LogitsMode mode = LogitsMode::kLast) const;

  // The row shapes accepts() takes (host logic, on the rows alone): every row wants the logits
  // of all its tokens (num_logits == num_tokens, or `mode` kAll), one (then up to `max_batch`
  // rows) or up to kMaxPaddedRowTokens (then up to `max_verify_batch` rows; 0: none).
  static bool rows_fit(RowSpan rows, LogitsMode mode, int max_batch, int max_verify_batch);
  // The recording a call of `rows` (rows_fit) replays: `bucket` real rows at most (the smallest
  // of `buckets` that holds them), row_tokens 1 for a decode step (BatchGeometry::padded) or
  // ceil((tokens + padding rows) / bucket) for a step with a verify row
  // (BatchGeometry::padded_verify), and the block-table width, a power of two >= 16 and
  // >= max_blocks.
  struct Shape {
    int bucket = 0;
    int row_tokens = 1;
    int width = 0;
    auto operator<=>(const Shape&) const = default;
  };
  static Shape shape_for(RowSpan rows, const std::vector<int>& buckets, size_t max_blocks);
  // Enqueues the forward of `rows` (accepts(rows, mode) must hold; `max_blocks` is
  // validate_rows' result) and returns the device logits [T, vocab] and next positions [T] of
  // the rows' T tokens (B for a decode step). They stay valid until the
  // next call enqueues its replay (stream order), so read them (sample, copy) before that. Rows
  // with token_from_previous >= 0 take their token from `previous_tokens` on the device (V4.1:
  // in their Engram n-grams too).
  struct Output {
    Tensor logits;
    Tensor next_positions;
  };
  Output forward(RowSpan rows, size_t max_blocks, const Tensor& previous_tokens,
                 LogitsMode mode = LogitsMode::kLast);

  int max_batch() const { return max_batch_; }
  // The most rows of a replayed step with verify rows: min(max_batch, kMaxVerifyBatch), 0 for
  // V4.1 (its verify steps run eagerly).
  int max_verify_batch() const { return max_verify_batch_; }
  // Counters (readable from any thread): recordings made, forward calls served, and those of
  // them with a verify row.
  DecodeGraphStats stats() const {
    return {num_recorded_.load(), num_calls_.load(), num_verify_calls_.load()};
  }

 private:
  struct Recording;
  DecodeGraphs(const ModelConfig& config, DeepseekV4Model* model, DeepseekV41Model* v41_model,
               ModelCaches& caches, Backend& backend, int max_batch, int scratch_slot);
  Recording& recording_for(const Shape& shape);
  // V4.1 with Engram layers: stages `rows`' n-grams in `rec` and patches carried tokens in.
  void stage_ngrams(RowSpan rows, Recording& rec, const Tensor& previous_tokens);

  const ModelConfig& config_;
  DeepseekV4Model* model_;  // exactly one of these two is set
  DeepseekV41Model* v41_model_;
  ModelCaches& caches_;
  Backend& backend_;
  int max_batch_;
  int max_verify_batch_;
  int scratch_slot_;
  std::vector<int> buckets_;
  std::vector<int> ratios_;
  Tensor logits_;  // [max_batch, vocab] f32, shared by every decode recording
  // [max_verify_batch * kMaxPaddedRowTokens + 1, vocab] f32, shared by every verify recording
  Tensor verify_logits_;
  std::map<Shape, std::unique_ptr<Recording>> recordings_;
  std::vector<int32_t> host_metadata_;  // reused staging
  std::vector<int32_t> host_ngram_;     // reused staging (V4.1 Engram n-grams and their remap)
  std::vector<int32_t> host_remap_;
  std::atomic<int> num_recorded_{0};
  std::atomic<uint64_t> num_calls_{0};
  std::atomic<uint64_t> num_verify_calls_{0};
};

}  // namespace deepinfer
