#include "model/yoco_rows.h"

#include <algorithm>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer {

bool yoco_row_ranges(RowSpan rows, const V41TextConfig& config, std::vector<YocoRowRange>& ranges) {
  ranges.clear();
  const bool yoco = config.yoco_truncation != YocoTruncation::kOff && config.yoco_boundary >= 0;
  // A replayed KV-tier hit (ForwardRow::swa_valid_start) narrows every window, with or without
  // truncation; its start never lies after the row's, so it keeps every row in compact.
  const bool replay = std::any_of(rows.begin(), rows.end(),
                                  [](const ForwardRow& r) { return r.swa_valid_start > 0; });
  if (!yoco && !replay) return false;
  const bool compact = yoco && config.yoco_truncation == YocoTruncation::kCompact;
  bool narrows = false;
  for (size_t b = 0; b < rows.size(); ++b) {
    const ForwardRow& r = rows[b];
    const int32_t end = r.start_pos + r.num_tokens;
    if (r.prompt_end != 0 && r.prompt_end < end) {
      throw Error(ErrorCode::kInvalidArgument,
                  "forward batch: sequence " + std::to_string(b) + ": 'prompt_end' " +
                      std::to_string(r.prompt_end) + " lies before the row's end " +
                      std::to_string(end));
    }
    const int32_t prompt_end = r.prompt_end != 0 ? r.prompt_end : end;
    YocoRowRange range;
    range.swa_start = std::max(yoco ? prompt_end - config.yoco_keep_tokens : 0, r.swa_valid_start);
    range.first_kept = compact ? std::clamp(range.swa_start, r.start_pos, end) : r.start_pos;
    // The row's first query already sees no key before start_pos - W + 1.
    narrows = narrows || range.swa_start > std::max(0, r.start_pos - config.sliding_window + 1);
    ranges.push_back(range);
  }
  return narrows;
}

std::vector<int32_t> yoco_dropped_logit_rows(RowSpan rows, const V41TextConfig& config,
                                             LogitsMode mode) {
  std::vector<YocoRowRange> ranges;
  std::vector<int32_t> dropped;
  if (!yoco_row_ranges(rows, config, ranges)) return dropped;
  int32_t logit = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    const ForwardRow& r = rows[b];
    const int32_t first = mode == LogitsMode::kAll ? 0 : r.num_tokens - r.num_logits;
    for (int32_t i = first; i < r.num_tokens; ++i, ++logit) {
      if (r.start_pos + i < ranges[b].first_kept) dropped.push_back(logit);
    }
  }
  return dropped;
}

YocoRows plan_yoco_rows(RowSpan rows, const BatchPlan& plan, const V41TextConfig& config,
                        LogitsMode mode, Backend& backend) {
  YocoRows out;
  std::vector<YocoRowRange> ranges;
  if (!yoco_row_ranges(rows, config, ranges)) return out;
  out.narrows = true;
  const int num_seqs = static_cast<int>(rows.size());
  // Packed as: swa_start [B], then (when rows are dropped) kept_rows [T'], seq_q_start [B + 1],
  // seq_ctx_len [B], positions [T'], token_seq [T'], logit_rows [S'], next_positions [S'].
  std::vector<int32_t> swa_start, kept, q_start{0}, ctx_len, positions, token_seq, logit_rows,
      next_positions;
  int32_t row0 = 0;
  for (int b = 0; b < num_seqs; ++b) {
    const ForwardRow& r = rows[static_cast<size_t>(b)];
    const YocoRowRange& range = ranges[static_cast<size_t>(b)];
    swa_start.push_back(range.swa_start);
    ctx_len.push_back(range.first_kept);
    const int32_t first_logit = mode == LogitsMode::kAll ? 0 : r.num_tokens - r.num_logits;
    for (int32_t i = range.first_kept - r.start_pos; i < r.num_tokens; ++i) {
      if (i >= first_logit) {
        logit_rows.push_back(static_cast<int32_t>(kept.size()));
        next_positions.push_back(r.start_pos + i + 1);
      }
      kept.push_back(row0 + i);
      positions.push_back(r.start_pos + i);
      token_seq.push_back(b);
    }
    q_start.push_back(static_cast<int32_t>(kept.size()));
    row0 += r.num_tokens;
  }
  out.drops = static_cast<int>(kept.size()) < plan.layout.num_tokens;
  std::vector<int32_t> host = swa_start;
  if (out.drops) {
    for (const std::vector<int32_t>* part :
         {&kept, &q_start, &ctx_len, &positions, &token_seq, &logit_rows, &next_positions}) {
      host.insert(host.end(), part->begin(), part->end());
    }
  }
  out.metadata =
      backend.upload(Tensor::from_vector(host, {static_cast<int64_t>(host.size())}), DType::kI32);
  int64_t offset = 0;
  auto take = [&](size_t count) {
    Tensor view = out.metadata.narrow(0, offset, static_cast<int64_t>(count));
    offset += static_cast<int64_t>(count);
    return view;
  };
  out.swa_start = take(swa_start.size());
  if (!out.drops) return out;
  out.kept_rows = take(kept.size());
  BatchLayout& l = out.layout;
  l = plan.layout;  // block size, block table and slots stay the sequences'
  l.num_tokens = static_cast<int>(kept.size());
  l.seq_q_start = take(q_start.size());
  l.seq_ctx_len = take(ctx_len.size());
  l.positions = take(positions.size());
  l.token_seq = take(token_seq.size());
  l.token_ids = Tensor();  // the forward gathers them on the device (carried tokens)
  out.num_logit_rows = static_cast<int>(logit_rows.size());
  const Tensor wanted = take(logit_rows.size());
  if (mode != LogitsMode::kAll) out.logit_rows = wanted;
  out.next_positions = take(next_positions.size());
  return out;
}

}  // namespace deepinfer
