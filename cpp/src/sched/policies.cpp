#include "sched/policies.h"

#include "deepinfer/error.h"

namespace deepinfer::sched {

InterleavePolicy::InterleavePolicy(int prefill_steps_per_decode_step)
    : prefill_per_decode_(prefill_steps_per_decode_step) {
  if (prefill_per_decode_ < 1) {
    throw Error(ErrorCode::kInvalidArgument, "prefill_steps_per_decode_step must be >= 1, got " +
                                                 std::to_string(prefill_per_decode_));
  }
}

StepKind InterleavePolicy::choose(bool has_prefill_work, bool has_decode_work) const {
  if (!has_decode_work) return StepKind::kPrefill;
  if (!has_prefill_work) return StepKind::kDecode;
  return prefills_in_a_row_ < prefill_per_decode_ ? StepKind::kPrefill : StepKind::kDecode;
}

void InterleavePolicy::record(StepKind ran) {
  prefills_in_a_row_ = ran == StepKind::kPrefill ? prefills_in_a_row_ + 1 : 0;
}

int choose_preemption_victim(const std::vector<Sequence*>& running, int first_candidate) {
  for (int i = static_cast<int>(running.size()) - 1; i >= first_candidate; --i) {
    // Only a running sequence holds blocks to give back: a finished one is leaving, and one
    // preempted earlier in this schedule (state kWaiting) has already given them back.
    if (running[static_cast<size_t>(i)]->state == SeqState::kRunning) return i;
  }
  return -1;
}

}  // namespace deepinfer::sched
