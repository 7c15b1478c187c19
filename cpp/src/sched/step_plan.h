// StepPlan: what one engine step runs, decided by the scheduler, executed by the engine's
// StepExecutor and committed back by the scheduler. StepResult: what the step produced.
//
// A step is all-prefill or all-decode. Each StepRow is one sequence's chunk of query tokens; its
// `forward` part is exactly what the model reads (the executor hands the rows to the model in
// place, model/batch_plan.h), the rest is what sampling and the commit need. The same plan object
// lives from scheduling to commit: the engine keeps it with the launched step.
//
// Lifetimes: `forward.tokens` and `forward.block_table` borrow the sequence's vectors and are read
// only while the step is launched; the commit reads the plain fields.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/engine.h"
#include "model/batch_plan.h"

namespace deepinfer::sched {

struct Sequence;

struct StepRow {
  // What the forward reads: slot, positions [start_pos, start_pos + num_tokens), host tokens,
  // block table, and for a carried row `token_from_previous`: the index of this sequence's
  // sampling row in the previous step, whose token is still on the device.
  ForwardRow forward;
  RequestId seq_id = 0;
  uint32_t epoch = 0;
  // Tokens this row generates: 0 for a prefill chunk that stops short of the prompt's end, 1 for
  // a decode row or a final chunk (more once speculative verification scores several positions).
  int num_sampled = 0;
  // Sampling of the generated tokens: the sequence's parameters (valid until the commit; the
  // sequence outlives its in-flight steps) and its seed.
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;
  // The row's sequence (alive until this step is committed): its committed outputs drive logit
  // adjustments (penalties, constraints) at sampling time.
  const Sequence* sequence = nullptr;
  int32_t forced_token = -1;  // SamplingParams::forced_tokens hook: emit this instead (-1: sample)
  // Speculative decoding: a verify row's drafts follow its input token in `forward.tokens`; the
  // forward returns 1 + num_drafts logits rows for it and the step commits 1..1 + num_drafts
  // tokens. `reserved` is what the row reserves in its sequence's in-flight ledger.
  int num_drafts = 0;
  int reserved = 1;
  // Commit bookkeeping: a snapshot slot the state is copied into after this row's chunk.
  int32_t snapshot = -1;
  int snapshot_pos = 0;

  bool samples() const { return num_sampled > 0; }
  bool verifies() const { return num_drafts > 0; }
  bool carried() const { return forward.token_from_previous >= 0; }
};

struct StepPlan {
  uint64_t step_id = 0;
  bool is_prefill = false;
  std::vector<StepRow> rows;
  // State-slot copies around the forward: restore prefix-cache snapshots into live slots before
  // it, save live slots into snapshot slots after it. (src, dst) pairs.
  std::vector<std::pair<int32_t, int32_t>> copies_before;
  std::vector<std::pair<int32_t, int32_t>> copies_after;

  bool empty() const { return rows.empty(); }
  int num_tokens() const;
  int num_sampling_rows() const;
  // The rows as the model reads them, in place.
  RowSpan forward_rows() const { return {std::span<const StepRow>(rows), &StepRow::forward}; }
  void clear();
};

// Host results of one step: the sampled tokens of the sampling rows, in row order.
struct StepResult {
  // Per sampling row, in row order: one token, or for a verify row its accepted drafts and final
  // token (then `counts` holds each sampling row's number of tokens; empty: one each).
  std::vector<int32_t> tokens;
  std::vector<int> counts;
  std::vector<TokenLogprobs> logprobs;  // per token of `tokens` when any row asked, else empty
  // (sampling row, message): a row whose constraint failed while its logits were adjusted; the
  // commit ends that request with kGrammarError.
  std::vector<std::pair<int, std::string>> constraint_errors;
  // speculative_method "mtp": per sampling row, the MTP block's greedy drafts for the tokens
  // after this step's (empty: the executor drafts nothing).
  std::vector<std::vector<int32_t>> drafts;
  // Parallel to `drafts` (empty: none known): the confidence budget's estimate for each draft
  // (draft_budget.h): V4.1's DSpark confidence, or the draft's probability under V4's MTP block
  // softmax (temperature 1).
  std::vector<std::vector<float>> draft_probs;
};

inline int StepPlan::num_tokens() const {
  int n = 0;
  for (const StepRow& r : rows) n += r.forward.num_tokens;
  return n;
}

inline int StepPlan::num_sampling_rows() const {
  int n = 0;
  for (const StepRow& r : rows) n += r.samples() ? 1 : 0;
  return n;
}

inline void StepPlan::clear() {
  rows.clear();
  copies_before.clear();
  copies_after.clear();
  is_prefill = false;
  step_id = 0;
}

}  // namespace deepinfer::sched
