// The arithmetic of Backend::shift_rows (deepinfer/backend_args.h, RowShift) and accept_drafts,
// one definition for the CPU ops and the CUDA kernels: the drafts a verify row accepted, how far a
// row then moves, and the compressed entries its tokens close once it has moved, packed as
// model/batch_plan.cpp's pack_batch packs them from host positions.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace deepinfer::row_shift {

// Row s's move (<= 0) when it stays valid: shift_from k in [0, num_accepted), accepted[k] in
// [0, max_shift], and the row's start ctx_len + move >= 0. Otherwise `ok` is false and the move 0.
DEEPINFER_HOST_DEVICE inline int32_t row_move(int32_t k, int32_t max_shift, const int32_t* accepted,
                                              int64_t num_accepted, int32_t ctx_len, bool* ok) {
  *ok = true;
  if (k < 0) return 0;
  if (k >= num_accepted) {
    *ok = false;
    return 0;
  }
  const int32_t a = accepted[k];
  const int32_t move = a - max_shift;
  if (a < 0 || move > 0 || ctx_len + move < 0) {
    *ok = false;
    return 0;
  }
  return move;
}

// The drafts a verify row accepted (Backend::accept_drafts): its token rows [begin, end) hold the
// input token and the drafts; sample j is the token after input j, so draft j (token j + 1) is
// accepted while it equals sample j and every draft before it was.
DEEPINFER_HOST_DEVICE inline int32_t accepted_drafts(const int32_t* samples, const int32_t* tokens,
                                                     int32_t begin, int32_t end) {
  int32_t a = 0;
  while (begin + a + 1 < end && samples[begin + a] == tokens[begin + a + 1]) ++a;
  return a;
}

// One compressed entry: its fields, in EntryBatch's order.
struct Entry {
  int32_t seq;
  int32_t window;
  int32_t rope_pos;
  int32_t dest;
};

// Padding (no window closes there): stores nothing.
DEEPINFER_HOST_DEVICE inline Entry padding_entry(int32_t seq) {
  return {seq, -1, 0, -1};
}

// Entry w of a sequence whose block table row is `table` (logical block -> physical block), in a
// cache of `entries_per_block` entries per block (kv::entry_row).
DEEPINFER_HOST_DEVICE inline Entry closed_entry(int32_t seq, int64_t w, int32_t ratio,
                                                const int32_t* table, int32_t entries_per_block) {
  const int64_t block = table[w / entries_per_block];
  return {seq, static_cast<int32_t>(w), static_cast<int32_t>(w * ratio),
          static_cast<int32_t>(block * entries_per_block + w % entries_per_block)};
}

// The windows tokens [start, start + n) close: [start / ratio, (start + n) / ratio).
DEEPINFER_HOST_DEVICE inline int64_t first_window(int64_t start, int32_t ratio) {
  return start / ratio;
}
DEEPINFER_HOST_DEVICE inline int64_t end_window(int64_t start, int64_t n, int32_t ratio) {
  return (start + n) / ratio;
}

// The entries of one ratio, dense in row order over the first `real` rows (start ctx_len[s],
// q_start[s + 1] - q_start[s] tokens, block table row s of `width` columns), then padding entries
// of the last row up to `capacity`. Calls put(i, entry) for i in [0, capacity); returns false
// (having written the first `capacity`) when the rows close more entries than that.
template <class Put>
DEEPINFER_HOST_DEVICE bool fill_dense_entries(int32_t ratio, int32_t entries_per_block,
                                              const int32_t* ctx_len, const int32_t* q_start,
                                              const int32_t* block_table, int64_t width,
                                              int32_t real, int32_t num_seqs, int64_t capacity,
                                              Put put) {
  int64_t n = 0;
  for (int32_t s = 0; s < real; ++s) {
    const int64_t start = ctx_len[s];
    const int64_t tokens = q_start[s + 1] - q_start[s];
    for (int64_t w = first_window(start, ratio); w < end_window(start, tokens, ratio); ++w, ++n) {
      if (n >= capacity) return false;
      put(n, closed_entry(s, w, ratio, block_table + s * width, entries_per_block));
    }
  }
  for (; n < capacity; ++n) put(n, padding_entry(num_seqs - 1));
  return true;
}

// One slot per one-token row (a decode graph's layout): the window row s's token closes, if any.
DEEPINFER_HOST_DEVICE inline Entry row_entry(int32_t s, bool real, int32_t ratio,
                                             int32_t entries_per_block, int32_t start,
                                             const int32_t* table) {
  if (!real || (start + 1) % ratio != 0) return padding_entry(s);
  return closed_entry(s, start / ratio, ratio, table, entries_per_block);
}

}  // namespace deepinfer::row_shift
