// Small scheduling policies, each a separate object so it can be tested and swapped alone.
#pragma once

#include <vector>

#include "sched/sequence.h"

namespace deepinfer::sched {

enum class StepKind { kPrefill, kDecode };

// Prefill/decode interleave. A step is never mixed, so while both kinds of work exist the engine
// alternates: `prefill_steps_per_decode_step` prefill steps, then one decode step.
//
// Default 1 (strict alternation). Why: a prefill step is bounded by max_num_batched_tokens, so a
// long prompt is split into bounded chunks and every running sequence gets a decode step at least
// every other step; its inter-token latency grows by at most one prefill chunk, while new prompts
// still start within one step. Larger values favour time-to-first-token under bursts of arrivals.
class InterleavePolicy {
 public:
  explicit InterleavePolicy(int prefill_steps_per_decode_step);
  StepKind choose(bool has_prefill_work, bool has_decode_work) const;
  void record(StepKind ran);

 private:
  int prefill_per_decode_;
  int prefills_in_a_row_ = 0;
};

// Preemption victim: the running sequence that arrived last (LIFO on arrival). Why: the newest
// request has the least waiting time invested and, with FIFO admission, is the one that would be
// admitted last anyway, so older requests never lose progress to newer ones. Returns the index
// into `running` (sorted by arrival, oldest first) among positions >= `first_candidate` whose
// sequence is running (not finished, not already preempted), or -1.
int choose_preemption_victim(const std::vector<Sequence*>& running, int first_candidate);

}  // namespace deepinfer::sched
