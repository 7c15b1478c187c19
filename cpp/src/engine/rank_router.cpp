#include "engine/rank_router.h"

#include <algorithm>
#include <tuple>

namespace deepinfer::engine {

int rank_of_request(RequestId id, int n) {
  if (id < 1 || n < 1) return -1;
  return static_cast<int>((id - 1) % static_cast<RequestId>(n));
}

int RankRouter::least_loaded() const {
  std::lock_guard lock(mu_);
  size_t best = 0;
  for (size_t r = 1; r < loads_.size(); ++r) {
    if (std::tie(loads_[r].requests, loads_[r].tokens) <
        std::tie(loads_[best].requests, loads_[best].tokens))
      best = r;
  }
  return static_cast<int>(best);
}

void RankRouter::assigned(int rank, RequestId id, int64_t prompt_tokens) {
  std::lock_guard lock(mu_);
  if (finished_early_.erase(id) > 0) return;
  Load& load = loads_[static_cast<size_t>(rank)];
  load.requests += 1;
  load.tokens += prompt_tokens;
  tokens_of_[id] = prompt_tokens;
}

void RankRouter::account(const std::vector<RequestOutput>& outputs, int (*rank_of)(RequestId, int),
                         int n) {
  std::lock_guard lock(mu_);
  for (const RequestOutput& o : outputs) {
    auto it = tokens_of_.find(o.id);
    if (it == tokens_of_.end()) {
      if (o.finish != FinishReason::kNone) finished_early_.insert(o.id);
      continue;
    }
    Load& load = loads_[static_cast<size_t>(rank_of(o.id, n))];
    if (o.finish != FinishReason::kNone) {
      load.requests -= 1;
      load.tokens -= it->second;
      tokens_of_.erase(it);
    } else {
      const auto generated = static_cast<int64_t>(o.tokens.size());
      load.tokens += generated;
      it->second += generated;
    }
  }
}

int RankRouter::unfinished() const {
  std::lock_guard lock(mu_);
  int total = 0;
  for (const Load& l : loads_) total += l.requests;
  return total;
}

void accumulate_stats(EngineStats& s, const EngineStats& r) {
  auto add = [](auto& into, const auto& from) {
    for (size_t i = 0; i < into.size(); ++i) into[i] += from[i];
  };
  s.num_steps += r.num_steps;
  s.num_prefill_steps += r.num_prefill_steps;
  s.num_preemptions += r.num_preemptions;
  s.prompt_tokens_computed += r.prompt_tokens_computed;
  s.prompt_tokens_cached += r.prompt_tokens_cached;
  s.generated_tokens += r.generated_tokens;
  s.draft_tokens += r.draft_tokens;
  s.accepted_draft_tokens += r.accepted_draft_tokens;
  s.verify_rows += r.verify_rows;
  s.device_carried_rows += r.device_carried_rows;
  s.device_carried_verify_rows += r.device_carried_verify_rows;
  s.budget_step_times += r.budget_step_times;
  add(s.drafts_at_position, r.drafts_at_position);
  add(s.accepted_at_position, r.accepted_at_position);
  s.drafter_errors += r.drafter_errors;
  s.verify_steps += r.verify_steps;
  add(s.calibration.drafts, r.calibration.drafts);
  add(s.calibration.accepted, r.calibration.accepted);
  add(s.calibration.estimate_sum, r.calibration.estimate_sum);
  s.kv_fetch_waits += r.kv_fetch_waits;
  s.num_running += r.num_running;
  s.num_waiting += r.num_waiting;
  s.num_fetching += r.num_fetching;
  s.num_blocks_total += r.num_blocks_total;
  s.num_blocks_free += r.num_blocks_free;
  s.num_blocks_cached += r.num_blocks_cached;
  s.num_state_slots_free += r.num_state_slots_free;
  s.num_graph_steps += r.num_graph_steps;
  s.num_graph_verify_steps += r.num_graph_verify_steps;
  s.host_hit_tokens += r.host_hit_tokens;
  s.store_hit_tokens += r.store_hit_tokens;
  s.store_bytes_read += r.store_bytes_read;
  s.store_bytes_written += r.store_bytes_written;
  s.kv_blocks_written_through += r.kv_blocks_written_through;
  s.kv_host_pinned_bytes += r.kv_host_pinned_bytes;
  s.kv_tier_fetch_failures += r.kv_tier_fetch_failures;
  s.kv_fetches += r.kv_fetches;
  s.kv_fetch_seconds_total += r.kv_fetch_seconds_total;
  s.kv_fetch_seconds_max = std::max(s.kv_fetch_seconds_max, r.kv_fetch_seconds_max);
  // Every rank takes part in every group step.
  s.dp_group_steps = std::max(s.dp_group_steps, r.dp_group_steps);
  s.dp_idle_passes += r.dp_idle_passes;
  // EPLB runs on every rank in lock-step (the same plan from the same all-reduced window): the
  // counts and loads are alike; the group's pause is its slowest rank's.
  s.eplb_rebalances = std::max(s.eplb_rebalances, r.eplb_rebalances);
  s.eplb_last_pause_seconds = std::max(s.eplb_last_pause_seconds, r.eplb_last_pause_seconds);
  s.eplb_max_over_mean_before = std::max(s.eplb_max_over_mean_before, r.eplb_max_over_mean_before);
  s.eplb_max_over_mean_after = std::max(s.eplb_max_over_mean_after, r.eplb_max_over_mean_after);
  // Speculative decoding does not run in a group (refused): its derived means stay 0.
}

}  // namespace deepinfer::engine
