#include "model/batch_plan.h"

#include <algorithm>
#include <set>
#include <string>

#include "deepinfer/error.h"
#include "kv/cache_geometry.h"

namespace deepinfer {

namespace {

[[noreturn]] void bad_row(size_t index, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument,
              "forward batch: sequence " + std::to_string(index) + ": " + what);
}

}  // namespace

size_t validate_rows(RowSpan rows, const ModelConfig& config, const CacheShape& caches,
                     bool check_tokens) {
  if (rows.empty()) throw Error(ErrorCode::kInvalidArgument, "forward batch: no sequences");
  std::set<int32_t> slots_seen;
  size_t max_blocks = 1;
  for (size_t b = 0; b < rows.size(); ++b) {
    const ForwardRow& r = rows[b];
    if (r.num_tokens < 1) bad_row(b, "'tokens' is empty");
    if (r.tokens.size() != static_cast<size_t>(r.num_tokens)) {
      bad_row(b, "has " + std::to_string(r.tokens.size()) + " tokens for " +
                     std::to_string(r.num_tokens) + " positions");
    }
    if (r.start_pos < 0)
      bad_row(b, "'start_pos' is negative (" + std::to_string(r.start_pos) + ")");
    if (r.num_logits < 0 || r.num_logits > r.num_tokens) {
      bad_row(b, "'num_logits' " + std::to_string(r.num_logits) + " is outside [0, " +
                     std::to_string(r.num_tokens) + "]");
    }
    if (r.slot < 0 || r.slot >= caches.num_state_slots) {
      bad_row(b, "'slot' " + std::to_string(r.slot) + " is outside [0, " +
                     std::to_string(caches.num_state_slots) + ")");
    }
    if (!slots_seen.insert(r.slot).second) {
      bad_row(b, "'slot' " + std::to_string(r.slot) + " is used by another sequence of the batch");
    }
    const int64_t end = static_cast<int64_t>(r.start_pos) + r.num_tokens;
    if (end > config.max_position_embeddings) {
      bad_row(b, "positions up to " + std::to_string(end - 1) + " exceed max_position_embeddings " +
                     std::to_string(config.max_position_embeddings));
    }
    if (r.swa_valid_start < 0 || r.swa_valid_start > r.start_pos) {
      bad_row(b, "'swa_valid_start' " + std::to_string(r.swa_valid_start) +
                     " is outside [0, start_pos " + std::to_string(r.start_pos) +
                     "]: a replay computes every position from it on");
    }
    if (r.replay_end < 0) bad_row(b, "'replay_end' " + std::to_string(r.replay_end) + " is < 0");
    if (r.shift_from < -1) {
      bad_row(b, "'shift_from' " + std::to_string(r.shift_from) + " is < -1 (-1: the row stays)");
    }
    if (r.shift_from >= 0) {
      // A moving row is a decode row: it reaches back at most the drafts of one verify row, and
      // nothing about it depends on a replayed hit or a prefill's end.
      if (r.max_shift < 1 || r.max_shift >= BatchGeometry::kMaxPaddedRowTokens) {
        bad_row(b, "'max_shift' " + std::to_string(r.max_shift) + " is outside [1, " +
                       std::to_string(BatchGeometry::kMaxPaddedRowTokens - 1) +
                       "] for a row that may move");
      }
      if (r.start_pos < r.max_shift) {
        bad_row(b, "'start_pos' " + std::to_string(r.start_pos) + " is below 'max_shift' " +
                       std::to_string(r.max_shift) + ": the row could move before position 0");
      }
      if (r.replay_end != 0 || r.swa_valid_start != 0 || r.prompt_end != 0) {
        bad_row(b, "a row that may move (shift_from " + std::to_string(r.shift_from) +
                       ") must have replay_end, swa_valid_start and prompt_end 0");
      }
    }
    if (r.prompt_end != 0 && r.prompt_end < end) {
      bad_row(b, "'prompt_end' " + std::to_string(r.prompt_end) + " lies before the row's end " +
                     std::to_string(end) + " (0: the row's end)");
    }
    if (r.carried_tokens < 1 || r.carried_tokens > r.num_tokens ||
        (r.carried_tokens > 1 && r.carried_stride < 1)) {
      bad_row(b, "'carried_tokens' " + std::to_string(r.carried_tokens) +
                     " with 'carried_stride' " + std::to_string(r.carried_stride) +
                     ": expected 1 .. num_tokens (" + std::to_string(r.num_tokens) +
                     ") carried tokens, a stride >= 1 for more than one");
    }
    if (check_tokens) {
      for (size_t i = 0; i < r.tokens.size(); ++i) {
        if (r.tokens[i] < 0 || r.tokens[i] >= config.vocab_size) {
          bad_row(b, "'tokens'[" + std::to_string(i) + "] = " + std::to_string(r.tokens[i]) +
                         " is outside the vocabulary [0, " + std::to_string(config.vocab_size) +
                         ")");
        }
      }
    }
    if (config.has_compressed_layers()) {
      const int64_t needed = kv::blocks_for_tokens(end, caches.block_size);
      if (static_cast<int64_t>(r.block_table.size()) < needed) {
        bad_row(b, "'block_table' has " + std::to_string(r.block_table.size()) +
                       " blocks but positions up to " + std::to_string(end - 1) + " need " +
                       std::to_string(needed));
      }
    }
    for (size_t i = 0; i < r.block_table.size(); ++i) {
      if (r.block_table[i] < 0 || r.block_table[i] >= caches.num_blocks) {
        bad_row(b, "'block_table'[" + std::to_string(i) +
                       "] = " + std::to_string(r.block_table[i]) + " is outside [0, " +
                       std::to_string(caches.num_blocks) + ")");
      }
    }
    max_blocks = std::max(max_blocks, r.block_table.size());
  }
  return max_blocks;
}

std::vector<int> compress_ratios(const ModelConfig& config) {
  std::set<int> ratios;
  // The MTP blocks' ratios too: a drafter call is planned like a main call.
  for (int li = 0; li < config.num_hidden_layers + config.num_nextn_predict_layers; ++li) {
    if (config.compress_rate(li) > 0) ratios.insert(config.compress_rate(li));
  }
  return {ratios.begin(), ratios.end()};
}

namespace {

// The first window whose compressed entry a row stores: those closing at or before a replayed
// hit's end came from the KV tiers (ForwardRow::replay_end), so the replay keeps them.
int64_t first_entry(const ForwardRow& r, int ratio) {
  const int64_t from = kv::num_entries(r.start_pos, ratio);
  const int64_t last = kv::num_entries(r.start_pos + r.num_tokens, ratio);
  return std::clamp<int64_t>(kv::num_entries(r.replay_end, ratio), from, last);
}

// The entry slots of ratio `ratio` an exact batch gives row r: what it closes, or for a row that
// may move the most it closes at any start in [start_pos - max_shift, start_pos].
int64_t entry_slots(const ForwardRow& r, int ratio) {
  if (r.shift_from < 0)
    return kv::num_entries(r.start_pos + r.num_tokens, ratio) - first_entry(r, ratio);
  int64_t most = 0;
  for (int64_t start = r.start_pos - r.max_shift; start <= r.start_pos; ++start) {
    most = std::max(most,
                    kv::num_entries(start + r.num_tokens, ratio) - kv::num_entries(start, ratio));
  }
  return most;
}

}  // namespace

BatchGeometry BatchGeometry::exact(RowSpan rows, const std::vector<int>& ratios, size_t max_blocks,
                                   LogitsMode mode) {
  BatchGeometry g;
  g.num_seqs = static_cast<int>(rows.size());
  g.table_width = static_cast<int>(std::max<size_t>(max_blocks, 1));
  g.all_logits = mode == LogitsMode::kAll;
  for (const ForwardRow& r : rows) {
    g.num_tokens += r.num_tokens;
    g.num_logit_rows += r.num_logits;
    g.carry = g.carry || r.token_from_previous >= 0;
    g.swa_start = g.swa_start || r.swa_valid_start > 0;
    g.shift = g.shift || r.shift_from >= 0;
  }
  if (g.all_logits) g.num_logit_rows = g.num_tokens;
  // Windows [ctx / m, (ctx + q) / m) close in this call
  // (docs/model.md#windows-that-close-in-a-call).
  for (int ratio : ratios) {
    int64_t n = 0;
    for (const ForwardRow& r : rows) n += entry_slots(r, ratio);
    g.num_entries.push_back(static_cast<int>(n));
    if (ratio == 1 && n < g.num_tokens) g.entry_rows = static_cast<int>(n);
  }
  return g;
}

BatchGeometry BatchGeometry::padded(int bucket, int width, size_t num_ratios) {
  BatchGeometry g;
  g.num_seqs = bucket;
  g.num_tokens = bucket;
  g.table_width = width;
  g.num_entries.assign(num_ratios, bucket);
  g.entry_per_row = true;
  g.has_padding = true;
  g.all_logits = true;
  g.num_logit_rows = bucket;
  g.carry = true;
  g.shift = true;
  return g;
}

int BatchGeometry::padded_verify_entries(int bucket, int row_tokens, int ratio) {
  // sum_r ceil(n_r / m) <= sum_r (n_r + m - 1) / m over at most `bucket` rows of sum_r n_r <=
  // bucket * row_tokens tokens; and each ceil(n_r / m) <= min(n_r, ceil(kMaxPaddedRowTokens / m)).
  const int64_t tokens = int64_t{bucket} * row_tokens;
  const int64_t by_sum = (tokens + int64_t{bucket} * (ratio - 1)) / ratio;
  const int64_t by_row = int64_t{bucket} * ((kMaxPaddedRowTokens + ratio - 1) / ratio);
  return static_cast<int>(std::min({tokens, by_sum, by_row}));
}

BatchGeometry BatchGeometry::padded_verify(int bucket, int row_tokens, int width,
                                           const std::vector<int>& ratios) {
  if (bucket < 1 || row_tokens < 1 || row_tokens > kMaxPaddedRowTokens) {
    throw Error(ErrorCode::kInvalidArgument,
                "padded verify batch: bucket " + std::to_string(bucket) + " and row_tokens " +
                    std::to_string(row_tokens) + " must be >= 1 and <= " +
                    std::to_string(kMaxPaddedRowTokens) + " respectively");
  }
  // Ratio-1 entries are read one per token row, in order (BatchPlan::entry_rows), which a padded
  // layout does not keep.
  if (std::find(ratios.begin(), ratios.end(), 1) != ratios.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                "padded verify batch: compression ratio 1 (DeepSeek-V4.1's C1) is not supported");
  }
  BatchGeometry g;
  g.num_seqs = bucket + 1;
  g.num_tokens = bucket * row_tokens + 1;
  g.table_width = width;
  for (int ratio : ratios)
    g.num_entries.push_back(padded_verify_entries(bucket, row_tokens, ratio));
  g.has_padding = true;
  g.all_logits = true;
  g.num_logit_rows = g.num_tokens;
  g.carry = true;
  g.shift = true;
  return g;
}

// Buffer order: token_ids, positions, token_seq [T]; seq_q_start [B + 1]; seq_ctx_len, seq_slot
// [B]; block_table [B, W]; carry_remap [T] (if carry); logit_rows [S] (unless all_logits);
// next_positions [S]; then per ratio seq, window, rope_pos, dest [E]; swa_start [B] (if swa_start);
// entry_rows [E of ratio 1] (if entry_rows); shift_from, max_shift [B] (if shift).
int64_t BatchGeometry::size() const {
  int64_t n = 3LL * num_tokens + (num_seqs + 1) + 2LL * num_seqs +
              static_cast<int64_t>(num_seqs) * table_width + num_logit_rows;
  if (carry) n += num_tokens;
  if (!all_logits) n += num_logit_rows;
  for (int e : num_entries) n += 4LL * e;
  if (swa_start) n += num_seqs;
  n += entry_rows;
  if (shift) n += 2LL * num_seqs;
  return n;
}

void pack_batch(RowSpan rows, const BatchGeometry& g, const std::vector<int>& ratios,
                int block_size, int32_t scratch_slot, std::vector<int32_t>& host) {
  host.assign(static_cast<size_t>(g.size()), 0);
  const int64_t t = g.num_tokens;
  const int64_t b = g.num_seqs;
  int32_t* token_ids = host.data();
  int32_t* positions = token_ids + t;
  int32_t* token_seq = positions + t;
  int32_t* q_start = token_seq + t;
  int32_t* ctx_len = q_start + b + 1;
  int32_t* slot = ctx_len + b;
  int32_t* table = slot + b;
  int32_t* next = table + b * g.table_width;
  int32_t* carry = g.carry ? next : nullptr;
  if (g.carry) next += t;
  int32_t* logit_rows = g.all_logits ? nullptr : next;
  if (!g.all_logits) next += g.num_logit_rows;
  int32_t* next_positions = next;
  int32_t* entries = next_positions + g.num_logit_rows;

  const int real = static_cast<int>(rows.size());
  int64_t real_tokens = 0;
  for (const ForwardRow& r : rows) {
    real_tokens += r.num_tokens;
    if (g.entry_per_row && r.num_tokens != 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "forward batch: a padded decode batch holds one-token rows, got a row of " +
                      std::to_string(r.num_tokens));
    }
  }
  // Padding rows share the token rows the real ones leave, as evenly as they can, one at least.
  const int64_t pad_rows = g.num_seqs - real;
  const int64_t pad_tokens = g.num_tokens - real_tokens;
  const bool fits = pad_rows >= 0 && (pad_rows == 0 ? pad_tokens == 0 : pad_tokens >= pad_rows) &&
                    (g.has_padding || pad_rows == 0);
  if (!fits) {
    throw Error(ErrorCode::kInvalidArgument, "forward batch: " + std::to_string(real) +
                                                 " rows of " + std::to_string(real_tokens) +
                                                 " tokens do not fit a layout of " +
                                                 std::to_string(g.num_seqs) + " rows and " +
                                                 std::to_string(g.num_tokens) + " tokens");
  }
  int32_t row = 0;    // token row
  int32_t logit = 0;  // logits row
  for (int s = 0; s < g.num_seqs; ++s) {
    q_start[s] = row;
    if (s >= real) {  // padding: tokens 0 at positions 0, 1, ... of the scratch slot
      slot[s] = scratch_slot;
      const int64_t pad = s - real;
      const int64_t n = pad_tokens / pad_rows + (pad < pad_tokens % pad_rows ? 1 : 0);
      for (int32_t i = 0; i < n; ++i, ++row) {
        positions[row] = i;
        token_seq[row] = s;
        if (carry != nullptr) carry[row] = -1;
        if (g.all_logits) next_positions[logit++] = i + 1;
      }
      continue;
    }
    const ForwardRow& r = rows[static_cast<size_t>(s)];
    ctx_len[s] = r.start_pos;
    slot[s] = r.slot;
    std::copy(r.block_table.begin(), r.block_table.end(),
              table + static_cast<ptrdiff_t>(s) * g.table_width);
    for (int32_t i = 0; i < r.num_tokens; ++i, ++row) {
      token_ids[row] = r.tokens[static_cast<size_t>(i)];
      positions[row] = r.start_pos + i;
      token_seq[row] = s;
      if (carry != nullptr) {
        carry[row] = r.token_from_previous >= 0 && i < r.carried_tokens
                         ? r.token_from_previous + i * r.carried_stride
                         : -1;
      }
      if (g.all_logits) next_positions[logit++] = r.start_pos + i + 1;
    }
    if (!g.all_logits) {
      for (int32_t i = r.num_tokens - r.num_logits; i < r.num_tokens; ++i) {
        logit_rows[logit] = row - r.num_tokens + i;
        next_positions[logit++] = r.start_pos + i + 1;
      }
    }
  }
  q_start[g.num_seqs] = row;

  for (size_t k = 0; k < ratios.size(); ++k) {
    const int ratio = ratios[k];
    const int64_t e = g.num_entries[k];
    const int epb = kv::entries_per_block(ratio, block_size);
    int32_t* seq = entries;
    int32_t* window = entries + e;
    int32_t* rope_pos = entries + 2 * e;
    int32_t* dest = entries + 3 * e;
    entries += 4 * e;
    if (g.entry_per_row) {
      // One entry per (one-token) row: the window its token closes, or padding (-1, -1).
      for (int s = 0; s < g.num_seqs; ++s) {
        seq[s] = s;
        window[s] = -1;
        dest[s] = -1;
        if (s >= real) continue;
        const ForwardRow& r = rows[static_cast<size_t>(s)];
        if ((r.start_pos + 1) % ratio != 0) continue;
        const int64_t w = r.start_pos / ratio;
        window[s] = static_cast<int32_t>(w);
        rope_pos[s] = static_cast<int32_t>(w * ratio);
        dest[s] = static_cast<int32_t>(kv::entry_row(r.block_table, w, epb));
      }
      continue;
    }
    int64_t n = 0;
    for (int s = 0; s < real; ++s) {
      const ForwardRow& r = rows[static_cast<size_t>(s)];
      const int64_t first = first_entry(r, ratio);
      const int64_t last = kv::num_entries(r.start_pos + r.num_tokens, ratio);
      if (n + (last - first) > e) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward batch: the rows close more than the layout's " + std::to_string(e) +
                        " entries of ratio " + std::to_string(ratio));
      }
      for (int64_t w = first; w < last; ++w, ++n) {
        seq[n] = s;
        window[n] = static_cast<int32_t>(w);
        rope_pos[n] = static_cast<int32_t>(w * ratio);
        dest[n] = static_cast<int32_t>(kv::entry_row(r.block_table, w, epb));
      }
    }
    // A padded layout's spare entry slots: padding entries of its last (padding) row.
    for (; n < e; ++n) {
      seq[n] = g.num_seqs - 1;
      window[n] = -1;
      rope_pos[n] = 0;
      dest[n] = -1;
    }
  }
  if (g.swa_start) {
    int32_t* swa_start = entries;  // padding rows: 0, no clamp
    for (int s = 0; s < real; ++s) swa_start[s] = rows[static_cast<size_t>(s)].swa_valid_start;
    entries += g.num_seqs;
  }
  if (g.entry_rows > 0) {
    // Ratio 1: window w is position w, so a row's entries are its last tokens from first_entry.
    int32_t* out = entries;
    for (int s = 0; s < real; ++s) {
      const ForwardRow& r = rows[static_cast<size_t>(s)];
      const int64_t first = first_entry(r, 1);
      for (int64_t w = first; w < r.start_pos + r.num_tokens; ++w)
        *out++ = static_cast<int32_t>(q_start[s] + (w - r.start_pos));
    }
    entries += g.entry_rows;
  }
  if (g.shift) {
    int32_t* shift_from = entries;  // padding rows: -1, 0: they never move
    int32_t* max_shift = entries + g.num_seqs;
    std::fill(shift_from, shift_from + g.num_seqs, -1);
    for (int s = 0; s < real; ++s) {
      shift_from[s] = rows[static_cast<size_t>(s)].shift_from;
      max_shift[s] = rows[static_cast<size_t>(s)].max_shift;
    }
  }
}

BatchPlan plan_views(const Tensor& metadata, const BatchGeometry& g, const std::vector<int>& ratios,
                     int block_size) {
  int64_t offset = 0;
  auto take = [&](int64_t count) {
    Tensor view = metadata.narrow(0, offset, count);
    offset += count;
    return view;
  };
  const int64_t t = g.num_tokens;
  const int64_t b = g.num_seqs;
  BatchPlan plan;
  plan.metadata = metadata;
  BatchLayout& l = plan.layout;
  l.num_tokens = g.num_tokens;
  l.num_seqs = g.num_seqs;
  l.block_size = block_size;
  l.max_blocks_per_seq = g.table_width;
  l.token_ids = take(t);
  l.positions = take(t);
  l.token_seq = take(t);
  l.seq_q_start = take(b + 1);
  l.seq_ctx_len = take(b);
  l.seq_slot = take(b);
  l.block_table = take(b * g.table_width).reshape({b, g.table_width});
  if (g.carry) plan.carry_remap = take(t);
  plan.num_logit_rows = g.num_logit_rows;
  if (!g.all_logits) plan.logit_rows = take(g.num_logit_rows);
  plan.next_positions = take(g.num_logit_rows);
  for (size_t k = 0; k < ratios.size(); ++k) {
    EntryBatch e;
    e.num_entries = g.num_entries[k];
    e.seq = take(e.num_entries);
    e.window = take(e.num_entries);
    e.rope_pos = take(e.num_entries);
    e.dest = take(e.num_entries);
    plan.entries.emplace(ratios[k], std::move(e));
  }
  if (g.swa_start) plan.swa_start = take(b);
  if (g.entry_rows > 0) plan.entry_rows = take(g.entry_rows);
  if (g.shift) {
    plan.shift_from = take(b);
    plan.max_shift = take(b);
  }
  plan.entry_per_row = g.entry_per_row;
  DEEPINFER_CHECK(offset == metadata.numel(), "batch metadata layout and size disagree");
  return plan;
}

void take_carried_tokens(Backend& backend, RowSpan rows, const BatchPlan& plan,
                         const Tensor& previous) {
  const bool any = std::any_of(rows.begin(), rows.end(),
                               [](const ForwardRow& r) { return r.token_from_previous >= 0; });
  if (!any) return;
  if (!previous.defined() || !plan.carry_remap.defined()) {
    throw Error(ErrorCode::kInvalidArgument,
                "forward batch: a row carries a token from the previous step, but there is none");
  }
  backend.select_tokens(plan.layout.token_ids, plan.carry_remap, previous);
}

void shift_carried_rows(Backend& backend, RowSpan rows, const BatchPlan& plan,
                        const Tensor& accepted) {
  const bool any =
      std::any_of(rows.begin(), rows.end(), [](const ForwardRow& r) { return r.shift_from >= 0; });
  if (!any) return;
  if (!accepted.defined() || !plan.shift_from.defined()) {
    throw Error(ErrorCode::kInvalidArgument,
                "forward batch: a row moves by the previous step's accepted drafts, but there are "
                "none");
  }
  // The entries are recomputed for every row from its start, which holds for decode rows only.
  for (size_t s = 0; s < rows.size(); ++s) {
    if (rows[s].replay_end != 0 || rows[s].swa_valid_start != 0) {
      bad_row(s,
              "a batch with a row that moves holds decode rows only, but this one replays a "
              "hit (replay_end / swa_valid_start set)");
    }
  }
  backend.shift_rows(row_shift_of(plan, static_cast<int>(rows.size()), accepted));
}

RowShift row_shift_of(const BatchPlan& plan, int num_real_seqs, const Tensor& accepted) {
  RowShift shift;
  shift.layout = plan.layout;
  shift.next_positions = plan.next_positions;
  shift.logit_rows = plan.logit_rows;
  shift.carry_remap = plan.carry_remap;
  shift.shift_from = plan.shift_from;
  shift.max_shift = plan.max_shift;
  shift.accepted = accepted;
  shift.num_real_seqs = num_real_seqs;
  shift.entry_per_row = plan.entry_per_row;
  for (const auto& [ratio, e] : plan.entries) shift.entries.emplace_back(ratio, e);
  return shift;
}

BatchPlan build_batch_plan(RowSpan rows, const ModelConfig& config, const CacheShape& caches,
                           Backend& backend, LogitsMode mode, size_t max_blocks) {
  const std::vector<int> ratios = compress_ratios(config);
  const BatchGeometry g = BatchGeometry::exact(rows, ratios, max_blocks, mode);
  std::vector<int32_t> host;
  pack_batch(rows, g, ratios, caches.block_size, /*scratch_slot=*/0, host);
  const Tensor metadata =
      backend.upload(Tensor::from_vector(host, {static_cast<int64_t>(host.size())}), DType::kI32);
  return plan_views(metadata, g, ratios, caches.block_size);
}

}  // namespace deepinfer
