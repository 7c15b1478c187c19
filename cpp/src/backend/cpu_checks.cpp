#include "backend/cpu_checks.h"

namespace deepinfer::cpu {

namespace {

std::string expected_str(DType dtype, const Shape& shape) {
  std::string s = std::string(dtype_name(dtype)) + "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

void check_defined_on_host(const char* op, const char* arg, const Tensor& t,
                           const std::string& expected) {
  if (!t.defined()) {
    fail(op, std::string("argument ") + arg + " must be " + expected + ", got an undefined tensor");
  }
  if (t.device().kind != DeviceKind::kCpu) {
    fail(op, std::string("argument ") + arg + " must be in host memory, got " + t.describe());
  }
}

void check_defined_host(const char* op, const char* arg, const Tensor& t,
                        const std::string& expected) {
  check_defined_on_host(op, arg, t, expected);
  if (!t.is_contiguous()) {
    fail(op, std::string("argument ") + arg + " must be contiguous, got a strided view " +
                 t.describe());
  }
}

}  // namespace

void fail(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": " + what);
}

void check_tensor(const char* op, const char* arg, const Tensor& t, DType dtype,
                  const Shape& shape) {
  const std::string expected = expected_str(dtype, shape);
  check_defined_host(op, arg, t, expected);
  bool ok = t.dtype() == dtype && t.shape().size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == t.shape()[i];
  if (!ok) {
    fail(op, std::string("argument ") + arg + " must be " + expected + ", got " + t.describe());
  }
}

void check_rank(const char* op, const char* arg, const Tensor& t, DType dtype, int64_t min_rank,
                int64_t max_rank) {
  const std::string expected = std::string(dtype_name(dtype)) + " of rank " +
                               std::to_string(min_rank) +
                               (max_rank != min_rank ? "-" + std::to_string(max_rank) : "");
  check_defined_host(op, arg, t, expected);
  if (t.dtype() != dtype || t.dim() < min_rank || t.dim() > max_rank) {
    fail(op, std::string("argument ") + arg + " must be " + expected + ", got " + t.describe());
  }
}

void check_dense(const char* op, const char* arg, const Tensor& t) {
  check_defined_host(op, arg, t, "a tensor");
}

void check_host(const char* op, const char* arg, const Tensor& t) {
  check_defined_on_host(op, arg, t, "a tensor");
}

void check_layout(const char* op, const BatchLayout& layout, bool need_block_table) {
  const int64_t t = layout.num_tokens;
  const int64_t b = layout.num_seqs;
  if (t < 0 || b < 0 || layout.block_size <= 0) {
    fail(op, "layout has num_tokens " + std::to_string(t) + ", num_seqs " + std::to_string(b) +
                 ", block_size " + std::to_string(layout.block_size) +
                 " (expected >= 0, >= 0, > 0)");
  }
  check_tensor(op, "layout.positions", layout.positions, DType::kI32, {t});
  check_tensor(op, "layout.seq_q_start", layout.seq_q_start, DType::kI32, {b + 1});
  check_tensor(op, "layout.seq_ctx_len", layout.seq_ctx_len, DType::kI32, {b});
  check_tensor(op, "layout.seq_slot", layout.seq_slot, DType::kI32, {b});
  if (need_block_table) {
    check_tensor(op, "layout.block_table", layout.block_table, DType::kI32,
                 {b, layout.max_blocks_per_seq});
  }
}

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
