// The Backend front of sampling and of the rows carried between steps (contract in
// deepinfer/backend.h): argmax, sample, adjust_logits, select_tokens, shift_rows and
// accept_drafts check their arguments' metadata here, once for all backends, then call the
// backend's implementation. The other ops' front is backend.cpp.
#include <cstdint>
#include <string>
#include <utility>

#include "backend/op_checks.h"
#include "deepinfer/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {

using checks::OpChecks;

Tensor Backend::argmax(const Tensor& x) {
  const OpChecks c("argmax", device_kind());
  c.tensor("x", x, DType::kF32, {-1, -1});
  if (x.size(1) == 0) c.fail("argument x has no columns: " + x.describe());
  return argmax_impl(x);
}

namespace {

// The per-row sampling constants of `batch`, `rows` rows of them.
void check_sampling_batch(const OpChecks& c, const SamplingBatch& batch, int64_t rows) {
  if (batch.max_logprobs < 0) {
    c.fail("batch.max_logprobs must be >= 0, got " + std::to_string(batch.max_logprobs));
  }
  c.tensor("batch.temperature", batch.temperature, DType::kF32, {rows});
  c.tensor("batch.top_k", batch.top_k, DType::kI32, {rows});
  c.tensor("batch.top_p", batch.top_p, DType::kF32, {rows});
  c.tensor("batch.seed", batch.seed, DType::kI64, {rows});
  c.tensor("batch.position", batch.position, DType::kI32, {rows});
  c.tensor("batch.num_logprobs", batch.num_logprobs, DType::kI32, {rows});
}

}  // namespace

SampleResult Backend::sample(const Tensor& logits, const SamplingBatch& batch) {
  const OpChecks c("sample", device_kind());
  c.tensor("logits", logits, DType::kF32, {-1, -1});
  const int64_t rows = logits.size(0);
  if (batch.num_rows != rows) {
    c.fail("batch.num_rows is " + std::to_string(batch.num_rows) + ", expected the " +
           std::to_string(rows) + " rows of logits " + logits.describe());
  }
  if (logits.size(1) == 0) c.fail("argument logits has no columns: " + logits.describe());
  check_sampling_batch(c, batch, rows);
  return sample_impl(logits, batch);
}

void Backend::adjust_logits(const Tensor& logits, const LogitAdjustments& adjustments) {
  const OpChecks c("adjust_logits", device_kind());
  c.tensor("logits", logits, DType::kF32, {-1, -1});
  const int64_t n = adjustments.rows.defined() ? adjustments.rows.size(0) : 0;
  if (n > 0 || adjustments.tokens.defined() || adjustments.values.defined()) {
    c.tensor("adjustments.rows", adjustments.rows, DType::kI32, {-1});
    c.tensor("adjustments.tokens", adjustments.tokens, DType::kI32, {n});
    c.tensor("adjustments.values", adjustments.values, DType::kF32, {n});
  }
  c.optional("adjustments.allowed", adjustments.allowed, DType::kI32,
             {logits.size(0), (logits.size(1) + 31) / 32});
  adjust_logits_impl(logits, adjustments);
}

void Backend::select_tokens(const Tensor& tokens, const Tensor& remap, const Tensor& previous) {
  const OpChecks c("select_tokens", device_kind());
  c.tensor("tokens", tokens, DType::kI32, {-1});
  c.tensor("remap", remap, DType::kI32, {tokens.size(0)});
  c.tensor("previous", previous, DType::kI32, {-1});
  select_tokens_impl(tokens, remap, previous);
}

void Backend::shift_rows(const RowShift& shift) {
  const OpChecks c("shift_rows", device_kind());
  const BatchLayout& l = shift.layout;
  c.layout(l, /*need_block_table=*/true);
  const int64_t b = l.num_seqs;
  if (shift.num_real_seqs < 0 || shift.num_real_seqs > b) {
    c.fail("num_real_seqs " + std::to_string(shift.num_real_seqs) + " is outside [0, num_seqs " +
           std::to_string(b) + "]");
  }
  c.tensor("next_positions", shift.next_positions, DType::kI32, {-1});
  const int64_t s = shift.next_positions.size(0);
  if (shift.logit_rows.defined()) {
    c.tensor("logit_rows", shift.logit_rows, DType::kI32, {s});
  } else if (s != l.num_tokens) {
    c.fail("next_positions has " + std::to_string(s) + " rows but logit_rows is undefined, " +
           "which means one per token row (" + std::to_string(l.num_tokens) + ")");
  }
  c.optional("carry_remap", shift.carry_remap, DType::kI32, {l.num_tokens});
  c.tensor("shift_from", shift.shift_from, DType::kI32, {b});
  c.tensor("max_shift", shift.max_shift, DType::kI32, {b});
  c.tensor("accepted", shift.accepted, DType::kI32, {-1});
  for (const auto& [ratio, e] : shift.entries) {
    c.ratio(ratio, l);
    const std::string name = "entries[ratio " + std::to_string(ratio) + "]";
    if (shift.entry_per_row && e.num_entries != b) {
      c.fail(name + " has " + std::to_string(e.num_entries) +
             " entries; entry_per_row needs one per row (" + std::to_string(b) + ")");
    }
    for (const auto& [field, t] :
         {std::pair{".seq", &e.seq}, std::pair{".window", &e.window},
          std::pair{".rope_pos", &e.rope_pos}, std::pair{".dest", &e.dest}}) {
      c.tensor((name + field).c_str(), *t, DType::kI32, {e.num_entries});
    }
  }
  shift_rows_impl(shift);
}

Tensor Backend::accept_drafts(const Tensor& samples, const Tensor& tokens,
                              const Tensor& row_start) {
  const OpChecks c("accept_drafts", device_kind());
  c.tensor("samples", samples, DType::kI32, {-1});
  c.tensor("tokens", tokens, DType::kI32, {samples.size(0)});
  c.tensor("row_start", row_start, DType::kI32, {-1});
  if (row_start.size(0) < 1) c.fail("row_start is empty: it holds R + 1 row starts");
  return accept_drafts_impl(samples, tokens, row_start);
}

}  // namespace deepinfer
