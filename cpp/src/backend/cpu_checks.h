// Argument checks shared by the CPU backend's ops. Two kinds:
//  - metadata checks (dtype, shape, contiguity, device), run on the calling thread when an op is
//    enqueued;
//  - content checks (ids, positions, block tables), run on the stream worker where the contents
//    are valid; a failure there surfaces at the next synchronize() / Event::wait().
// Both throw Error(kInvalidArgument) with a message that starts with the op name.
#pragma once

#include <cstdint>
#include <string>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "deepinfer/tensor.h"

namespace deepinfer::cpu {

[[noreturn]] void fail(const char* op, const std::string& what);

// Requires a defined, contiguous host tensor of `dtype` whose shape matches `shape`; an entry
// of -1 in `shape` accepts any size.
void check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype,
                  const Shape& shape);
// Requires a defined, contiguous host tensor of `dtype` with a rank in [min_rank, max_rank].
void check_rank(const char* op, const char* arg, const Tensor& t, DType dtype, int64_t min_rank,
                int64_t max_rank);
// Requires `t` to be defined, in host memory and contiguous (any dtype and shape).
void check_dense(const char* op, const char* arg, const Tensor& t);
// Requires `t` to be defined and in host memory (any dtype, shape and strides).
void check_host(const char* op, const char* arg, const Tensor& t);

// Checks the metadata of every tensor of `layout`; `need_block_table` also requires
// block_table [B, max_blocks_per_seq].
void check_layout(const char* op, const BatchLayout& layout, bool need_block_table);

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
