#include "model/decode_graphs.h"

#include <algorithm>
#include <bit>
#include <string>

#include "deepinfer/error.h"
#include "model/yoco_rows.h"

namespace deepinfer {

namespace {

// Narrowest block-table width recorded: short contexts share one recording.
constexpr int kMinTableWidth = 16;

}  // namespace

// One recorded step: its metadata buffer (which the plan's tensors view), for V4.1 with Engram
// layers its n-grams and their carry remap, and the graph.
struct DecodeGraphs::Recording {
  BatchGeometry geometry;
  BatchPlan plan;
  Tensor ngram;        // [bucket, n] i32
  Tensor ngram_remap;  // [bucket * n] i32
  std::unique_ptr<Graph> graph;
};

std::vector<int> DecodeGraphs::buckets_up_to(int max_batch) {
  std::vector<int> buckets;
  for (int b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256}) {
    if (b < max_batch) buckets.push_back(b);
  }
  for (int b = 320; b < max_batch; b += 64) buckets.push_back(b);
  if (max_batch > 0) buckets.push_back(max_batch);
  return buckets;
}

DecodeGraphs::DecodeGraphs(const ModelConfig& config, DeepseekV4Model& model, ModelCaches& caches,
                           Backend& backend, int max_batch, int scratch_slot)
    : DecodeGraphs(config, &model, nullptr, caches, backend, max_batch, scratch_slot) {}

DecodeGraphs::DecodeGraphs(const ModelConfig& config, DeepseekV41Model& model, ModelCaches& caches,
                           Backend& backend, int max_batch, int scratch_slot)
    : DecodeGraphs(config, nullptr, &model, caches, backend, max_batch, scratch_slot) {
  if (config.v41 == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode graphs of a DeepSeek-V4.1 model need its config (ModelConfig::v41 is "
                "null)");
  }
}

DecodeGraphs::DecodeGraphs(const ModelConfig& config, DeepseekV4Model* model,
                           DeepseekV41Model* v41_model, ModelCaches& caches, Backend& backend,
                           int max_batch, int scratch_slot)
    : config_(config),
      model_(model),
      v41_model_(v41_model),
      caches_(caches),
      backend_(backend),
      max_batch_(max_batch),
      max_verify_batch_(0),
      scratch_slot_(scratch_slot),
      buckets_(buckets_up_to(max_batch)),
      ratios_(compress_ratios(config)) {
  // V4.1 (ratio-1 entries, Engram n-grams, YOCO) keeps its verify steps eager.
  const bool has_ratio_one = std::find(ratios_.begin(), ratios_.end(), 1) != ratios_.end();
  if (v41_model == nullptr && !has_ratio_one) {
    max_verify_batch_ = std::min(max_batch, kMaxVerifyBatch);
  }
  if (max_batch < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode graphs need max_batch >= 1, got " + std::to_string(max_batch));
  }
  const int slots = caches.shape().num_state_slots + caches.shape().num_scratch_slots;
  if (scratch_slot < caches.shape().num_state_slots || scratch_slot >= slots) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode graphs need a scratch state slot outside the callers' [0, " +
                    std::to_string(caches.shape().num_state_slots) + "), got " +
                    std::to_string(scratch_slot) + " of " + std::to_string(slots));
  }
}

DecodeGraphs::~DecodeGraphs() = default;

bool DecodeGraphs::rows_fit(RowSpan rows, LogitsMode mode, int max_batch, int max_verify_batch) {
  if (rows.empty()) return false;
  bool verify = false;
  for (const ForwardRow& r : rows) {
    if (r.num_tokens < 1) return false;
    if (mode != LogitsMode::kAll && r.num_logits != r.num_tokens) return false;
    if (r.num_tokens > BatchGeometry::kMaxPaddedRowTokens) return false;
    verify = verify || r.num_tokens > 1;
  }
  return static_cast<int>(rows.size()) <= (verify ? max_verify_batch : max_batch);
}

DecodeGraphs::Shape DecodeGraphs::shape_for(RowSpan rows, const std::vector<int>& buckets,
                                            size_t max_blocks) {
  const int real = static_cast<int>(rows.size());
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), real);
  if (real < 1 || it == buckets.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode graphs: no bucket holds " + std::to_string(real) + " sequences");
  }
  Shape shape;
  shape.bucket = *it;
  shape.width = static_cast<int>(std::bit_ceil(std::max<size_t>(max_blocks, kMinTableWidth)));
  int64_t tokens = 0;
  for (const ForwardRow& r : rows) tokens += r.num_tokens;
  if (tokens > real) {
    // Each padding row below the bucket takes one token row at least (the row past it, the one
    // padded_verify adds, takes the rest).
    const int64_t needed = tokens + (shape.bucket - real);
    shape.row_tokens = static_cast<int>((needed + shape.bucket - 1) / shape.bucket);
  }
  return shape;
}

bool DecodeGraphs::accepts(RowSpan rows, LogitsMode mode) const {
  if (!rows_fit(rows, mode, max_batch_, max_verify_batch_)) return false;
  // A replayed hit's rows whose window is still clamped (or whose entry the tiers supplied): the
  // recording carries no swa_start, so such a call runs eagerly.
  const int window = config_.sliding_window;
  const bool clamped = std::any_of(rows.begin(), rows.end(), [window](const ForwardRow& r) {
    return r.swa_valid_start > std::max(0, r.start_pos - window + 1) || r.start_pos < r.replay_end;
  });
  if (clamped) return false;
  if (v41_model_ == nullptr) return true;
  // Narrowed rows need the consumer layers' swa_start (and in compact, dropped rows), which the
  // recording does not carry: such a call runs eagerly.
  std::vector<YocoRowRange> ranges;
  return !yoco_row_ranges(rows, *config_.v41, ranges);
}

DecodeGraphs::Recording& DecodeGraphs::recording_for(const Shape& shape) {
  auto it = recordings_.find(shape);
  if (it != recordings_.end()) return *it->second;
  const int bucket = shape.bucket;
  auto rec = std::make_unique<Recording>();
  rec->geometry = shape.row_tokens == 1 ? BatchGeometry::padded(bucket, shape.width, ratios_.size())
                                        : BatchGeometry::padded_verify(bucket, shape.row_tokens,
                                                                       shape.width, ratios_);
  const Tensor metadata = backend_.zeros({rec->geometry.size()}, DType::kI32);
  rec->plan = plan_views(metadata, rec->geometry, ratios_, caches_.shape().block_size);
  if (v41_model_ != nullptr && !config_.v41->engram_layer_ids.empty()) {
    const int64_t n = config_.v41->engram_max_ngram_size;
    rec->ngram = backend_.zeros({bucket, n}, DType::kI32);
    rec->ngram_remap = backend_.zeros({bucket * n}, DType::kI32);
  }
  return *recordings_.emplace(shape, std::move(rec)).first->second;
}

void DecodeGraphs::stage_ngrams(RowSpan rows, Recording& rec, const Tensor& previous_tokens) {
  const int64_t cells = rec.ngram.numel();
  const bool carries =
      pack_engram_ngrams(rows, *config_.v41, rec.geometry.num_tokens, host_ngram_, host_remap_);
  backend_.upload_into(rec.ngram, Tensor::from_vector(host_ngram_, rec.ngram.shape()));
  if (!carries) return;
  // As engram_ngrams does eagerly (and take_carried_tokens for the metadata): before the replay.
  backend_.upload_into(rec.ngram_remap, Tensor::from_vector(host_remap_, {cells}));
  backend_.select_tokens(rec.ngram.reshape({cells}), rec.ngram_remap, previous_tokens);
}

DecodeGraphs::Output DecodeGraphs::forward(RowSpan rows, size_t max_blocks,
                                           const Tensor& previous_tokens, LogitsMode mode) {
  if (!accepts(rows, mode)) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode graphs: a batch of 1 to " + std::to_string(max_batch_) +
                    " one-token sequences (or 1 to " + std::to_string(max_verify_batch_) +
                    " with verify rows of up to " +
                    std::to_string(BatchGeometry::kMaxPaddedRowTokens) +
                    " tokens) wanting all their logits was expected, got " +
                    std::to_string(rows.size()) + " sequences");
  }
  const Shape shape = shape_for(rows, buckets_, max_blocks);
  const bool verify = shape.row_tokens > 1;
  Recording& rec = recording_for(shape);
  pack_batch(rows, rec.geometry, ratios_, caches_.shape().block_size, scratch_slot_,
             host_metadata_);
  backend_.upload_into(rec.plan.metadata,
                       Tensor::from_vector(host_metadata_, {rec.plan.metadata.numel()}));
  take_carried_tokens(backend_, rows, rec.plan, previous_tokens);
  if (rec.ngram.defined()) stage_ngrams(rows, rec, previous_tokens);
  Tensor* logits = verify ? &verify_logits_ : &logits_;
  if (!logits->defined()) {
    const int64_t capacity =
        verify ? int64_t{max_verify_batch_} * BatchGeometry::kMaxPaddedRowTokens + 1 : max_batch_;
    *logits = backend_.empty({capacity, config_.vocab_size}, DType::kF32);
  }
  Tensor out = logits->narrow(0, 0, rec.geometry.num_logit_rows);
  if (rec.graph) {
    rec.graph->replay();
  } else {
    // First use of this shape: run it (this step's result, and a warm-up of every op the
    // recording will hold: lazily built tables, kernel attributes), then record it.
    auto body = [this, &rec, out]() {
      if (model_ != nullptr) {
        backend_.copy_into(out, model_->forward(rec.plan, caches_));
      } else {
        // No row is narrowed (accepts), so no consumer rows: as plan_yoco_rows plans eagerly.
        backend_.copy_into(out, v41_model_->forward(rec.plan, rec.ngram, caches_, YocoRows{}));
      }
    };
    body();
    rec.graph = backend_.capture(body);
    num_recorded_.fetch_add(1);
  }
  num_calls_.fetch_add(1);
  if (verify) num_verify_calls_.fetch_add(1);
  // Every row wants the logits of all its tokens (rows_fit), and real rows come first: the first
  // `tokens` logits rows are the call's, in order.
  int64_t tokens = 0;
  for (const ForwardRow& r : rows) tokens += r.num_tokens;
  return {logits->narrow(0, 0, tokens), rec.plan.next_positions.narrow(0, 0, tokens)};
}

}  // namespace deepinfer
