// shift_rows of the CUDA backend: rows planned before the previous step's verification was known
// moved to the positions its accepted drafts give them, in place
// (cpp/src/backend/cpu_ops_sample.cpp is the reference; both run backend/row_shift.h). One block: a
// decode batch has at most a few hundred rows, and this runs once per step before the forward.
#include <cstdint>

#include "backend/row_shift.h"
#include "cuda/backend/cuda_backend.h"
#include "cuda/common/cluster_launch.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/pdl.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

constexpr int kShiftThreads = 256;
constexpr int kShiftMaxRatios = 4;  // V4 uses 2 (CSA 4, HCA 128), V4.1 3

struct ShiftEntries {
  int32_t ratio = 0;
  int32_t num_entries = 0;
  int32_t* seq = nullptr;
  int32_t* window = nullptr;
  int32_t* rope_pos = nullptr;
  int32_t* dest = nullptr;
};

struct ShiftArgs {
  int32_t* positions;
  int32_t* ctx_len;
  const int32_t* q_start;
  const int32_t* block_table;
  int32_t* next_positions;
  const int32_t* logit_rows;  // nullptr: logits row i is token row i
  int32_t* carry;             // nullptr: none
  const int32_t* shift_from;
  const int32_t* max_shift;
  const int32_t* accepted;
  int64_t num_accepted;
  int64_t width;
  int32_t num_seqs, num_real, num_logits, block_size;
  bool entry_per_row;
  int32_t num_ratios;
  ShiftEntries entries[kShiftMaxRatios];
};

__global__ void __launch_bounds__(kShiftThreads) shift_rows_kernel(ShiftArgs a) {
  enter_dependent_grid();
  const int tid = static_cast<int>(threadIdx.x);
  // The rows' moves; an invalid one (the CPU op throws) leaves its row where it was.
  for (int32_t s = tid; s < a.num_real; s += kShiftThreads) {
    bool ok = true;
    const int32_t move = row_shift::row_move(a.shift_from[s], a.max_shift[s], a.accepted,
                                             a.num_accepted, a.ctx_len[s], &ok);
    if (move == 0) continue;
    a.ctx_len[s] += move;
    for (int32_t r = a.q_start[s]; r < a.q_start[s + 1]; ++r) {
      a.positions[r] += move;
      if (a.carry != nullptr && a.carry[r] >= 0) a.carry[r] += move;
    }
  }
  __syncthreads();
  for (int32_t i = tid; i < a.num_logits; i += kShiftThreads)
    a.next_positions[i] = a.positions[a.logit_rows != nullptr ? a.logit_rows[i] : i] + 1;
  for (int32_t k = 0; k < a.num_ratios; ++k) {
    const ShiftEntries& e = a.entries[k];
    const int32_t epb = a.block_size / e.ratio;
    auto put = [&](int64_t i, const row_shift::Entry& x) {
      e.seq[i] = x.seq;
      e.window[i] = x.window;
      e.rope_pos[i] = x.rope_pos;
      e.dest[i] = x.dest;
    };
    if (a.entry_per_row) {
      for (int32_t s = tid; s < a.num_seqs; s += kShiftThreads) {
        put(s, row_shift::row_entry(s, s < a.num_real, e.ratio, epb, a.ctx_len[s],
                                    a.block_table + s * a.width));
      }
    } else if (tid == k) {  // dense: one thread per ratio walks the rows in order
      (void)row_shift::fill_dense_entries(e.ratio, epb, a.ctx_len, a.q_start, a.block_table,
                                          a.width, a.num_real, a.num_seqs, e.num_entries, put);
    }
  }
}

__global__ void __launch_bounds__(kShiftThreads)
    accept_drafts_kernel(const int32_t* samples, const int32_t* tokens, const int32_t* row_start,
                         int32_t* accepted, int64_t rows, int32_t num_tokens) {
  enter_dependent_grid();
  // Row starts outside [0, T] or decreasing (the CPU op throws) are clamped into it.
  for (int64_t r = threadIdx.x; r < rows; r += kShiftThreads) {
    const int32_t begin = min(max(row_start[r], 0), num_tokens);
    const int32_t end = min(max(row_start[r + 1], begin), num_tokens);
    accepted[r] = row_shift::accepted_drafts(samples, tokens, begin, end);
  }
}

}  // namespace

Tensor CudaBackend::accept_drafts_impl(const Tensor& samples, const Tensor& tokens,
                                       const Tensor& row_start) {
  const int64_t rows = row_start.size(0) - 1;
  Tensor accepted = empty({rows}, DType::kI32);
  if (rows == 0) return accepted;
  launch_programmatic("accept_drafts", dim3(1), dim3(kShiftThreads), 0, stream(), pdl(),
                      accept_drafts_kernel, samples.data<int32_t>(), tokens.data<int32_t>(),
                      row_start.data<int32_t>(), accepted.data<int32_t>(), rows,
                      static_cast<int32_t>(samples.size(0)));
  DEEPINFER_CUDA_LAUNCH_CHECK("accept_drafts");
  return accepted;
}

void CudaBackend::shift_rows_impl(const RowShift& shift) {
  const BatchLayout& l = shift.layout;
  if (static_cast<int>(shift.entries.size()) > kShiftMaxRatios) {
    throw Error(ErrorCode::kUnsupported, "shift_rows: " + std::to_string(shift.entries.size()) +
                                             " compression ratios, at most " +
                                             std::to_string(kShiftMaxRatios) + " supported");
  }
  ShiftArgs a{};
  a.positions = l.positions.data<int32_t>();
  a.ctx_len = l.seq_ctx_len.data<int32_t>();
  a.q_start = l.seq_q_start.data<int32_t>();
  a.block_table = l.block_table.data<int32_t>();
  a.next_positions = shift.next_positions.data<int32_t>();
  a.logit_rows = shift.logit_rows.defined() ? shift.logit_rows.data<int32_t>() : nullptr;
  a.carry = shift.carry_remap.defined() ? shift.carry_remap.data<int32_t>() : nullptr;
  a.shift_from = shift.shift_from.data<int32_t>();
  a.max_shift = shift.max_shift.data<int32_t>();
  a.accepted = shift.accepted.data<int32_t>();
  a.num_accepted = shift.accepted.size(0);
  a.width = l.max_blocks_per_seq;
  a.num_seqs = l.num_seqs;
  a.num_real = shift.num_real_seqs;
  a.num_logits = static_cast<int32_t>(shift.next_positions.size(0));
  a.block_size = l.block_size;
  a.entry_per_row = shift.entry_per_row;
  a.num_ratios = static_cast<int32_t>(shift.entries.size());
  for (int32_t k = 0; k < a.num_ratios; ++k) {
    const auto& [ratio, e] = shift.entries[static_cast<size_t>(k)];
    a.entries[k] = {ratio,
                    e.num_entries,
                    e.seq.data<int32_t>(),
                    e.window.data<int32_t>(),
                    e.rope_pos.data<int32_t>(),
                    e.dest.data<int32_t>()};
  }
  launch_programmatic("shift_rows", dim3(1), dim3(kShiftThreads), 0, stream(), pdl(),
                      shift_rows_kernel, a);
  DEEPINFER_CUDA_LAUNCH_CHECK("shift_rows");
}

}  // namespace deepinfer::cuda
