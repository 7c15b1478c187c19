// Content checks of the CPU backend's ops (ids, positions, block tables): they run on the stream
// worker, where the contents are valid, and a failure surfaces at the next synchronize() /
// Event::wait(). The metadata of the arguments (dtype, shape, contiguity, device) was checked by
// the Backend front (op_checks.h) when the op was enqueued. Failures throw Error(kInvalidArgument)
// with a message that starts with the op name, like the metadata checks.
#pragma once

#include <cstdint>

#include "backend/op_checks.h"
#include "deepinfer/backend.h"

namespace deepinfer::cpu {

using checks::fail;

// Worker-side view of a BatchLayout's contents. `validate` checks what every op relies on:
// seq_q_start starts at 0, is non-decreasing and ends at T, every sequence's positions are
// ctx_len, ctx_len + 1, ... and slots are within [0, num_slots) (num_slots < 0: not checked).
struct LayoutView {
  int num_tokens = 0;
  int num_seqs = 0;
  int block_size = 0;
  int max_blocks = 0;
  const int32_t* positions = nullptr;
  const int32_t* q_start = nullptr;
  const int32_t* ctx_len = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* block_table = nullptr;  // null when the layout has none

  LayoutView(const char* op, const BatchLayout& layout, int64_t num_slots);

  int q_len(int b) const { return q_start[b + 1] - q_start[b]; }
  // Row of the paged entry cache holding entry j of sequence b, with `epb` entries per block;
  // fails when j lies past the block table or the row past `cache_rows`.
  int64_t entry_row(const char* op, int b, int64_t j, int epb, int64_t cache_rows) const;
};

}  // namespace deepinfer::cpu
