#include "model/decode_graphs.h"

#include <algorithm>
#include <bit>
#include <string>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"

namespace deepinfer {

namespace {

// Narrowest block-table width recorded: short contexts share one recording.
constexpr int kMinTableWidth = 16;

}  // namespace

// One recorded decode step: its metadata buffer (views of which form the plan) and the graph.
struct DecodeGraphs::Recording {
  int bucket = 0;  // sequences (= tokens)
  int width = 0;   // block-table columns
  Tensor meta;     // device i32: every array of `plan`, back to back
  BatchPlan plan;
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
    : config_(config),
      model_(model),
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

bool DecodeGraphs::accepts(const std::vector<SequenceChunk>& batch) const {
  if (batch.empty() || static_cast<int>(batch.size()) > max_batch_) return false;
  return std::all_of(batch.begin(), batch.end(),
                     [](const SequenceChunk& c) { return c.tokens.size() == 1; });
}

DecodeGraphs::Recording& DecodeGraphs::recording_for(int bucket, int width) {
  auto key = std::make_pair(bucket, width);
  auto it = recordings_.find(key);
  if (it != recordings_.end()) return *it->second;

  auto rec = std::make_unique<Recording>();
  rec->bucket = bucket;
  rec->width = width;
  const int64_t n = bucket;
  const int64_t num_ratios = static_cast<int64_t>(ratios_.size());
  const int64_t total = 6 * n + 1 + n * width + 4 * n * num_ratios;
  rec->meta = backend_.zeros({total}, DType::kI32);
  int64_t offset = 0;
  auto take = [&](int64_t count) {
    Tensor view = rec->meta.narrow(0, offset, count);
    offset += count;
    return view;
  };
  BatchLayout& l = rec->plan.layout;
  l.num_tokens = bucket;
  l.num_seqs = bucket;
  l.block_size = caches_.shape().block_size;
  l.max_blocks_per_seq = width;
  l.token_ids = take(n);
  l.positions = take(n);
  l.token_seq = take(n);
  l.seq_q_start = take(n + 1);
  l.seq_ctx_len = take(n);
  l.seq_slot = take(n);
  l.block_table = take(n * width).reshape({n, width});
  for (int ratio : ratios_) {
    EntryBatch e;
    e.num_entries = bucket;
    e.seq = take(n);
    e.window = take(n);
    e.rope_pos = take(n);
    e.dest = take(n);
    rec->plan.entries.emplace(ratio, std::move(e));
  }
  rec->plan.last_rows = l.token_seq;  // one row per sequence (forward runs in kAll mode)
  return *recordings_.emplace(key, std::move(rec)).first->second;
}

void DecodeGraphs::stage(Recording& rec, const std::vector<SequenceChunk>& batch) {
  const int n = rec.bucket;
  const int width = rec.width;
  const int real = static_cast<int>(batch.size());
  host_meta_.assign(static_cast<size_t>(rec.meta.numel()), 0);
  int32_t* p = host_meta_.data();
  int32_t* token_ids = p;
  int32_t* positions = p + n;
  int32_t* token_seq = p + 2 * n;
  int32_t* q_start = p + 3 * n;
  int32_t* ctx_len = p + 4 * n + 1;
  int32_t* slot = p + 5 * n + 1;
  int32_t* table = p + 6 * n + 1;
  for (int b = 0; b < n; ++b) {
    token_seq[b] = b;
    q_start[b] = b;
    if (b < real) {
      const SequenceChunk& c = batch[static_cast<size_t>(b)];
      token_ids[b] = c.tokens[0];
      positions[b] = static_cast<int32_t>(c.start_pos);
      ctx_len[b] = static_cast<int32_t>(c.start_pos);
      slot[b] = c.slot;
      std::copy(c.block_table.begin(), c.block_table.end(),
                table + static_cast<ptrdiff_t>(b) * width);
    } else {
      slot[b] = scratch_slot_;  // position 0, token 0, block table of zeros
    }
  }
  q_start[n] = n;
  int32_t* entries = table + static_cast<ptrdiff_t>(n) * width;
  for (int ratio : ratios_) {
    const int epb = kv::entries_per_block(ratio, caches_.shape().block_size);
    int32_t* seq = entries;
    int32_t* window = entries + n;
    int32_t* rope_pos = entries + 2 * n;
    int32_t* dest = entries + 3 * n;
    for (int b = 0; b < n; ++b) {
      seq[b] = b;
      window[b] = -1;  // padding unless this token closes a window (model.md D.3)
      dest[b] = -1;
      if (b >= real) continue;
      const SequenceChunk& c = batch[static_cast<size_t>(b)];
      if ((c.start_pos + 1) % ratio != 0) continue;
      const int64_t w = c.start_pos / ratio;
      window[b] = static_cast<int32_t>(w);
      rope_pos[b] = static_cast<int32_t>(w * ratio);
      dest[b] = static_cast<int32_t>(kv::entry_row(c.block_table, w, epb));
    }
    entries += 4 * n;
  }
  backend_.upload_into(rec.meta, Tensor::from_vector(host_meta_, {rec.meta.numel()}));
}

Tensor DecodeGraphs::forward(const std::vector<SequenceChunk>& batch, const Tensor& token_ids) {
  if (!accepts(batch)) {
    throw Error(ErrorCode::kInvalidArgument, "decode graphs: a batch of 1 to " +
                                                 std::to_string(max_batch_) +
                                                 " one-token sequences was expected, got " +
                                                 std::to_string(batch.size()) + " sequences");
  }
  const size_t max_blocks = validate_batch(batch, config_, caches_.shape());
  const int real = static_cast<int>(batch.size());
  const int bucket = *std::lower_bound(buckets_.begin(), buckets_.end(), real);
  const int width = static_cast<int>(std::bit_ceil(std::max<size_t>(max_blocks, kMinTableWidth)));
  Recording& rec = recording_for(bucket, width);
  stage(rec, batch);
  if (token_ids.defined()) {
    backend_.copy_into(rec.plan.layout.token_ids.narrow(0, 0, real), token_ids);
  }
  if (!logits_.defined()) logits_ = backend_.empty({max_batch_, config_.vocab_size}, DType::kF32);
  Tensor out = logits_.narrow(0, 0, bucket);
  if (rec.graph) {
    rec.graph->replay();
  } else {
    // First use of this shape: run it (this step's result, and a warm-up of every op the
    // recording will hold: lazily built tables, kernel attributes), then record it.
    auto body = [this, &rec, out]() {
      backend_.copy_into(out, model_.forward(rec.plan, caches_, LogitsMode::kAll));
    };
    body();
    rec.graph = backend_.capture(body);
    num_recorded_.fetch_add(1);
  }
  num_calls_.fetch_add(1);
  return logits_.narrow(0, 0, real);
}

}  // namespace deepinfer
