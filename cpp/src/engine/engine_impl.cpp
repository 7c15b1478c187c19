#include "engine/engine_impl.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "deepinfer/error.h"
#include "engine/engine_config.h"
#include "kv/cache_geometry.h"
#include "sample/sampler.h"
#include "sched/draft_budget.h"
#include "spec/ngram_drafter.h"

namespace deepinfer::engine {

namespace {

sched::KvLayout kv_layout(const EngineConfig& c, const StepExecutor& ex) {
  sched::KvLayout l;
  l.num_blocks = ex.num_kv_blocks();
  l.num_live_slots = ex.num_state_slots();
  l.num_snapshot_slots = c.cache.enable_prefix_cache ? ex.num_snapshot_slots() : 0;
  l.prefix_cache = c.cache.enable_prefix_cache;
  // YOCO prefill truncation (V4.1): a hit ends before the kept positions (PrefixCachePolicy).
  if (c.placement.yoco_prefill_truncation != "off") l.hit_tail = c.placement.yoco_keep_tokens;
  return l;
}

// The config resolved against the executor: a cache sized from device memory takes the
// executor's block count, and an automatic max_model_len shrinks to what that cache holds (an
// explicit one that does not fit is an error naming both numbers).
EngineConfig resolve_with(const EngineConfig& config, const StepExecutor& ex) {
  EngineConfig c = resolve_engine_config(config, ex.max_position());
  if (!ex.kv_sized_from_memory()) return c;
  c.cache.num_kv_blocks = ex.num_kv_blocks();
  const int64_t capacity = static_cast<int64_t>(ex.num_kv_blocks() - 1) * kv::kBlockSize;
  if (c.scheduler.max_model_len > capacity) {
    if (config.scheduler.max_model_len != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "engine config: 'max_model_len' is " + std::to_string(c.scheduler.max_model_len) +
                      " but the KV cache holds " + std::to_string(capacity) + " tokens (" +
                      std::to_string(ex.num_kv_blocks() - 1) + " blocks of " +
                      std::to_string(kv::kBlockSize) +
                      " in the device memory gpu_memory_utilization allows): lower "
                      "max_model_len or raise gpu_memory_utilization");
    }
    c.scheduler.max_model_len = static_cast<int>(capacity);
  }
  return c;
}

// The host and store tiers the config asks for, over the executor's caches; null when off.
std::unique_ptr<sched::KvTiers> make_tiers(const EngineConfig& c, StepExecutor& ex) {
  const CacheConfig& cache = c.cache;
  if (cache.kv_host_cache_bytes == 0 && cache.kv_store_path.empty()) return nullptr;
  sched::KvTransfer* transfer = ex.kv_transfer();
  if (transfer == nullptr) {
    throw Error(ErrorCode::kUnsupported,
                "engine config: 'kv_host_cache_bytes' / 'kv_store_path' need an executor with KV "
                "caches; this one has none");
  }
  const bool replay = cache.kv_window_state == "bounded_replay";
  sched::KvTiersConfig t;
  t.window_state_exact = !replay;
  t.host_bytes = cache.kv_host_cache_bytes;
  t.store_path = cache.kv_store_path;
  t.store_capacity_bytes = cache.kv_store_capacity_bytes;
  t.fetch_threads = cache.fetch_threads;
  t.traffic_class =
      cache.kv_store_ttl_class == "agent" ? kv::TrafficClass::kAgent : kv::TrafficClass::kChat;
  t.kv_dtype = cache.kv_cache_dtype;
  t.block_size = kv::kBlockSize;
  if (!t.store_path.empty()) {
    t.model_identity = ex.model_identity();
    // The snapshot is the raw rings of a state slot (SWA, compressor, indexer per layer); their
    // lengths follow from the model config and the backtrack, which state_bytes pins down.
    t.state_layout = "state=rings/v1;state_bytes=" + std::to_string(transfer->state_bytes());
    // Only an engine that runs the MTP block keeps its rings in the snapshots it writes.
    if (uses_mtp_drafts(c)) t.state_layout += ";mtp_rings";
    // Blocks without snapshots, whose entries may come from a replayed (approximate) window: a
    // store of its own, never mixed with the exact mode's.
    if (replay) t.state_layout = "state=none;window_state=bounded_replay";
  }
  return std::make_unique<sched::KvTiers>(t, *transfer);
}

}  // namespace

EngineImpl::EngineImpl(const EngineConfig& config, std::unique_ptr<StepExecutor> executor,
                       DpRank dp)
    : config_(resolve_with(config, *executor)),
      executor_(std::move(executor)),
      tiers_(make_tiers(config_, *executor_)),
      kv_(kv_layout(config_, *executor_)),
      scheduler_(config_.scheduler, executor_->eos_token_ids(), kv_),
      comm_(dp.comm),
      vote_(dp.vote) {
  if (comm_ != nullptr) {
    next_id_ = static_cast<RequestId>(comm_->rank()) + 1;
    id_stride_ = static_cast<RequestId>(comm_->size());
  }
  kv_.set_tiers(tiers_.get());
  const SchedulerConfig& s = config_.scheduler;
  if (s.num_speculative_tokens > 0 && s.speculative_method == "ngram") {
    set_drafter(std::make_shared<spec::NgramDrafter>(s.prompt_lookup_min, s.prompt_lookup_max));
  }
  if (uses_mtp_drafts(config_)) {
    check_mtp_blocks(config_, executor_->num_mtp_blocks());
    scheduler_.use_executor_drafts(s.num_speculative_tokens);
  }
}

void EngineImpl::set_drafter(std::shared_ptr<Drafter> drafter) {
  scheduler_.set_drafter(std::move(drafter), config_.scheduler.num_speculative_tokens,
                         executor_->vocab_size());
}

void EngineImpl::flush_kv_tiers() {
  if (tiers_) tiers_->flush();
}

void EngineImpl::hold_kv_fetches(bool hold) {
  if (tiers_) tiers_->hold_fetches(hold);
}

KvCapacity EngineImpl::kv_capacity() const {
  KvCapacity k;
  k.num_blocks = executor_->num_kv_blocks() - 1;
  k.block_size = kv::kBlockSize;
  k.bytes_per_block = executor_->kv_bytes_per_block();
  k.bytes_per_token = (k.bytes_per_block + k.block_size - 1) / k.block_size;
  k.bytes_per_state_slot = executor_->state_slot_bytes();
  k.max_tokens = static_cast<int64_t>(k.num_blocks) * k.block_size;
  const int64_t per_seq = kv::blocks_for_tokens(config_.scheduler.max_model_len);
  k.max_seqs_at_max_model_len = static_cast<int>(k.num_blocks / std::max<int64_t>(per_seq, 1));
  k.sized_from_memory = executor_->kv_sized_from_memory();
  return k;
}

EngineImpl::~EngineImpl() {
  // Wait for launched work so the executor never runs a step whose owner is gone.
  for (Launched& l : inflight_) {
    try {
      if (l.step->sample_deferred) executor_->finish_launch(*l.step, l.plan);
      executor_->wait(*l.step);
    } catch (...) {  // the engine is going away; there is no caller left to report to
    }
  }
}

void check_request(const std::vector<int32_t>& prompt, const SamplingParams& params, int vocab) {
  auto bad = [](const std::string& field, const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "request: '" + field + "' " + what);
  };
  if (prompt.empty()) bad("prompt", "is empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      bad("prompt", "token " + std::to_string(i) + " = " + std::to_string(prompt[i]) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature)) {
    bad("temperature", "must be a finite number >= 0, got " + std::to_string(params.temperature));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    bad("top_p", "must be in (0, 1], got " + std::to_string(params.top_p));
  }
  if (params.max_tokens < 1)
    bad("max_tokens", "must be >= 1, got " + std::to_string(params.max_tokens));
  if (params.logprobs < 0 || params.logprobs > 20) {
    bad("logprobs", "must be in [0, 20], got " + std::to_string(params.logprobs));
  }
  for (int32_t t : params.stop_token_ids) {
    if (t < 0 || t >= vocab)
      bad("stop_token_ids", "holds " + std::to_string(t) + ", outside the vocabulary");
  }
  for (int32_t t : params.forced_tokens) {
    if (t < 0 || t >= vocab)
      bad("forced_tokens", "holds " + std::to_string(t) + ", outside the vocabulary");
  }
  if (!params.kv_retention.empty() && params.kv_retention != "agent" &&
      params.kv_retention != "chat") {
    bad("kv_retention",
        "must be \"agent\", \"chat\" or empty, got \"" + params.kv_retention + "\"");
  }
  std::vector<int32_t> biased;
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= vocab)
      bad("logit_bias", "names token " + std::to_string(token) + ", outside the vocabulary");
    if (!std::isfinite(bias))
      bad("logit_bias", "gives token " + std::to_string(token) + " a bias that is not finite");
    biased.push_back(token);
  }
  std::sort(biased.begin(), biased.end());
  if (std::adjacent_find(biased.begin(), biased.end()) != biased.end())
    bad("logit_bias", "names a token twice");
  for (const auto& [field, value] : {std::pair{"presence_penalty", params.presence_penalty},
                                     std::pair{"frequency_penalty", params.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f))
      bad(field, "must be in [-2, 2], got " + std::to_string(value));
  }
}

RequestId EngineImpl::add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
  check_request(prompt, params, executor_->vocab_size());
  auto seq = std::make_unique<sched::Sequence>();
  seq->id = next_id_.fetch_add(id_stride_);
  seq->params = params;
  seq->seed =
      params.seed ? *params.seed : sample::splitmix64(config_.seed ^ sample::splitmix64(seq->id));
  seq->num_prompt_tokens = static_cast<int>(prompt.size());
  seq->tokens = std::move(prompt);
  seq->tokens.reserve(seq->tokens.size() + static_cast<size_t>(params.max_tokens));
  const RequestId id = seq->id;
  std::lock_guard<std::mutex> lock(inbox_mu_);
  inbox_adds_.push_back(std::move(seq));
  unfinished_.fetch_add(1);
  return id;
}

void EngineImpl::abort(RequestId id) {
  std::lock_guard<std::mutex> lock(inbox_mu_);
  inbox_aborts_.push_back(id);
}

void EngineImpl::drain_inbox(std::vector<RequestOutput>& out) {
  std::vector<std::unique_ptr<sched::Sequence>> adds;
  std::vector<RequestId> aborts;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    adds.swap(inbox_adds_);
    aborts.swap(inbox_aborts_);
  }
  for (auto& s : adds) {
    s->arrival = next_arrival_++;
    scheduler_.add(std::move(s));
  }
  for (RequestId id : aborts) scheduler_.abort(id, out);
}

void EngineImpl::commit_oldest(std::vector<RequestOutput>& out) {
  // The oldest step has nothing before it left to commit, so a deferred sample can go now.
  if (inflight_.front().step->sample_deferred)
    executor_->finish_launch(*inflight_.front().step, inflight_.front().plan);
  Launched l = std::move(inflight_.front());
  inflight_.pop_front();
  StepResult result = executor_->wait(*l.step);
  // Zero-overhead scheduling: a decode step queued behind a decode step starts when that one
  // ends, so the time between their commits is its cost (the device's, or the host's when the
  // host is the slower): the confidence budget's cost model.
  const auto now = std::chrono::steady_clock::now();
  if (l.pipelined_decode && last_commit_decode_ && last_commit_.has_value()) {
    scheduler_.observe_decode_step(l.plan.num_tokens(),
                                   std::chrono::duration<double>(now - *last_commit_).count());
  }
  last_commit_ = now;
  last_commit_decode_ = !l.plan.is_prefill;
  scheduler_.commit(l.plan, result, out);
  spare_plans_.push_back(std::move(l.plan));
}

void EngineImpl::count_finishes(const std::vector<RequestOutput>& out, size_t from) {
  int finished = 0;
  for (size_t i = from; i < out.size(); ++i)
    finished += out[i].finish != FinishReason::kNone ? 1 : 0;
  unfinished_.fetch_sub(finished);
}

std::vector<RequestOutput> EngineImpl::step() {
  std::vector<RequestOutput> out;
  // Write-through copies that have completed go to the host tier and the store writer now, so
  // this step's admissions can already hit them.
  if (tiers_) tiers_->poll();
  drain_inbox(out);
  // After the aborts: an aborted request's fetch is cancelled, not finished.
  if (tiers_) scheduler_.poll_fetches(out);
  // EPLB: the group rebalances here, before the vote, on every rank at once (rebalance_due is
  // the same everywhere). Commit what is in flight first: the expert weights must not change
  // under a launched forward, and the rebalance synchronizes the stream.
  if (comm_ != nullptr && executor_->rebalance_due()) {
    while (!inflight_.empty()) commit_oldest(out);
    executor_->rebalance();
  }
  StepPlan plan;
  if (!spare_plans_.empty()) {
    plan = std::move(spare_plans_.back());
    spare_plans_.pop_back();
  }
  sched::Scheduler::Outcome outcome = sched::Scheduler::Outcome::kIdle;
  bool idle_pass = false;  // a DP rank without rows in a step its group runs
  std::optional<sched::StepKind> voted;
  if (comm_ != nullptr) {
    voted = vote_step(plan, out, outcome, idle_pass);
  } else {
    outcome = scheduler_.schedule(plan, out);
  }
  if (outcome == sched::Scheduler::Outcome::kNeedsDrain) {
    while (!inflight_.empty()) commit_oldest(out);
    outcome = scheduler_.schedule(plan, out, voted);
    DEEPINFER_CHECK(outcome != sched::Scheduler::Outcome::kNeedsDrain,
                    "drain did not clear the pipeline");
    // A DP rank whose decode rows all went away (preempted) still joins its group's step.
    idle_pass = comm_ != nullptr && outcome != sched::Scheduler::Outcome::kScheduled;
  }
  // Without zero-overhead scheduling a decode step is launched and committed within this call,
  // so its wall time is the step's: the confidence budget's cost model. (With it, the time
  // between two pipelined decode steps' commits is: commit_oldest.)
  const auto started = std::chrono::steady_clock::now();
  const bool timed_decode = outcome == sched::Scheduler::Outcome::kScheduled &&
                            !config_.scheduler.zero_overhead && !plan.is_prefill;
  const int step_tokens = plan.num_tokens();
  if (outcome == sched::Scheduler::Outcome::kScheduled) {
    InflightStep* previous = inflight_.empty() ? nullptr : inflight_.back().step.get();
    const bool pipelined_decode =
        previous != nullptr && !plan.is_prefill && !inflight_.back().plan.is_prefill;
    std::unique_ptr<InflightStep> launched = executor_->launch(plan, previous);
    inflight_.push_back(Launched{std::move(launched), std::move(plan), pipelined_decode});
    DEEPINFER_CHECK(inflight_.size() <= 2, "more than two steps launched and not committed");
    // A DP rank launches only in steps its group runs; the forward's MoE exchanges are done.
    if (comm_ != nullptr) executor_->record_group_step();
  } else {
    spare_plans_.push_back(std::move(plan));
    if (idle_pass) {
      ++dp_idle_passes_;
      executor_->run_idle_pass();
      executor_->record_group_step();
    } else if (inflight_.empty() && scheduler_.num_fetching() > 0 && comm_ == nullptr) {
      // Only fetches are left to wait for: block for one briefly rather than have the caller
      // spin. (A DP rank does not: its group steps together.)
      tiers_->wait_for_fetch(std::chrono::milliseconds(2));
    }
  }
  // Zero-overhead: leave the step just launched running; commit the one before it.
  const size_t keep =
      config_.scheduler.zero_overhead && outcome == sched::Scheduler::Outcome::kScheduled ? 1 : 0;
  while (inflight_.size() > keep) commit_oldest(out);
  // The step before the one just launched is committed: its tokens are known, so the launched
  // step's sampling can see them (penalties, constraints) while its forward runs.
  if (!inflight_.empty() && inflight_.back().step->sample_deferred)
    executor_->finish_launch(*inflight_.back().step, inflight_.back().plan);
  count_finishes(out, 0);
  if (timed_decode && inflight_.empty()) {
    scheduler_.observe_decode_step(
        step_tokens,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  // Nothing left to run: commit the step still in flight too (it only carries finished
  // sequences), so their blocks and slots are back before the caller stops stepping.
  if (unfinished_.load() == 0) {
    while (!inflight_.empty()) commit_oldest(out);
  }
  return out;
}

sched::Tally EngineImpl::group_tally(const sched::Ballot& b) {
  // One host all-reduce: how many ranks set each bit (AND = all of them, OR = any).
  const std::vector<uint64_t> mine = {b.want, b.decode, b.unfinished, b.produced};
  const std::vector<uint64_t> sum = comm_->all_reduce_host(mine, dist::HostReduceOp::kSum);
  sched::Tally t;
  t.any_want = sum[0] > 0;
  t.all_want = sum[0] == static_cast<uint64_t>(comm_->size());
  t.any_decode = sum[1] > 0;
  t.any_unfinished = sum[2] > 0;
  t.any_produced = sum[3] > 0;
  return t;
}

std::optional<sched::StepKind> EngineImpl::vote_step(StepPlan& plan,
                                                     std::vector<RequestOutput>& out,
                                                     sched::Scheduler::Outcome& outcome,
                                                     bool& idle_pass) {
  using sched::RankAction;
  using sched::StepKind;
  outcome = sched::Scheduler::Outcome::kIdle;
  idle_pass = false;
  auto count = [&](std::optional<StepKind> kind) {
    if (vote_.group_step() != sched::GroupStep::kIdle) ++dp_group_steps_;
    return kind;
  };
  if (vote_.after_first(group_tally(vote_.first_ballot(scheduler_.dp_wish()))) ==
      sched::DpVote::Proposal::kConfirm) {
    bool produced = false;
    if (vote_.runs_prefill_selection()) {
      outcome = scheduler_.schedule(plan, out, StepKind::kPrefill);
      produced = outcome == sched::Scheduler::Outcome::kScheduled;
    }
    vote_.after_second(group_tally(vote_.second_ballot(produced)));
  }
  switch (vote_.action()) {
    case RankAction::kIdle:
      DEEPINFER_CHECK(outcome != sched::Scheduler::Outcome::kScheduled,
                      "a DP rank planned a prefill its group did not run");
      return std::nullopt;
    case RankAction::kPrefill:
      return count(StepKind::kPrefill);
    case RankAction::kEmptyPrefill:
    case RankAction::kDummyDecode:
      idle_pass = true;
      return count(std::nullopt);
    case RankAction::kDecode:
      outcome = scheduler_.schedule(plan, out, StepKind::kDecode);
      idle_pass = outcome == sched::Scheduler::Outcome::kIdle;
      return count(StepKind::kDecode);
  }
  return std::nullopt;
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  static_cast<SchedulerCounters&>(s) = scheduler_.stats();
  s.num_running = scheduler_.num_running();
  s.num_waiting = scheduler_.num_waiting();
  s.num_fetching = scheduler_.num_fetching();
  s.num_blocks_total = kv_.blocks().num_usable();
  s.num_blocks_free = kv_.blocks().num_free();
  s.num_blocks_cached = kv_.num_cached_free_blocks();
  s.num_state_slots_free = kv_.live_slots().num_free();
  s.num_graph_steps = executor_->num_graph_steps();
  s.num_graph_verify_steps = executor_->num_graph_verify_steps();
  s.dp_group_steps = dp_group_steps_;
  s.dp_idle_passes = dp_idle_passes_;
  executor_->eplb_stats(s);
  auto ratio = [](double num, double den) { return den > 0 ? num / den : 0.0; };
  const auto rows = static_cast<double>(s.verify_rows);
  const auto steps = static_cast<double>(s.verify_steps);
  const auto accepted = static_cast<double>(s.accepted_draft_tokens);
  s.spec_mean_acceptance_length = rows > 0 ? 1.0 + accepted / rows : 0.0;
  s.spec_mean_verified_per_step = ratio(static_cast<double>(s.draft_tokens), steps);
  s.spec_mean_accepted_per_step = ratio(accepted, steps);
  double drafts = 0, estimates = 0, outcomes = 0;
  for (int b = 0; b < DraftCalibration::kBins; ++b) {
    drafts += static_cast<double>(s.calibration.drafts[static_cast<size_t>(b)]);
    estimates += s.calibration.estimate_sum[static_cast<size_t>(b)];
    outcomes += static_cast<double>(s.calibration.accepted[static_cast<size_t>(b)]);
  }
  s.spec_mean_estimate = ratio(estimates, drafts);
  s.spec_mean_acceptance = ratio(outcomes, drafts);
  s.spec_calibration_error = sched::calibration_error(s.calibration);
  if (tiers_) {
    const sched::KvTierCounters t = tiers_->counters();
    s.host_hit_tokens = t.host_hit_tokens;
    s.store_hit_tokens = t.store_hit_tokens;
    s.store_bytes_read = t.store_bytes_read;
    s.store_bytes_written = t.store_bytes_written;
    s.kv_blocks_written_through = t.blocks_exported;
    s.kv_tier_fetch_failures = t.fetch_failures;
    s.kv_host_pinned_bytes = t.host_pinned_bytes;
    s.kv_fetches = t.fetches;
    s.kv_fetch_seconds_total = t.fetch_seconds_total;
    s.kv_fetch_seconds_max = t.fetch_seconds_max;
  }
  return s;
}

void EngineImpl::check_invariants() const {
  scheduler_.check_invariants();
  DEEPINFER_CHECK(inflight_.size() <= 2, "more than two steps in flight");
}

}  // namespace deepinfer::engine
