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
// DeepSeek-V4.1 (deepseek_v41.h) is recorded the same way. Its Engram n-grams, built on the host
// from each row's `history`, are one more per-recording input buffer [bucket, n], refreshed with
// upload_into before each replay; a carried token is patched into it on the device (select_tokens
// with a remap staged the same way), as into the metadata. Calls whose rows YOCO prefill
// truncation narrows run eagerly (accepts() is false): the recording passes no consumer rows.
// With keep >= sliding_window (validated) neither a decode row nor a prefill's last one-token
// chunk is narrowed; a one-token chunk inside a longer prefill that asks for its logits (a
// ModelRunner call) can be.
#pragma once

#include <atomic>
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

  // True for 1 to max_batch() rows of one token each, each wanting that token's logits (for
  // V4.1, none of them narrowed by YOCO prefill truncation).
  bool accepts(RowSpan rows) const;
  // Enqueues the forward of `rows` (accepts() must hold; `max_blocks` is validate_rows' result)
  // and returns the device logits [B, vocab] and next positions [B]. They stay valid until the
  // next call enqueues its replay (stream order), so read them (sample, copy) before that. Rows
  // with token_from_previous >= 0 take their token from `previous_tokens` on the device (V4.1:
  // in their Engram n-grams too).
  struct Output {
    Tensor logits;
    Tensor next_positions;
  };
  Output forward(RowSpan rows, size_t max_blocks, const Tensor& previous_tokens);

  int max_batch() const { return max_batch_; }
  // Counters (readable from any thread): recordings made, forward calls served.
  DecodeGraphStats stats() const { return {num_recorded_.load(), num_calls_.load()}; }

 private:
  struct Recording;
  DecodeGraphs(const ModelConfig& config, DeepseekV4Model* model, DeepseekV41Model* v41_model,
               ModelCaches& caches, Backend& backend, int max_batch, int scratch_slot);
  Recording& recording_for(int bucket, int width);
  // V4.1 with Engram layers: stages `rows`' n-grams in `rec` and patches carried tokens in.
  void stage_ngrams(RowSpan rows, Recording& rec, const Tensor& previous_tokens);

  const ModelConfig& config_;
  DeepseekV4Model* model_;  // exactly one of these two is set
  DeepseekV41Model* v41_model_;
  ModelCaches& caches_;
  Backend& backend_;
  int max_batch_;
  int scratch_slot_;
  std::vector<int> buckets_;
  std::vector<int> ratios_;
  Tensor logits_;  // [max_batch, vocab] f32, shared by every recording
  std::map<std::pair<int, int>, std::unique_ptr<Recording>> recordings_;
  std::vector<int32_t> host_metadata_;  // reused staging
  std::vector<int32_t> host_ngram_;     // reused staging (V4.1 Engram n-grams and their remap)
  std::vector<int32_t> host_remap_;
  std::atomic<int> num_recorded_{0};
  std::atomic<uint64_t> num_calls_{0};
};

}  // namespace deepinfer
