// StepPlan: what one engine step runs, decided by the scheduler and executed by the engine's
// StepExecutor; StepResult: what the step produced, which the scheduler commits.
//
// A step is all-prefill or all-decode. Each row is one sequence's chunk of query tokens at
// positions [start_pos, start_pos + q). Rows whose first input token is still on the device
// (sampled by the previous, uncommitted step) carry `carried = true`; the executor takes that
// token from the previous step's device output (remap by sequence id, engine/remap.h).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "deepinfer/engine.h"
#include "kv/block_pool.h"

namespace deepinfer::sched {

struct PlannedRow {
  RequestId seq_id = 0;
  uint32_t epoch = 0;
  int32_t slot = 0;
  int start_pos = 0;
  int q = 0;
  bool carried = false;  // tokens[0] comes from the previous step's device output
  bool samples = false;  // the row's last position produces a new token (decode, final chunk)
  std::span<const int32_t> tokens;           // q host tokens (tokens[0] ignored if carried)
  std::span<const kv::BlockId> block_table;  // borrowed from the sequence until launch
  // Sampling parameters of the token this row generates (when samples).
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int num_logprobs = 0;
  int32_t forced_token = -1;  // SamplingParams::forced_tokens hook: emit this instead (-1: sample)
};

struct StepPlan {
  uint64_t step_id = 0;
  bool is_prefill = false;
  std::vector<PlannedRow> rows;
  // State-slot copies around the forward: restore prefix-cache snapshots into live slots before
  // it, save live slots into snapshot slots after it. (src, dst) pairs.
  std::vector<std::pair<int32_t, int32_t>> copies_before;
  std::vector<std::pair<int32_t, int32_t>> copies_after;

  bool empty() const { return rows.empty(); }
  int num_tokens() const;
  void clear();
};

// Host results of one step: one entry per sampling row, in row order.
struct StepResult {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  // per sampling row when any row asked for them, else empty
};

inline int StepPlan::num_tokens() const {
  int n = 0;
  for (const PlannedRow& r : rows) n += r.q;
  return n;
}

inline void StepPlan::clear() {
  rows.clear();
  copies_before.clear();
  copies_after.clear();
  is_prefill = false;
}

}  // namespace deepinfer::sched
