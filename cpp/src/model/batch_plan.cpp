#include "model/batch_plan.h"

#include <algorithm>
#include <set>
#include <string>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"

namespace deepinfer {

namespace {

[[noreturn]] void bad_sequence(size_t index, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument,
              "forward batch: sequence " + std::to_string(index) + ": " + what);
}

Tensor upload_i32(Backend& backend, const std::vector<int32_t>& values, Shape shape) {
  return backend.upload(Tensor::from_vector(values, std::move(shape)), DType::kI32);
}

}  // namespace

size_t validate_batch(const std::vector<SequenceChunk>& batch, const ModelConfig& config,
                      const CacheShape& caches) {
  if (batch.empty()) throw Error(ErrorCode::kInvalidArgument, "forward batch: no sequences");
  std::set<int32_t> slots_seen;
  size_t max_blocks = 1;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceChunk& s = batch[b];
    if (s.tokens.empty()) bad_sequence(b, "'tokens' is empty");
    if (s.start_pos < 0)
      bad_sequence(b, "'start_pos' is negative (" + std::to_string(s.start_pos) + ")");
    if (s.slot < 0 || s.slot >= caches.num_state_slots) {
      bad_sequence(b, "'slot' " + std::to_string(s.slot) + " is outside [0, " +
                          std::to_string(caches.num_state_slots) + ")");
    }
    if (!slots_seen.insert(s.slot).second) {
      bad_sequence(
          b, "'slot' " + std::to_string(s.slot) + " is used by another sequence of the batch");
    }
    const int64_t end = s.start_pos + static_cast<int64_t>(s.tokens.size());
    if (end > config.max_position_embeddings) {
      bad_sequence(b, "positions up to " + std::to_string(end - 1) +
                          " exceed max_position_embeddings " +
                          std::to_string(config.max_position_embeddings));
    }
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= config.vocab_size) {
        bad_sequence(b, "'tokens'[" + std::to_string(i) + "] = " + std::to_string(s.tokens[i]) +
                            " is outside the vocabulary [0, " + std::to_string(config.vocab_size) +
                            ")");
      }
    }
    if (config.has_compressed_layers()) {
      const int64_t needed = kv::blocks_for_tokens(end, caches.block_size);
      if (static_cast<int64_t>(s.block_table.size()) < needed) {
        bad_sequence(b, "'block_table' has " + std::to_string(s.block_table.size()) +
                            " blocks but positions up to " + std::to_string(end - 1) + " need " +
                            std::to_string(needed));
      }
    }
    for (size_t i = 0; i < s.block_table.size(); ++i) {
      if (s.block_table[i] < 0 || s.block_table[i] >= caches.num_blocks) {
        bad_sequence(b, "'block_table'[" + std::to_string(i) +
                            "] = " + std::to_string(s.block_table[i]) + " is outside [0, " +
                            std::to_string(caches.num_blocks) + ")");
      }
    }
    max_blocks = std::max(max_blocks, s.block_table.size());
  }
  return max_blocks;
}

std::vector<int> compress_ratios(const ModelConfig& config) {
  std::set<int> ratios;
  for (int li = 0; li < config.num_hidden_layers; ++li) {
    if (config.compress_rate(li) > 0) ratios.insert(config.compress_rate(li));
  }
  return {ratios.begin(), ratios.end()};
}

BatchPlan build_batch_plan(const std::vector<SequenceChunk>& batch, const ModelConfig& config,
                           const CacheShape& caches, Backend& backend) {
  const size_t max_blocks = validate_batch(batch, config, caches);
  int64_t total_tokens = 0;
  for (const SequenceChunk& s : batch) total_tokens += static_cast<int64_t>(s.tokens.size());

  const size_t num_seqs = batch.size();
  std::vector<int32_t> token_ids, positions, token_seq, q_start, ctx_len, slot, last_rows;
  std::vector<int32_t> block_table(num_seqs * max_blocks, 0);
  token_ids.reserve(static_cast<size_t>(total_tokens));
  positions.reserve(static_cast<size_t>(total_tokens));
  token_seq.reserve(static_cast<size_t>(total_tokens));
  for (size_t b = 0; b < num_seqs; ++b) {
    const SequenceChunk& s = batch[b];
    q_start.push_back(static_cast<int32_t>(token_ids.size()));
    ctx_len.push_back(static_cast<int32_t>(s.start_pos));
    slot.push_back(s.slot);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      token_ids.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(s.start_pos + static_cast<int64_t>(i)));
      token_seq.push_back(static_cast<int32_t>(b));
    }
    last_rows.push_back(static_cast<int32_t>(token_ids.size()) - 1);
    std::copy(s.block_table.begin(), s.block_table.end(),
              block_table.begin() + static_cast<ptrdiff_t>(b * max_blocks));
  }
  q_start.push_back(static_cast<int32_t>(token_ids.size()));

  BatchPlan plan;
  BatchLayout& L = plan.layout;
  const int64_t t = static_cast<int64_t>(token_ids.size());
  const int64_t bsz = static_cast<int64_t>(num_seqs);
  L.num_tokens = static_cast<int>(t);
  L.num_seqs = static_cast<int>(num_seqs);
  L.block_size = caches.block_size;
  L.max_blocks_per_seq = static_cast<int>(max_blocks);
  L.token_ids = upload_i32(backend, token_ids, {t});
  L.positions = upload_i32(backend, positions, {t});
  L.token_seq = upload_i32(backend, token_seq, {t});
  L.seq_q_start = upload_i32(backend, q_start, {bsz + 1});
  L.seq_ctx_len = upload_i32(backend, ctx_len, {bsz});
  L.seq_slot = upload_i32(backend, slot, {bsz});
  L.block_table = upload_i32(backend, block_table, {bsz, static_cast<int64_t>(max_blocks)});
  plan.last_rows = upload_i32(backend, last_rows, {bsz});

  // Windows [ctx / m, (ctx + q) / m) close in this call (model.md D.3).
  for (int ratio : compress_ratios(config)) {
    const int epb = kv::entries_per_block(ratio, caches.block_size);
    std::vector<int32_t> seq, window, rope_pos, dest;
    for (size_t b = 0; b < num_seqs; ++b) {
      const SequenceChunk& s = batch[b];
      const int64_t first = kv::num_entries(s.start_pos, ratio);
      const int64_t last =
          kv::num_entries(s.start_pos + static_cast<int64_t>(s.tokens.size()), ratio);
      for (int64_t w = first; w < last; ++w) {
        seq.push_back(static_cast<int32_t>(b));
        window.push_back(static_cast<int32_t>(w));
        rope_pos.push_back(static_cast<int32_t>(w * ratio));
        dest.push_back(static_cast<int32_t>(kv::entry_row(s.block_table, w, epb)));
      }
    }
    EntryBatch e;
    e.num_entries = static_cast<int>(seq.size());
    if (e.num_entries > 0) {
      const int64_t n = e.num_entries;
      e.seq = upload_i32(backend, seq, {n});
      e.window = upload_i32(backend, window, {n});
      e.rope_pos = upload_i32(backend, rope_pos, {n});
      e.dest = upload_i32(backend, dest, {n});
    }
    plan.entries.emplace(ratio, std::move(e));
  }
  return plan;
}

}  // namespace deepinfer
