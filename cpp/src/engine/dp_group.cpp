#include "engine/dp_group.h"

#include <algorithm>
#include <atomic>
#include <tuple>
#include <utility>

#include "deepinfer/backend.h"
#include "deepinfer/error.h"
#include "dist/expert_placement.h"
#include "dist/inprocess_communicator.h"

namespace deepinfer::engine {

std::string rank_device(const std::string& device, int rank) {
  if (device == "cuda") return "cuda:" + std::to_string(rank);
  return device;
}

std::unique_ptr<Engine> create_dp_group(const EngineConfig& resolved, const ModelConfig& model,
                                        const ModelExecutorOptions& base,
                                        const LoadProgress& progress) {
  const ParallelConfig& par = resolved.parallel;
  const int n = par.data_parallel_size;
  const std::string& device = resolved.placement.device;
  if (device != "cpu") {
    throw Error(ErrorCode::kUnsupported,
                "engine config: 'data_parallel_size' " + std::to_string(n) + " on '" + device +
                    "' needs the NCCL communicator, which this build does not have; run the "
                    "ranks on device 'cpu'");
  }
  std::vector<dist::ExpertPlacement> placements;
  if (par.expert_parallel_size > 1) {
    if (model.n_routed_experts % n != 0) {
      throw Error(ErrorCode::kInvalidArgument, "engine config: 'expert_parallel_size' " +
                                                   std::to_string(n) +
                                                   " must divide the model's n_routed_experts (" +
                                                   std::to_string(model.n_routed_experts) + ")");
    }
    placements.assign(
        static_cast<size_t>(model.num_hidden_layers),
        dist::ExpertPlacement::initial(model.n_routed_experts, n, par.redundant_experts_per_rank));
  }
  // The backends first: the communicators are made over them.
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> raw;
  int threads = resolved.placement.num_threads;
  if (threads == 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n);
  }
  for (int r = 0; r < n; ++r) {
    backends.push_back(make_backend(rank_device(device, r), threads));
    raw.push_back(backends.back().get());
  }
  std::vector<std::unique_ptr<dist::Communicator>> comms = dist::make_inprocess_group(raw);
  sched::DpVoteConfig vote;
  vote.all_interval = par.dp_prefill_all_interval;
  vote.any_interval = par.dp_prefill_any_interval;
  vote.prefill_when_group_idle = par.dp_prefill_when_idle;
  std::vector<std::unique_ptr<EngineImpl>> ranks;
  for (int r = 0; r < n; ++r) {
    ModelExecutorOptions o = base;
    o.placement.device = rank_device(device, r);
    o.placement.num_threads = threads;
    // One bar over every rank's load.
    o.progress = {};
    if (progress) {
      o.progress = [&progress, r, n](int done, int total) {
        progress(r * total + done, n * total);
      };
    }
    ParallelRank rank;
    rank.backend = std::move(backends[static_cast<size_t>(r)]);
    rank.comm = comms[static_cast<size_t>(r)].get();
    rank.placements = placements;
    if (par.enable_eplb && !placements.empty()) {
      dist::EplbOptions eplb;
      eplb.window_steps = par.eplb_window_steps;
      eplb.bucket_steps = eplb_bucket_steps(par.eplb_window_steps);
      eplb.rebalance_interval = par.eplb_rebalance_interval;
      eplb.redundant_slots_per_rank = par.redundant_experts_per_rank;
      rank.eplb = eplb;
    }
    auto executor = std::make_unique<ModelExecutor>(o, std::move(rank));
    ranks.push_back(std::make_unique<EngineImpl>(
        resolved, std::move(executor), DpRank{comms[static_cast<size_t>(r)].get(), vote}));
  }
  return std::make_unique<DpEngineGroup>(std::move(ranks), std::move(comms));
}

RankThreads::RankThreads(int num_ranks) : errors_(static_cast<size_t>(num_ranks)) {
  for (int r = 0; r < num_ranks; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::vector<std::exception_ptr> RankThreads::run(const std::function<void(int)>& fn) {
  std::unique_lock lock(mutex_);
  job_ = &fn;
  remaining_ = static_cast<int>(threads_.size());
  std::fill(errors_.begin(), errors_.end(), nullptr);
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lock, [&] { return remaining_ == 0; });
  job_ = nullptr;
  return errors_;
}

void RankThreads::worker(int rank) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const std::function<void(int)>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)(rank);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[static_cast<size_t>(rank)] = error;
    if (--remaining_ == 0) done_cv_.notify_all();
  }
}

DpEngineGroup::DpEngineGroup(std::vector<std::unique_ptr<EngineImpl>> ranks,
                             std::vector<std::unique_ptr<dist::Communicator>> comms)
    : ranks_(std::move(ranks)),
      comms_(std::move(comms)),
      loads_(ranks_.size()),
      threads_(static_cast<int>(ranks_.size())) {
  DEEPINFER_CHECK(!ranks_.empty() && ranks_.size() == comms_.size(),
                  "a DP group needs one communicator per rank");
}

DpEngineGroup::~DpEngineGroup() = default;

int DpEngineGroup::rank_of(RequestId id) const {
  if (id < 1) return -1;
  return static_cast<int>((id - 1) % static_cast<RequestId>(ranks_.size()));
}

RequestId DpEngineGroup::add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
  std::lock_guard lock(route_mu_);
  size_t best = 0;
  for (size_t r = 1; r < loads_.size(); ++r) {
    if (std::tie(loads_[r].requests, loads_[r].tokens) <
        std::tie(loads_[best].requests, loads_[best].tokens))
      best = r;
  }
  const auto tokens = static_cast<int64_t>(prompt.size());
  const RequestId id = ranks_[best]->add_request(std::move(prompt), params);  // checks it
  loads_[best].requests += 1;
  loads_[best].tokens += tokens;
  tokens_of_[id] = tokens;
  return id;
}

void DpEngineGroup::abort(RequestId id) {
  const int r = rank_of(id);
  if (r >= 0) ranks_[static_cast<size_t>(r)]->abort(id);
}

void DpEngineGroup::set_drafter(std::shared_ptr<Drafter> drafter) {
  (void)drafter;
  throw Error(ErrorCode::kUnsupported,
              "set_drafter: speculative decoding does not run with data_parallel_size > 1 yet");
}

void DpEngineGroup::account(const std::vector<RequestOutput>& outputs) {
  std::lock_guard lock(route_mu_);
  for (const RequestOutput& o : outputs) {
    auto it = tokens_of_.find(o.id);
    if (it == tokens_of_.end()) continue;
    Load& load = loads_[static_cast<size_t>(rank_of(o.id))];
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

std::vector<RequestOutput> DpEngineGroup::step() {
  if (!failure_.empty()) {
    throw Error(ErrorCode::kInternal, "the data-parallel group failed earlier: " + failure_);
  }
  const size_t n = ranks_.size();
  std::vector<std::vector<RequestOutput>> outputs(n);
  // The first rank to fail names the cause; the others then fail in their next collective.
  std::atomic<int> first_failed{-1};
  const std::vector<std::exception_ptr> errors = threads_.run([&](int r) {
    try {
      outputs[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)]->step();
    } catch (const std::exception& e) {
      int none = -1;
      first_failed.compare_exchange_strong(none, r);
      comms_[static_cast<size_t>(r)]->abort("rank " + std::to_string(r) + " failed: " + e.what());
      throw;
    }
  });
  const int failed = first_failed.load();
  if (failed >= 0) {
    try {
      std::rethrow_exception(errors[static_cast<size_t>(failed)]);
    } catch (const std::exception& e) {
      failure_ = "rank " + std::to_string(failed) + ": " + e.what();
    }
    std::rethrow_exception(errors[static_cast<size_t>(failed)]);
  }
  std::vector<RequestOutput> merged;
  for (auto& o : outputs) {
    merged.insert(merged.end(), std::make_move_iterator(o.begin()),
                  std::make_move_iterator(o.end()));
  }
  account(merged);
  return merged;
}

int DpEngineGroup::num_unfinished() const {
  int total = 0;
  for (const auto& r : ranks_) total += r->num_unfinished();
  return total;
}

EngineStats DpEngineGroup::stats() const {
  EngineStats s;
  auto add = [](auto& into, const auto& from) {
    for (size_t i = 0; i < into.size(); ++i) into[i] += from[i];
  };
  for (const auto& rank : ranks_) {
    const EngineStats r = rank->stats();
    s.num_steps += r.num_steps;
    s.num_prefill_steps += r.num_prefill_steps;
    s.num_preemptions += r.num_preemptions;
    s.prompt_tokens_computed += r.prompt_tokens_computed;
    s.prompt_tokens_cached += r.prompt_tokens_cached;
    s.generated_tokens += r.generated_tokens;
    s.draft_tokens += r.draft_tokens;
    s.accepted_draft_tokens += r.accepted_draft_tokens;
    s.verify_rows += r.verify_rows;
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
    s.host_hit_tokens += r.host_hit_tokens;
    s.store_hit_tokens += r.store_hit_tokens;
    s.store_bytes_read += r.store_bytes_read;
    s.store_bytes_written += r.store_bytes_written;
    s.kv_blocks_written_through += r.kv_blocks_written_through;
    s.kv_tier_fetch_failures += r.kv_tier_fetch_failures;
    s.kv_fetches += r.kv_fetches;
    s.kv_fetch_seconds_total += r.kv_fetch_seconds_total;
    s.kv_fetch_seconds_max = std::max(s.kv_fetch_seconds_max, r.kv_fetch_seconds_max);
    s.dp_group_steps = std::max(s.dp_group_steps, r.dp_group_steps);
    s.dp_idle_passes += r.dp_idle_passes;
  }
  // EPLB runs on every rank in lockstep (the same plan from the same all-reduced window), so
  // rank 0's numbers are the group's.
  const EngineStats first = ranks_.front()->stats();
  s.eplb_rebalances = first.eplb_rebalances;
  s.eplb_last_pause_seconds = first.eplb_last_pause_seconds;
  s.eplb_max_over_mean_before = first.eplb_max_over_mean_before;
  s.eplb_max_over_mean_after = first.eplb_max_over_mean_after;
  // Speculative decoding does not run in a group (create refuses it): its derived means stay 0.
  return s;
}

std::vector<std::string> DpEngineGroup::load_notes() const {
  std::vector<std::string> notes = ranks_.front()->load_notes();
  const ParallelConfig& p = config().parallel;
  notes.push_back(std::to_string(ranks_.size()) + " data-parallel ranks" +
                  (p.expert_parallel_size > 1
                       ? " with the routed experts split across them (expert parallelism)"
                       : " (replicas)"));
  return notes;
}

KvCapacity DpEngineGroup::kv_capacity() const {
  KvCapacity k = ranks_.front()->kv_capacity();
  for (size_t r = 1; r < ranks_.size(); ++r) {
    const KvCapacity o = ranks_[r]->kv_capacity();
    k.num_blocks += o.num_blocks;
    k.max_tokens += o.max_tokens;
    k.max_seqs_at_max_model_len += o.max_seqs_at_max_model_len;
  }
  return k;
}

void DpEngineGroup::check_invariants() const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    try {
      ranks_[r]->check_invariants();
    } catch (const Error& e) {
      throw Error(e.code(), "rank " + std::to_string(r) + ": " + e.what());
    }
  }
}

int DpEngineGroup::num_inflight_steps() const {
  int most = 0;
  for (const auto& r : ranks_) most = std::max(most, r->num_inflight_steps());
  return most;
}

void DpEngineGroup::flush_kv_tiers() {
  for (auto& r : ranks_) r->flush_kv_tiers();
}

void DpEngineGroup::hold_kv_fetches(bool hold) {
  for (auto& r : ranks_) r->hold_kv_fetches(hold);
}

}  // namespace deepinfer::engine
