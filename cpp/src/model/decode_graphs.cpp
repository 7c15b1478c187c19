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

// One recorded decode step: its metadata buffer (which the plan's tensors view), for V4.1 with
// Engram layers its n-grams and their carry remap, and the graph.
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
      scratch_slot_(scratch_slot),
      buckets_(buckets_up_to(max_batch)),
      ratios_(compress_ratios(config)) {
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

bool DecodeGraphs::accepts(RowSpan rows) const {
  if (rows.empty() || static_cast<int>(rows.size()) > max_batch_) return false;
  const bool decode = std::all_of(rows.begin(), rows.end(), [](const ForwardRow& r) {
    return r.num_tokens == 1 && r.num_logits == 1;
  });
  if (!decode) return false;
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

DecodeGraphs::Recording& DecodeGraphs::recording_for(int bucket, int width) {
  auto key = std::make_pair(bucket, width);
  auto it = recordings_.find(key);
  if (it != recordings_.end()) return *it->second;
  auto rec = std::make_unique<Recording>();
  rec->geometry = BatchGeometry::padded(bucket, width, ratios_.size());
  const Tensor metadata = backend_.zeros({rec->geometry.size()}, DType::kI32);
  rec->plan = plan_views(metadata, rec->geometry, ratios_, caches_.shape().block_size);
  if (v41_model_ != nullptr && !config_.v41->engram_layer_ids.empty()) {
    const int64_t n = config_.v41->engram_max_ngram_size;
    rec->ngram = backend_.zeros({bucket, n}, DType::kI32);
    rec->ngram_remap = backend_.zeros({bucket * n}, DType::kI32);
  }
  return *recordings_.emplace(key, std::move(rec)).first->second;
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
                                           const Tensor& previous_tokens) {
  if (!accepts(rows)) {
    throw Error(ErrorCode::kInvalidArgument,
                "decode graphs: a batch of 1 to " + std::to_string(max_batch_) +
                    " one-token sequences wanting their logits was expected, got " +
                    std::to_string(rows.size()) + " sequences");
  }
  const int real = static_cast<int>(rows.size());
  const int bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), real);
  const int width = static_cast<int>(std::bit_ceil(std::max<size_t>(max_blocks, kMinTableWidth)));
  Recording& rec = recording_for(bucket, width);
  pack_batch(rows, rec.geometry, ratios_, caches_.shape().block_size, scratch_slot_,
             host_metadata_);
  backend_.upload_into(rec.plan.metadata,
                       Tensor::from_vector(host_metadata_, {rec.plan.metadata.numel()}));
  take_carried_tokens(backend_, rows, rec.plan, previous_tokens);
  if (rec.ngram.defined()) stage_ngrams(rows, rec, previous_tokens);
  if (!logits_.defined()) logits_ = backend_.empty({max_batch_, config_.vocab_size}, DType::kF32);
  Tensor out = logits_.narrow(0, 0, bucket);
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
  return {logits_.narrow(0, 0, real), rec.plan.next_positions.narrow(0, 0, real)};
}

}  // namespace deepinfer
