// The commit of a finished step (Scheduler::commit): its sampled tokens appended row by row with
// the stop checks, verified drafts counted, and the KV it computed handed to the prefix index and
// the tiers before a finishing request gives its blocks back.
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/error.h"
#include "sched/scheduler.h"

namespace deepinfer::sched {

namespace {

// The constraint's verdict on an emitted token: "" if allowed, else why not (the request ends
// with kGrammarError; a throwing constraint ends only its own request).
std::string advance_constraint(TokenConstraint& constraint, int32_t token) {
  try {
    if (constraint.accept(token)) return "";
    return "the output constraint does not allow token " + std::to_string(token) + " here";
  } catch (const std::exception& e) {
    return std::string("the output constraint failed: ") + e.what();
  }
}

bool constraint_is_done(TokenConstraint& constraint, std::string& error) {
  try {
    return constraint.is_terminated();
  } catch (const std::exception& e) {
    error = std::string("the output constraint failed: ") + e.what();
    return false;
  }
}

}  // namespace

bool Scheduler::is_stop_token(const Sequence& s, int32_t token) const {
  if (!s.params.ignore_eos &&
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end()) {
    return true;
  }
  return std::find(s.params.stop_token_ids.begin(), s.params.stop_token_ids.end(), token) !=
         s.params.stop_token_ids.end();
}

void Scheduler::commit(const StepPlan& plan, const StepResult& result,
                       std::vector<RequestOutput>& out) {
  size_t sample_index = 0;  // sampling rows so far
  size_t token_index = 0;   // their tokens so far (several for a verify row)
  bool verified = false;    // a verify row was committed
  for (const StepRow& r : plan.rows) {
    const size_t my_sample = sample_index;
    const size_t my_first = token_index;
    size_t my_count = 0;
    if (r.samples()) {
      DEEPINFER_CHECK(my_sample < result.tokens.size() || !result.counts.empty(),
                      "step result has fewer tokens than sampling rows");
      my_count = result.counts.empty() ? 1 : static_cast<size_t>(result.counts.at(my_sample));
      DEEPINFER_CHECK(my_count >= 1 && my_count <= static_cast<size_t>(r.reserved),
                      "a row committed more tokens than it reserved");
    }
    sample_index += static_cast<size_t>(r.num_sampled);
    token_index += my_count;
    DEEPINFER_CHECK(token_index <= result.tokens.size(),
                    "step result has fewer tokens than its rows");
    auto it = seqs_.find(r.seq_id);
    DEEPINFER_CHECK(it != seqs_.end(), "a committed row belongs to a retired sequence");
    Sequence& s = *it->second;
    DEEPINFER_CHECK(r.epoch == s.epoch, "a row outlived a preemption of its sequence");
    s.inflight.steps -= 1;
    s.inflight.reserved -= r.reserved;
    s.inflight.kv -= r.forward.num_tokens;
    if (s.finished()) {
      // Aborted or stopped while this step ran: its results are dropped. Of a verify row only the
      // input token's position counts as computed (the drafts were never committed).
      s.num_computed += r.verifies() ? 1 : r.forward.num_tokens;
      kv_.prefix_cache().release_snapshot_slot(r.snapshot);
      release_if_done(s);
      continue;
    }
    if (!r.samples()) {
      s.num_computed += r.forward.num_tokens;
      kv_.on_committed(s, r.snapshot, r.snapshot_pos);
      continue;
    }
    if (r.verifies()) {
      stats_.draft_tokens += static_cast<uint64_t>(r.num_drafts);
      stats_.accepted_draft_tokens += my_count - 1;
      s.draft_estimate.update(r.num_drafts, static_cast<int>(my_count) - 1);
      ++stats_.verify_rows;
      verified = true;
      // A row carried on the device verified the drafts made past the step before it, whose
      // probabilities came with that step's commit (scheduler_drafts.cpp: device_carries).
      if (r.carried()) {
        DraftEstimate::of_probabilities(s.model_draft_probs)
            .cumulative(r.num_drafts, s.verify_estimates);
      }
      DEEPINFER_CHECK(s.verify_estimates.size() >= static_cast<size_t>(r.num_drafts),
                      "a verify row has fewer acceptance estimates than drafts");
      for (size_t j = 0; j < static_cast<size_t>(r.num_drafts); ++j) {
        const bool accepted = j + 1 < my_count;
        stats_.drafts_at_position.at(j) += 1;
        stats_.accepted_at_position.at(j) += accepted ? 1 : 0;
        record_calibration(stats_.calibration, s.verify_estimates[j], accepted);
      }
    }
    std::string constraint_error;
    for (const auto& [row, message] : result.constraint_errors)
      if (row == static_cast<int>(my_sample)) constraint_error = message;
    // The row's tokens in order: stop at the first that ends the request. Position p of the
    // row's input is computed, and so is each accepted draft that gets committed.
    const int computed_before = s.num_computed;
    const int input_positions = r.verifies() ? 0 : r.forward.num_tokens - 1;
    s.num_computed += input_positions;
    // How the request ends, if it ends in this row: applied after on_committed below, because
    // finishing releases the blocks (nothing else in flight), and the committed prompt's blocks
    // must reach the prefix index and the tiers first (a prefill-only request, max_tokens 1,
    // finishes in the row that completes its prompt).
    std::optional<std::pair<FinishReason, std::string>> ending;
    for (size_t k = 0; k < my_count; ++k) {
      const int32_t token = result.tokens[my_first + k];
      s.tokens.push_back(token);  // kept even when dropped below: the next step computes its KV
      s.num_computed += 1;        // the position of the token before it
      bool constraint_done = false;
      if (constraint_error.empty() && s.params.constraint != nullptr) {
        constraint_error = advance_constraint(*s.params.constraint, token);
        if (constraint_error.empty())
          constraint_done = constraint_is_done(*s.params.constraint, constraint_error);
      }
      if (!constraint_error.empty()) {
        // Drawn without a mask (the constraint failed before sampling) or refused by it: not the
        // request's output either way.
        ending.emplace(FinishReason::kGrammarError, constraint_error);
        break;
      }
      ++stats_.generated_tokens;
      RequestOutput o = make_output(s);
      o.tokens.push_back(token);
      if (s.params.logprobs > 0 && my_first + k < result.logprobs.size()) {
        o.logprobs.push_back(result.logprobs[my_first + k]);
      }
      out.push_back(std::move(o));
      if (is_stop_token(s, token) || constraint_done) {
        ending.emplace(FinishReason::kStop, "");
        break;
      }
      if (s.num_output_tokens() >= s.params.max_tokens || s.num_tokens() >= config_.max_model_len) {
        ending.emplace(FinishReason::kLength, "");
        break;
      }
    }
    DEEPINFER_CHECK(s.num_computed > computed_before, "a sampling row computed nothing");
    if (!ending && my_sample < result.drafts.size()) {
      s.model_drafts = result.drafts[my_sample];
      if (my_sample < result.draft_probs.size())
        s.model_draft_probs = result.draft_probs[my_sample];
      else
        s.model_draft_probs.clear();
      s.model_drafts_at = s.num_tokens();
    }
    kv_.on_committed(s, r.snapshot, r.snapshot_pos);
    if (ending) finish(s, ending->first, std::move(ending->second), out);
  }
  DEEPINFER_CHECK(
      sample_index == (result.counts.empty() ? result.tokens.size() : result.counts.size()) &&
          token_index == result.tokens.size(),
      "step result has more tokens than sampling rows");
  stats_.verify_steps += verified ? 1 : 0;
#ifdef DEEPINFER_DEBUG_INVARIANTS
  check_invariants();
#endif
}

}  // namespace deepinfer::sched
