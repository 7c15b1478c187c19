#include "backend/cpu_checks.h"

#include <string>

namespace deepinfer::cpu {

LayoutView::LayoutView(const char* op, const BatchLayout& layout, int64_t num_slots)
    : num_tokens(layout.num_tokens),
      num_seqs(layout.num_seqs),
      block_size(layout.block_size),
      max_blocks(layout.max_blocks_per_seq),
      positions(layout.positions.data<int32_t>()),
      q_start(layout.seq_q_start.data<int32_t>()),
      ctx_len(layout.seq_ctx_len.data<int32_t>()),
      slot(layout.seq_slot.data<int32_t>()),
      block_table(layout.block_table.defined() ? layout.block_table.data<int32_t>() : nullptr) {
  if (q_start[0] != 0 || q_start[num_seqs] != num_tokens) {
    fail(op, "layout.seq_q_start must run from 0 to num_tokens " + std::to_string(num_tokens) +
                 ", got " + std::to_string(q_start[0]) + " .. " +
                 std::to_string(q_start[num_seqs]));
  }
  // Monotone from 0 to T keeps every row range inside [0, T); check it for all sequences before
  // reading positions through it.
  for (int b = 0; b < num_seqs; ++b) {
    if (q_start[b + 1] < q_start[b]) {
      fail(op, "layout.seq_q_start decreases at sequence " + std::to_string(b) + " (" +
                   std::to_string(q_start[b]) + " -> " + std::to_string(q_start[b + 1]) + ")");
    }
  }
  for (int b = 0; b < num_seqs; ++b) {
    if (ctx_len[b] < 0) {
      fail(op, "layout.seq_ctx_len[" + std::to_string(b) +
                   "] is negative: " + std::to_string(ctx_len[b]));
    }
    if (num_slots >= 0 && (slot[b] < 0 || slot[b] >= num_slots)) {
      fail(op, "layout.seq_slot[" + std::to_string(b) + "] = " + std::to_string(slot[b]) +
                   " is outside [0, " + std::to_string(num_slots) + ")");
    }
    // Ops locate this call's rows of a position p as q_start + p - ctx_len; that only holds when
    // a sequence's rows are consecutive positions starting at its context length.
    for (int t = q_start[b]; t < q_start[b + 1]; ++t) {
      const int64_t expected = static_cast<int64_t>(ctx_len[b]) + (t - q_start[b]);
      if (positions[t] != expected) {
        fail(op, "layout.positions[" + std::to_string(t) + "] = " + std::to_string(positions[t]) +
                     ", expected " + std::to_string(expected) + " (seq_ctx_len[" +
                     std::to_string(b) + "] + row offset)");
      }
    }
  }
}

int64_t LayoutView::entry_row(const char* op, int b, int64_t j, int epb, int64_t cache_rows) const {
  const int64_t logical = j / epb;
  if (logical >= max_blocks) {
    fail(op, "entry " + std::to_string(j) + " of sequence " + std::to_string(b) +
                 " needs logical block " + std::to_string(logical) + ", past max_blocks_per_seq " +
                 std::to_string(max_blocks));
  }
  const int64_t block = block_table[static_cast<int64_t>(b) * max_blocks + logical];
  const int64_t row = block * epb + j % epb;
  if (block < 0 || row >= cache_rows) {
    fail(op, "entry " + std::to_string(j) + " of sequence " + std::to_string(b) +
                 " maps to block " + std::to_string(block) + ", row " + std::to_string(row) +
                 ", outside the cache's " + std::to_string(cache_rows) + " rows");
  }
  return row;
}

}  // namespace deepinfer::cpu
