#include "sched/sequence.h"

#include <algorithm>

#include "deepinfer/error.h"

namespace deepinfer::sched {

int Sequence::remaining_budget(int max_model_len) const {
  int by_tokens = num_prompt_tokens + params.max_tokens - optimistic_tokens();
  int by_length = max_model_len - optimistic_tokens();
  return std::max(0, std::min(by_tokens, by_length));
}

void Sequence::check_invariants() const {
  auto fail = [this](const std::string& what) {
    throw Error(ErrorCode::kInternal, "sequence " + std::to_string(id) + ": " + what + " (tokens " +
                                          std::to_string(num_tokens()) + ", computed " +
                                          std::to_string(num_computed) + ", inflight steps " +
                                          std::to_string(inflight.steps) + " kv " +
                                          std::to_string(inflight.kv) + " reserved " +
                                          std::to_string(inflight.reserved) + ")");
  };
  if (inflight.steps < 0 || inflight.steps > 2) fail("more than two steps in flight");
  if (inflight.reserved < kStepReservation * inflight.steps)
    fail("in-flight reservation is below one token per step");
  if (inflight.kv < 0) fail("negative in-flight kv");
  if (num_computed > num_tokens()) fail("num_computed exceeds num_tokens");
  if (num_computed + inflight.kv > num_tokens() + inflight.reserved) {
    fail("dispatched positions exceed the tokens that can exist");
  }
  if (state == SeqState::kFetching) {
    const bool fetching = tier_fetch != 0 && fetch_wait == 0 && holds_resources();
    const bool waiting = tier_fetch == 0 && fetch_wait != 0 && !holds_resources();
    if ((!fetching && !waiting) || inflight.steps != 0 || num_computed != 0)
      fail(
          "fetching without either a fetch and reserved blocks or a fetch to wait for holding "
          "nothing, or with work dispatched");
  }
  if (tier_fetch != 0 && state != SeqState::kFetching) fail("a tier fetch outside kFetching");
  if (state == SeqState::kFinished && inflight.steps == 0 && holds_resources()) {
    fail("finished with nothing in flight but still holding KV resources");
  }
}

}  // namespace deepinfer::sched
